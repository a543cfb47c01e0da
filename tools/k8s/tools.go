//go:build tools

// Package k8s pins the Kubernetes control plane the tests run against:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
// of k8s.io/kubernetes v1.37.2, built from the Go module proxy by
// .ci/k8s-tools. It is a module of its own so that the main module never
// requires k8s.io/kubernetes; this file only makes `go mod tidy` record
// in go.sum every module the binaries need.
package k8s

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/component-base/cli"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
