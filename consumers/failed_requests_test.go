package consumers_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// sweepClock is the clock a launcher measures request ages by: the real
// time plus an offset the test sets. Cleanup reads it once per sweep,
// before it looks at the requests, so its reads count the sweeps.
type sweepClock struct {
	offset atomic.Int64
	reads  atomic.Int64
	read   chan struct{}
}

func newSweepClock() *sweepClock { return &sweepClock{read: make(chan struct{}, 1)} }

func (c *sweepClock) now() time.Time {
	t := time.Now().Add(time.Duration(c.offset.Load()))
	c.reads.Add(1)
	select {
	case c.read <- struct{}{}:
	default:
	}
	return t
}

// waitSweeps waits until the clock was read n more times: after two, a
// whole sweep ran since the call.
func (c *sweepClock) waitSweeps(t *testing.T, n int64) {
	t.Helper()
	want := c.reads.Load() + n
	waitfor.Until(t, 20*time.Second, fmt.Sprintf("cleanup to sweep %d times", n), func() bool { return c.reads.Load() >= want }, waitfor.Wake(c.read))
}

// A failed request is deleted once it failed FailedRequestAge ago, from
// its state_time; younger failed requests and fulfilled ones stay.
func TestFailedRequestsAgeOut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	clk := newSweepClock()
	h.options = func(o *consumers.Options) {
		o.FailedRequestAge = time.Hour
		o.Now = clk.now
	}
	h.startLauncher("l1")
	bad := h.submit(events.RequestMessage{ID: "bad", Labels: []string{"no-such-label"}})
	done := h.submit(events.RequestMessage{ID: "done", Labels: []string{"small"}})
	h.waitDone(30*time.Second, bad, done)
	if r, _ := h.request(bad); r.State != kv.RequestFailed {
		t.Fatalf("request %s is %s, want failed", bad, r.State)
	}
	if r, _ := h.request(done); r.State != kv.RequestFulfilled {
		t.Fatalf("request %s is %s, want fulfilled", done, r.State)
	}
	// One that failed half an hour after the others.
	later := time.Now().Add(30 * time.Minute).UTC()
	if _, err := h.b.Requests.Create(t.Context(), "later", &kv.Request{ID: "later", State: kv.RequestFailed, Labels: []string{"small"},
		Reason: "failed later", Created: later, StateTime: later}); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "request later recorded", func() bool { _, ok := h.request("later"); return ok })
	exist := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := h.b.Requests.Get(t.Context(), id); err != nil {
				t.Errorf("request %s: %v", id, err)
			}
		}
	}

	clk.waitSweeps(t, 2)
	exist(bad, done, "later")

	// An hour and a minute later, the first failed request is gone.
	clk.offset.Store(int64(time.Hour + time.Minute))
	h.until(10*time.Second, "the request that failed over an hour ago deleted", func() bool { _, ok := h.request(bad); return !ok })
	clk.waitSweeps(t, 2)
	exist(done, "later")

	// And the other once it is an hour old too.
	clk.offset.Store(int64(time.Hour + 31*time.Minute))
	h.until(10*time.Second, "the request that failed later deleted", func() bool { _, ok := h.request("later"); return !ok })
	exist(done)
}
