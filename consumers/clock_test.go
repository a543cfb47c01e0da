package consumers_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nuid"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// fakeClockTTL is the lease TTL of a harness whose launchers go by a fake
// clock. Heartbeats and leases are renewed on that clock, which stands
// still unless the test moves it, while the server expires them in real
// time: a day is long enough that the server never expires them during a
// test, and that the clock may be moved hours at a time without a lease
// or the fencing running out (renewals every 6 h, fencing after 16 h).
const fakeClockTTL = 24 * time.Hour

// sweepEvery is the sync interval of the launchers of a fake-clock
// harness: their cleanup sweeps whenever the fake clock passes another.
const sweepEvery = 200 * time.Millisecond

// newFakeClockHarness is a harness whose launchers go by a fake clock,
// which starts at the real time and moves only when the test moves it;
// its buckets' lease TTL is fakeClockTTL. A test that sets h.options
// keeps the clock by calling the options it replaces.
func newFakeClockHarness(t *testing.T, yaml string) (*harness, *clock.Fake) {
	t.Helper()
	cfg := parseConfig(t, yaml)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: fakeClockTTL}, testLog(t)); err != nil {
		t.Fatal(err)
	}
	h := newHarnessOn(t, srv, cfg)
	clk := clock.NewFake(time.Now().UTC())
	h.options = func(o *consumers.Options) {
		o.Clock, o.LeaseTTL, o.SyncInterval = clk, fakeClockTTL, sweepEvery
	}
	return h, clk
}

// untilSwept waits, as until does, for what the cleanup's sweeps do. On a
// fake clock it moves the clock a sync interval at a time, so that the
// sweeps' ticker fires, until cond holds: a sweep may run before the
// launcher's caches have the records the test is waiting about.
func (h *harness) untilSwept(clk clock.Clock, timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	fake, ok := clk.(*clock.Fake)
	if !ok {
		h.until(timeout, what, cond)
		return
	}
	deadline := time.Now().Add(timeout)
	for {
		fake.Advance(sweepEvery)
		if h.wait(100*time.Millisecond, cond) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %s waiting for %s (the fake clock at %s)\n%s", timeout, what, fake.Now().Format(time.RFC3339Nano), h.dump())
		}
	}
}

// sweeps waits until the cleanup swept n more times. Each time, it writes
// a probe, a failed request whose lease ran out at clk's time, and waits
// until a sweep deleted it: the sweep that deleted a probe began after the
// one that deleted the probe before had ended, and saw every request
// record written before its probe.
func (h *harness) sweeps(clk clock.Clock, n int) {
	h.t.Helper()
	for range n {
		id := "sweep-probe-" + nuid.Next()
		now := clk.Now().UTC()
		probe := &kv.Request{ID: id, State: kv.RequestFailed, Labels: []string{}, Nodes: []string{}, DeclinedBy: []string{},
			Requestor: "sweep-probe", RequestorData: json.RawMessage("{}"), Reason: "a probe of the cleanup's sweeps",
			Created: now, StateTime: now, LeaseUntil: &now}
		if _, err := h.b.Requests.Create(h.t.Context(), id, probe); err != nil {
			h.t.Fatal(err)
		}
		h.untilSwept(clk, 20*time.Second, "a sweep deleting "+id, func() bool {
			_, err := h.b.Requests.Get(h.t.Context(), id)
			return errors.Is(err, kv.ErrNotFound)
		})
	}
}
