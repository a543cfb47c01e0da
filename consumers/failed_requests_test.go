package consumers_test

import (
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A failed request is deleted once it failed FailedRequestAge ago, from
// its state_time; younger failed requests and fulfilled ones stay.
func TestFailedRequestsAgeOut(t *testing.T) {
	t.Parallel()
	h, clk := newFakeClockHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	onFakeClock := h.options
	h.options = func(o *consumers.Options) {
		onFakeClock(o)
		o.FailedRequestAge = time.Hour
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
	later := clk.Now().Add(30 * time.Minute).UTC()
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

	h.sweeps(clk, 2)
	exist(bad, done, "later")

	// An hour and a minute later, the first failed request is gone.
	clk.Advance(time.Hour + time.Minute)
	h.untilSwept(clk, 10*time.Second, "the request that failed over an hour ago deleted", func() bool { _, ok := h.request(bad); return !ok })
	h.sweeps(clk, 2)
	exist(done, "later")

	// And the other once it is an hour old too.
	clk.Advance(30 * time.Minute)
	h.untilSwept(clk, 10*time.Second, "the request that failed later deleted", func() bool { _, ok := h.request("later"); return !ok })
	exist(done)
}
