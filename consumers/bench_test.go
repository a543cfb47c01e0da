package consumers_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// Benchmarks of the hot paths, for benchstat: each runs against a real
// in-process nats-server, so they measure the KV round trips that
// dominate, not only CPU.

// BenchmarkServeFromReadyPool: one request at a time, served by allocating
// a ready node (ns/op is the latency from publish to fulfilled).
func BenchmarkServeFromReadyPool(b *testing.B) {
	h := newHarness(b, `
labels: [{name: small, min-ready: 20}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	h.until(30*time.Second, "ready pool", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady && n.AllocatedTo == "" }) >= 20
	})
	ctx := b.Context()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id, err := h.client.Submit(ctx, events.RequestMessage{ID: fmt.Sprintf("r%d", i), Labels: []string{"small"}})
		if err != nil {
			b.Fatal(err)
		}
		r, err := h.client.Wait(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// Give it back and let the pool refill before the next one.
		if err := h.client.DeleteRequest(ctx, id); err != nil {
			b.Fatal(err)
		}
		for _, n := range r.Value.Nodes {
			_ = h.client.DeleteNode(ctx, n)
		}
		h.until(30*time.Second, "ready pool", func() bool {
			return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady && n.AllocatedTo == "" }) >= 20
		})
		b.StartTimer()
	}
}

// BenchmarkClaimAndLaunch: b.N requests at once, each claimed by the pool's
// scheduler and served by a new node (boot delay 0); ns/op is makespan
// divided by requests.
func BenchmarkClaimAndLaunch(b *testing.B) {
	h := newHarness(b, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	ctx := b.Context()
	b.ResetTimer()
	var ids []string
	for i := range b.N {
		id, err := h.client.Submit(ctx, events.RequestMessage{ID: fmt.Sprintf("r%d", i), Labels: []string{"small"}})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	h.until(10*time.Minute, "all fulfilled", func() bool {
		for _, id := range ids {
			if r, ok := h.request(id); !ok || r.State != kv.RequestFulfilled {
				return false
			}
		}
		return true
	})
}

// BenchmarkFakeStateMachines: create and delete machines of the fake
// driver advanced to completion (boot and delete delay 0), 16 at a time.
func BenchmarkFakeStateMachines(b *testing.B) {
	cfg, err := config.Parse("b.yaml", []byte(`
labels: [{name: small}]
providers: [{name: c, driver: fake, pools: [{name: p, labels: [small]}]}]
`))
	if err != nil {
		b.Fatal(err)
	}
	srv := natstest.Start(b)
	_, js := srv.Connect(b)
	p, err := fake.New(b.Context(), js, &cfg.Providers[0], fake.Options{Replicas: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	run := func(ctx context.Context, sm drivers.StateMachine) error {
		for {
			step, err := sm.Advance(ctx)
			if err != nil || step.Done {
				return err
			}
		}
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range b.N {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req := drivers.CreateRequest{NodeID: fmt.Sprintf("n%d", i), Provider: "c", Pool: "p", Label: "small", Attempt: 1}
			sm, _ := p.Create(req, nil)
			if err := run(b.Context(), sm); err != nil {
				b.Error(err)
				return
			}
			dm, _ := p.Delete(sm.ExternalID(), nil)
			if err := run(b.Context(), dm); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

// BenchmarkRevisionCheckedUpdate: Cache.Modify of a node record, the unit
// of every state change.
func BenchmarkRevisionCheckedUpdate(b *testing.B) {
	srv := natstest.Start(b)
	_, js := srv.Connect(b)
	bs, err := kv.Ensure(b.Context(), js, kv.Options{Replicas: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	c := kv.NewCache(bs.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	runCache(b, c)
	if _, err := c.Create(b.Context(), "n1", &kv.Node{ID: "n1", State: kv.NodeReady, Labels: []string{"small"}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Modify(b.Context(), "n1", func(n *kv.Node) error { n.Attempt++; return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
