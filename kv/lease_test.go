package kv_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// waitTimer waits until a timer of clk is set for due.
func waitTimer(t *testing.T, clk *clock.Fake, due time.Time, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilDue(ctx, due); err != nil {
		t.Fatalf("no timer set for %s (%s): %v", due.Format("15:04:05.000"), what, err)
	}
}

// connectVia opens the buckets through a connection to url (a proxy).
func connectVia(t *testing.T, url string) *kv.Buckets {
	t.Helper()
	b, _ := connectViaConn(t, url)
	return b
}

// connectViaConn is connectVia, with the connection.
func connectViaConn(t *testing.T, url string) (*kv.Buckets, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kv.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	return b, nc
}

// leaseServer starts a server with the buckets at a lease TTL, a proxy to
// it, and a subscription to the writes of lease "test".
func leaseServer(t *testing.T, ttl time.Duration) (*kv.Buckets, *natstest.Proxy, <-chan kv.LeaseRecord) {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: ttl}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	writes := make(chan kv.LeaseRecord, 100)
	natstest.Puts(t, nc, kv.BucketLocks, "test", func(_ string, r kv.LeaseRecord) { writes <- r })
	return b, natstest.StartProxy(t, srv), writes
}

func nextWrite(t *testing.T, writes <-chan kv.LeaseRecord, what string, ok func(kv.LeaseRecord) bool) kv.LeaseRecord {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case r := <-writes:
			if ok(r) {
				return r
			}
		case <-deadline:
			t.Fatalf("never saw %s", what)
		}
	}
}

// A holder acts on its lease until two thirds of the TTL after the send
// of its last renewal that succeeded, not after its answer came; and it
// steps down then on a timer of its own, while a renewal is stuck on its
// way. Time is a clock the test moves; the bucket's TTL (a minute) never
// runs out meanwhile.
func TestLeaseStepsDownTwoThirdsOfTheTTLAfterTheSend(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute // renewals every 15 s, acting for 40 s after a send
	_, proxy, writes := leaseServer(t, ttl)
	b := connectVia(t, proxy.URL())
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t0 := clk.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l := kv.NewLease(b.Locks, "test", "a", ttl, quietLog(), kv.WithClock(clk))
	if held, err := l.TryAcquire(t.Context()); !held || err != nil {
		t.Fatalf("TryAcquire: %v, %v", held, err)
	}
	nextWrite(t, writes, "the acquisition", func(kv.LeaseRecord) bool { return true })
	if got := l.Until(); !got.Equal(at(40 * time.Second)) {
		t.Fatalf("after the acquisition, Until = %s, want +40s", got.Sub(t0))
	}

	type stepDown struct {
		at  time.Time
		err error
	}
	lost := make(chan stepDown, 1)
	ctx, stop := context.WithCancel(t.Context())
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		l.Keep(ctx, func(err error) { lost <- stepDown{clk.Now(), err} })
	}()
	t.Cleanup(func() {
		stop()
		<-kept
	})
	waitTimer(t, clk, at(15*time.Second), "the first renewal")
	waitTimer(t, clk, at(40*time.Second), "the step-down after the acquisition")

	// A renewal answered at once.
	clk.Set(at(15 * time.Second))
	nextWrite(t, writes, "the renewal sent at +15s", func(r kv.LeaseRecord) bool { return r.Renewed.Equal(at(15 * time.Second)) })
	waitTimer(t, clk, at(55*time.Second), "the step-down after the renewal sent at +15s")

	// A renewal whose answer comes late: sent at +30s, stored by the
	// server, answered when the clock says +45s. The lease lives a TTL
	// from when the server stored it (+30s or later), so the holder may act
	// until +70s, not +85s.
	proxy.Delay(time.Second)
	clk.Set(at(30 * time.Second))
	nextWrite(t, writes, "the renewal sent at +30s", func(r kv.LeaseRecord) bool { return r.Renewed.Equal(at(30 * time.Second)) })
	clk.Set(at(45 * time.Second))
	waitTimer(t, clk, at(70*time.Second), "the step-down after the renewal sent at +30s")

	// Then NATS stops answering: the renewal of +60s is stuck on its
	// way, and the holder steps down at +70s all the same.
	proxy.Stall()
	clk.Set(at(60 * time.Second))
	waitTimer(t, clk, at(75*time.Second), "the renewal after the one of +60s")
	clk.Set(at(70*time.Second - time.Millisecond))
	select {
	case s := <-lost:
		t.Fatalf("stepped down at +%s, before +70s: %v", s.at.Sub(t0), s.err)
	default:
	}
	clk.Set(at(70 * time.Second))
	select {
	case s := <-lost:
		if !s.at.Equal(at(70*time.Second)) || !strings.Contains(s.err.Error(), "no renewal sent in the last 40s succeeded") {
			t.Errorf("stepped down at +%s: %v; want +70s, for want of a renewal", s.at.Sub(t0), s.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not step down at +70s while a renewal was stuck on its way")
	}
	select {
	case <-kept:
	case <-time.After(10 * time.Second):
		t.Fatal("Keep did not return after stepping down")
	}
}

// A renewal whose answer is lost with the connection (the client does not
// fail a request when it reconnects: it waits for its deadline) does not
// hold the next one back: a period later the next is sent beside it, and
// its answer extends the lease. Time is a clock the test moves.
func TestLeaseRenewalAnswerLostWithTheConnection(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute // renewals every 15 s, acting for 40 s after a send
	_, proxy, writes := leaseServer(t, ttl)
	b, nc := connectViaConn(t, proxy.URL())
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t0 := clk.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	log, logs := logtest.New(t)
	defer func() {
		if t.Failed() {
			t.Logf("lease log:\n%s", logs)
		}
	}()
	l := kv.NewLease(b.Locks, "test", "a", ttl, log, kv.WithClock(clk))
	if held, err := l.TryAcquire(t.Context()); !held || err != nil {
		t.Fatalf("TryAcquire: %v, %v", held, err)
	}
	nextWrite(t, writes, "the acquisition", func(kv.LeaseRecord) bool { return true })
	lost := make(chan error, 1)
	ctx, stop := context.WithCancel(t.Context())
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		l.Keep(ctx, func(err error) { lost <- err })
	}()
	t.Cleanup(func() {
		stop()
		<-kept
	})
	waitTimer(t, clk, at(15*time.Second), "the first renewal")

	// The renewal of +15s goes into a stalled connection, which is then
	// cut: neither it nor its answer arrives, and it waits for its answer
	// until the step-down (+40s).
	proxy.Stall()
	clk.Set(at(15 * time.Second))
	waitTimer(t, clk, at(30*time.Second), "the renewal after the one of +15s")
	reconnects := nc.Stats().Reconnects
	proxy.Cut()
	proxy.Restore()
	// A connection lost for a moment; the next renewal is due 15 s
	// later, by when the client is back.
	waitfor.Until(t, 20*time.Second, "the client connected again", func() bool {
		return nc.Stats().Reconnects > reconnects && nc.IsConnected()
	})

	// The renewal of +30s is sent beside it, lands, and its answer moves
	// the step-down to +70s.
	clk.Set(at(30 * time.Second))
	nextWrite(t, writes, "the renewal sent at +30s", func(r kv.LeaseRecord) bool { return r.Renewed.Equal(at(30 * time.Second)) })
	waitTimer(t, clk, at(70*time.Second), "the step-down after the renewal sent at +30s")
	clk.Set(at(40 * time.Second))
	select {
	case err := <-lost:
		t.Fatalf("stepped down at +40s although the renewal of +30s succeeded: %v", err)
	default:
	}
}

