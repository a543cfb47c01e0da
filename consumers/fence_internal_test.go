package consumers

import (
	"context"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// A launcher whose heartbeat was not renewed for two thirds of the lease
// TTL stops every machine it runs: at that moment on its clock, not a
// moment before, and a heartbeat sent meanwhile puts the moment off. The
// clock is a fake one the test moves; no heartbeat is sent but those the
// test records.
func TestFencedTwoThirdsOfTheTTLAfterTheLastHeartbeat(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, _ := logtest.New(t)
	const ttl = 30 * time.Second // fenced 20 s after the last heartbeat sent
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: ttl}, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte("labels: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t0 := clk.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l, err := NewLauncher(js, b, Options{ID: "me", Config: cfg, LeaseTTL: ttl, Log: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	machine, stop := context.WithCancel(t.Context())
	defer stop()
	l.lifecycle.runs["node"] = &run{cancel: stop}
	l.beaten(l.elapsed()) // a heartbeat sent at +0s

	ctx, cancel := context.WithCancel(t.Context())
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		l.watchFence(ctx)
	}()
	defer func() {
		cancel()
		<-watching
	}()
	waitTimer := func(due time.Time, what string) {
		t.Helper()
		wctx, done := context.WithTimeout(t.Context(), 10*time.Second)
		defer done()
		if err := clk.BlockUntilDue(wctx, due); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	running := func(when string) {
		t.Helper()
		if machine.Err() != nil || l.fenced() {
			t.Fatalf("the machine was stopped (fenced: %v) %s", l.fenced(), when)
		}
	}

	waitTimer(at(20*time.Second), "the fence's timer for +20s, after the heartbeat of +0s")
	clk.Set(at(15 * time.Second))
	l.beaten(l.elapsed()) // a heartbeat sent at +15s
	clk.Set(at(20 * time.Second))
	waitTimer(at(35*time.Second), "the fence's timer for +35s, after the heartbeat of +15s")
	running("at +20s, after a heartbeat sent at +15s")

	clk.Set(at(35 * time.Second))
	waitTimer(at(35*time.Second+time.Millisecond), "the fence's timer looking again just after +35s")
	running("at +35s, two thirds of the TTL after the last heartbeat")

	clk.Set(at(35*time.Second + time.Millisecond))
	select {
	case <-machine.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the machine still runs past two thirds of the TTL after the last heartbeat")
	}
	if !l.fenced() {
		t.Error("not fenced past two thirds of the TTL after the last heartbeat")
	}
}
