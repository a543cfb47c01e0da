package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
)

func (a *app) kubernetesCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "kubernetes",
		Short: "Run a Kubernetes control plane with fake nodes (the tests' cluster)",
		Long: `Run the Kubernetes cluster the tests use: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, which plays the kubelet
of fake nodes (pods are scheduled and become Running with an address, but
run no container), on free ports of 127.0.0.1. The binaries are built from
the Go module proxy by ` + k8stest.BuildCommand + ` (from the repository's root).

It prints the export of a kubeconfig whose context, k8stest, is an admin
of the cluster (the kubernetes driver's 'context: k8stest'):

  nodepool-devcloud kubernetes
  export KUBECONFIG=/tmp/nodepool-k8s123/try0/admin.kubeconfig
  kubectl get nodes

kubectl of the cluster's release is beside the other binaries (its path is
printed on standard error). Its files and the processes' logs stay in --dir.
It runs until SIGINT or SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				d, err := os.MkdirTemp("", "nodepool-k8s")
				if err != nil {
					return err
				}
				dir = d
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			start := time.Now()
			s, err := k8stest.Start(ctx, dir)
			cancel()
			if err != nil {
				return err
			}
			defer s.Stop()
			fmt.Fprintf(a.out, "export KUBECONFIG=%s\n", shellQuote(s.Kubeconfig))
			fmt.Fprintf(a.err, "Kubernetes %s up in %s: API server %s, node kwok-node-0 (kwok plays its kubelet); kubectl is %s; files and logs in %s; stop with Ctrl-C\n",
				k8stest.Version, time.Since(start).Round(time.Millisecond), s.Server, filepath.Join(k8stest.Tools(), "kubectl"), s.Dir())
			<-cmd.Context().Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for the cluster's files and logs (default: a new one under $TMPDIR)")
	return cmd
}
