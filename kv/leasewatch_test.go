package kv_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// lockWatches counts the watches (consumers that are not durable) of the
// locks bucket's stream.
func lockWatches(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	s, err := js.Stream(t.Context(), "KV_"+kv.BucketLocks)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	l := s.ListConsumers(t.Context())
	for ci := range l.Info() {
		if ci.Config.Durable == "" {
			n++
		}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLeaseWatchOneForAllLeases: the leases of a process that share its
// lease watch make one consumer on the server, however many they are;
// each is woken by its own key's release only, and a lease waiting to be
// elected takes its key as soon as the holder lets it go (its own poll
// never fires: its clock stands still). The last one to stop listening
// ends the watch.
func TestLeaseWatchOneForAllLeases(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log := quietLog()
	// A TTL of a minute: no key expires during the test.
	const ttl = time.Minute
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: ttl}, log)
	if err != nil {
		t.Fatal(err)
	}
	v := kv.NewViews(b, log)
	w := v.Leases()
	if v.Leases() != w {
		t.Fatal("two leases of a process got two lease watches")
	}

	// Holders x1..x3 hold three keys; y1..y3 wait to be elected on them,
	// sharing the watch, on a clock that stands still.
	clk := clock.NewFake(time.Now())
	keys := []string{"pool.a.main", "pool.b.main", "cleanup"}
	held := make([]*kv.Lease, len(keys))
	elected := make([]chan struct{}, len(keys))
	ctx, cancel := context.WithCancel(t.Context())
	var done []chan struct{}
	for i, key := range keys {
		held[i] = kv.NewLease(b.Locks, key, "x", ttl, log)
		if ok, err := held[i].TryAcquire(t.Context()); err != nil || !ok {
			t.Fatalf("taking %s: %v %v", key, ok, err)
		}
		elected[i] = make(chan struct{})
		y := kv.NewLease(b.Locks, key, "y", ttl, log, kv.WithClock(clk), kv.WithWatch(w))
		d := make(chan struct{})
		done = append(done, d)
		go func() {
			defer close(d)
			y.Elect(ctx, func(ctx context.Context) {
				close(elected[i])
				<-ctx.Done()
			})
		}()
	}
	// Each waits on its poll: a timer of the fake clock a third of the
	// TTL away.
	ready, rcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer rcancel()
	if err := clk.BlockUntil(ready, len(keys)); err != nil {
		t.Fatalf("the waiting leases never waited: %v", err)
	}
	waitfor.Until(t, 10*time.Second, "one watch of the locks bucket for three leases", func() bool {
		return lockWatches(t, js) == 1
	}, waitfor.Every(20*time.Millisecond))

	for i := range keys {
		if err := held[i].Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-elected[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s released, but its waiting lease was not woken", keys[i])
		}
		for j := i + 1; j < len(keys); j++ {
			select {
			case <-elected[j]:
				t.Fatalf("%s elected while its key was still held", keys[j])
			default:
			}
		}
	}

	cancel()
	for _, d := range done {
		<-d
	}
	waitfor.Until(t, 10*time.Second, "no watch of the locks bucket once no lease listens", func() bool {
		return lockWatches(t, js) == 0
	}, waitfor.Every(20*time.Millisecond))
}
