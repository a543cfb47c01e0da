package kubernetes

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
	"github.com/nodepool-nats/nodepool/kv"
)

// Kubeconfig writes a kubeconfig for a node from its record's kubernetes,
// as Zuul's executor writes one for a job (cluster, token, namespace).
func Kubeconfig(t testing.TB, acc *kv.KubernetesAccess) string {
	t.Helper()
	cluster := fmt.Sprintf("    server: %s\n    certificate-authority-data: %s\n", acc.Host, acc.CACert)
	if acc.SkipTLS {
		cluster = fmt.Sprintf("    server: %s\n    insecure-skip-tls-verify: true\n", acc.Host)
	}
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
%susers:
- name: %s
  user:
    token: %s
contexts:
- name: node
  context:
    cluster: node
    user: %s
    namespace: %s
current-context: node
`, cluster, acc.User, acc.Token, acc.User, acc.Namespace)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Kubectl runs kubectl of the stack with a kubeconfig of a node's; it
// returns the standard output, and on failure an error with the standard
// error.
func Kubectl(t testing.TB, s *k8stest.Stack, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.KubectlPath, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "KUBERC=off", "KUBECONFIG=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// NodeClient is a client-go client with a node's credentials.
func NodeClient(t testing.TB, acc *kv.KubernetesAccess) k8s.Interface {
	t.Helper()
	ca, err := base64.StdEncoding.DecodeString(acc.CACert)
	if err != nil {
		t.Fatalf("ca_crt is not base64: %v", err)
	}
	cl, err := k8s.NewForConfig(&rest.Config{Host: acc.Host, BearerToken: acc.Token, TLSClientConfig: rest.TLSClientConfig{CAData: ca, Insecure: acc.SkipTLS}})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