// actors follows who acts on a lease, and says so when two do at once.
type actors struct {
	mu       sync.Mutex
	acting   map[string]bool
	stopped  map[string]time.Time
	overlaps []string
}

func (a *actors) start(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for other, on := range a.acting {
		if on {
			a.overlaps = append(a.overlaps, id+" acts while "+other+" still does")
		}
	}
	a.acting[id] = true
}

func (a *actors) stop(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acting[id] = false
	a.stopped[id] = time.Now()
}

// No two holders act at once, even when the holder is cut off from NATS
// at the worst moment: just after its acquisition or one of its renewals
// succeeded with an answer that came late. Holder a reaches NATS through
// a proxy that delays what the server sends, then stalls it for good;
// holder b takes the lease once it expired, and a must have stopped
// acting (its fn's context cancelled) before b took it.
func TestLeaseHoldersNeverOverlap(t *testing.T) {
	t.Parallel()
	const ttl = 4 * time.Second // renewals every second, acting for 2.67 s after a send
	for _, tc := range []struct {
		name  string
		delay time.Duration // of every answer to a
		// renewed: cut a off once a renewal of its landed (its answer on
		// its way); otherwise once it acts (its acquisition answered).
		renewed bool
	}{
		{name: "the acquisition answered late", delay: ttl / 2},
		{name: "a renewal answered late", delay: ttl / 6, renewed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			direct, proxy, writes := leaseServer(t, ttl)
			viaProxy := connectVia(t, proxy.URL())
			proxy.Delay(tc.delay)
			acts := &actors{acting: map[string]bool{}, stopped: map[string]time.Time{}}
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()

			aActs := make(chan struct{}, 10)
			la := kv.NewLease(viaProxy.Locks, "test", "a", ttl, quietLog())
			wg.Go(func() {
				la.Elect(ctx, func(lctx context.Context) {
					acts.start("a")
					aActs <- struct{}{}
					<-lctx.Done()
					acts.stop("a")
				})
			})
			select {
			case <-aActs:
			case <-time.After(30 * time.Second):
				t.Fatal("a never took the lease")
			}
			if tc.renewed {
				nextWrite(t, writes, "a renewal of a", func(r kv.LeaseRecord) bool { return r.Holder == "a" && r.Renewed.After(r.Acquired) })
			}
			proxy.Stall()

			bActs := make(chan kv.LeaseRecord, 10)
			lb := kv.NewLease(direct.Locks, "test", "b", ttl, quietLog())
			wg.Go(func() {
				lb.Elect(ctx, func(lctx context.Context) {
					acts.start("b")
					e, err := direct.Locks.Get(lctx, "test")
					if err != nil {
						t.Errorf("b reading its lease: %v", err)
					}
					bActs <- e.Value
					<-lctx.Done()
					acts.stop("b")
				})
			})
			var rec kv.LeaseRecord
			select {
			case rec = <-bActs:
			case <-time.After(30 * time.Second):
				t.Fatal("b never took the lease")
			}
			acts.mu.Lock()
			defer acts.mu.Unlock()
			for _, o := range acts.overlaps {
				t.Error(o)
			}
			switch aStopped := acts.stopped["a"]; {
			case rec.Holder != "b":
				t.Errorf("b acts on a lease held by %q", rec.Holder)
			case aStopped.IsZero() || !aStopped.Before(rec.Acquired):
				t.Errorf("a stopped acting at %s, not before b took the lease at %s",
					aStopped.Format("15:04:05.000"), rec.Acquired.Local().Format("15:04:05.000"))
			default:
				t.Logf("a stopped acting %s before b took the lease", rec.Acquired.Sub(aStopped).Round(time.Millisecond))
			}
			proxy.Restore()
		})
	}
}
