package service_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/service"
)

// A file with a provider whose driver this build reads but cannot run
// (kubernetes) is refused at start, before NATS is touched, naming the
// provider; NewProvider says the same.
func TestStartRefusesUnavailableDriver(t *testing.T) {
	t.Parallel()
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
	settings := config.Settings{NatsURL: "nats://127.0.0.1:1", ID: "l1", Roles: []string{config.RoleLauncher}, DataDir: t.TempDir()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err == nil {
		p.Close()
		t.Fatal("started with a kubernetes provider")
	}
	for _, want := range []string{"provider k8s: driver kubernetes: configuration valid; the driver is not available in this build yet", "remove such providers from this file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := service.NewProvider(t.Context(), nil, &cfg.Providers[1], 1, log); err == nil || !strings.Contains(err.Error(), "the driver is not available in this build yet") {
		t.Errorf("NewProvider: %v", err)
	}
}
