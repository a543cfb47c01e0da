// Command k8s-stack runs the tests' Kubernetes stack (internal/k8stest:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
// with fake nodes, built by .ci/k8s-tools) until it is interrupted, so
// that the kubernetes driver can be tried by hand: it prints the admin's
// kubeconfig, whose context is k8stest.
//
//	go run ./internal/k8stest/k8s-stack [-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
)

func main() {
	dir := flag.String("dir", "", "directory of the stack's files and logs (default: a new one under $TMPDIR)")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "k8s-stack:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "k8s-stack")
		if err != nil {
			return err
		}
		dir = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	start := time.Now()
	s, err := k8stest.Start(ctx, dir)
	cancel()
	if err != nil {
		return err
	}
	defer s.Stop()
	fmt.Printf("Kubernetes %s is up in %s: API server %s, nodes kwok-node-0 (kwok plays their kubelet)\n",
		k8stest.Version, time.Since(start).Round(time.Millisecond), s.Server)
	fmt.Printf("logs under %s\n\n", s.Dir())
	fmt.Printf("  export KUBECONFIG=%s   # context k8stest, an admin\n", s.Kubeconfig)
	fmt.Printf("  export PATH=%s:$PATH   # its kubectl\n\n", k8stest.Tools())
	fmt.Println("Ctrl-C stops it.")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	fmt.Println("stopping")
	return nil
}
