package service_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/service"
)

// A kubernetes provider is made from the kubeconfig ($KUBECONFIG) at
// start; one whose context the kubeconfig lacks is refused, naming the
// provider and the context, and NewProvider says the same. (The driver itself is tested against a real API server in
// drivers/kubernetes.)
func TestKubernetesProviderContext(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: other, context: {cluster: c, user: u}}]
current-context: other
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kc)
	cfg, err := config.Parse("test.yaml", []byte(`
labels: [{name: small}, {name: pod}]
providers:
  - name: p
    driver: fake
    pools: [{name: main, labels: [small]}]
  - name: k8s
    driver: kubernetes
    context: admin
    pools: [{name: main, labels: [{name: pod, type: pod, image: fedora}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := service.NewProvider(t.Context(), nil, &cfg.Providers[1], service.DriverOptions{Replicas: 1, Log: log}); err == nil || !strings.Contains(err.Error(), `provider k8s: context "admin"`) {
		t.Errorf("NewProvider: %v", err)
	}
	srv := natstest.Start(t)
	settings := config.Settings{NatsURL: srv.ClientURL(), ID: "l1", Roles: []string{config.RoleLauncher}, DataDir: t.TempDir()}
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err == nil {
		p.Close()
		t.Fatal("started with a kubernetes provider whose context the kubeconfig lacks")
	}
	if !strings.Contains(err.Error(), `provider k8s: context "admin"`) {
		t.Errorf("start: %v", err)
	}
	// The context the kubeconfig has: the driver is made (nothing is
	// called before a launch).
	cfg.Providers[1].Context = "other"
	drv, err := service.NewProvider(t.Context(), nil, &cfg.Providers[1], service.DriverOptions{Replicas: 1, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	drv.Close()
}
