package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/service"
)

// nats.conf, loaded by the server's own parser and run as one member with
// the cluster block taken out, lets nodepool run and a requestor do the
// requestor protocol, and refuses the requestor everything else.
func TestProductionNatsConfig(t *testing.T) {
	for k, v := range map[string]string{
		"NATS_SERVER_NAME": "nats-test", "NODEPOOL_PASSWORD": "np-secret", "REQUESTOR_PASSWORD": "req-secret",
		"ADMIN_PASSWORD": "admin-secret", "SYS_PASSWORD": "sys-secret",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf does not parse: %v", err)
	}
	if opts.Cluster.Name != "nodepool" || len(opts.Routes) != 3 || !opts.JetStream {
		t.Errorf("cluster or JetStream settings lost: %+v", opts.Cluster)
	}
	// One member on its own: no cluster, random ports, a temporary store.
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server did not start")
	}
	defer ns.Shutdown()
	addr := ns.Addr().String()

	cfg, err := config.Parse("test.yaml", []byte("labels: [{name: small}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [small]}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	settings := config.Settings{NatsURL: fmt.Sprintf("nats://nodepool:np-secret@%s", addr), ID: "l1", Roles: []string{config.RoleLauncher},
		Replicas: 1, LeaseTTL: 2 * time.Second, SyncInterval: time.Second}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err != nil {
		t.Fatalf("nodepool cannot start as user nodepool: %v", err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	nc, err := nats.Connect(fmt.Sprintf("nats://requestor:req-secret@%s", addr))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(t.Context(), nc)
	if err != nil {
		t.Fatalf("the Go client cannot open the buckets as requestor: %v", err)
	}
	rctx, rcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer rcancel()
	nodes, err := c.Request(rctx, events.RequestMessage{Labels: []string{"small"}}, "zuul")
	if err != nil {
		t.Fatalf("requestor protocol as requestor: %v", err)
	}
	if err := c.Return(rctx, nodes[0].ID); err != nil {
		t.Fatalf("returning as requestor: %v", err)
	}
	// Everything else is refused (the server drops the message, so the
	// call gets no answer).
	js := c.JetStream()
	short, scancel := context.WithTimeout(t.Context(), time.Second)
	defer scancel()
	if _, err := js.Publish(short, "$KV.nodepool-components.fake", []byte("{}")); err == nil {
		t.Error("requestor could write a component record")
	}
	if err := js.DeleteStream(short, "NODEPOOL_REQUESTS"); err == nil {
		t.Error("requestor could delete a stream")
	}
}
