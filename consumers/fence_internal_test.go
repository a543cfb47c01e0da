package consumers

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
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

// A fenced launcher pulls no work: a delete waits in the stream, asked
// for by nobody, until a heartbeat renews the process, and is then
// pulled and done at once. The clock is a fake one; the launcher is
// fenced from the start (no heartbeat yet).
func TestFencedLauncherPullsNoWork(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, rec := logtest.New(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1}, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte("labels: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := NewLauncher(js, b, Options{ID: "me", Config: cfg, Log: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if !l.fenced() {
		t.Fatal("a launcher that has sent no heartbeat is not fenced")
	}
	cons, err := l.lifecycle.openDeletes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The delete of a node that is gone: whoever pulls it acknowledges it.
	if _, err := js.PublishMsg(t.Context(), events.WorkMsg(events.KindDelete, "c", "gone1", 7)); err != nil {
		t.Fatal(err)
	}
	p, err := l.lifecycle.startDeletes(t.Context(), cons)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	rec.Wait(t, 10*time.Second, "fenced: pulling no work", "work=deletes")
	info := func() *jetstream.ConsumerInfo {
		t.Helper()
		c, err := js.Consumer(t.Context(), events.WorkStream, events.DeleteConsumer)
		if err != nil {
			t.Fatal(err)
		}
		i, err := c.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	// The server counts a consumer's pending messages when the stream
	// signals it, on a goroutine of its own: on a loaded machine the
	// count came after the log line (once, "0 pending"). Nothing may be
	// delivered or pulled meanwhile.
	waitfor.Until(t, 10*time.Second, "the delete counted pending, and not pulled", func() bool {
		i := info()
		if i.Delivered.Consumer != 0 || i.NumWaiting != 0 {
			t.Fatalf("fenced, the launcher pulled: %d delivered, %d pulls waiting, %d pending", i.Delivered.Consumer, i.NumWaiting, i.NumPending)
		}
		return i.NumPending == 1
	})

	l.beaten(l.elapsed()) // a heartbeat: no longer fenced
	waitfor.Until(t, 10*time.Second, "the delete pulled and acknowledged once renewed", func() bool {
		i := info()
		return i.AckFloor.Consumer == 1 && i.NumPending == 0 && i.NumAckPending == 0
	})
	if i := info(); i.Delivered.Consumer != 1 {
		t.Errorf("the delete was delivered %d times, want once", i.Delivered.Consumer)
	}
}
