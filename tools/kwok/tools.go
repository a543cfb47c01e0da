//go:build tools

// Package kwok pins kwok, the fake kubelet the tests' Kubernetes stack runs
// so that pods reach Running without containers, built from the Go module
// proxy by .ci/k8s-tools. It is a module of its own because kwok pins
// k8s.io/* v0.36, which would clash with the control plane's v0.37.2
// (tools/k8s); this file only makes `go mod tidy` record in go.sum every
// module the binary needs.
package kwok

import (
	_ "sigs.k8s.io/kwok/pkg/kwok/cmd"
)
