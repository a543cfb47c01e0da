package consumers_test

import (
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A request whose lease ran out (its requestor stopped renewing
// lease_until) is deleted and its nodes go back to the pool; one whose
// lease is renewed, or that has none, stays as long as its requestor wants.
// The launcher goes by a fake clock, which the test moves past the lease.
func TestRequestLeaseRunsOut(t *testing.T) {
	t.Parallel()
	h, clk := newFakeClockHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	soon := clk.Now().Add(time.Hour)
	lapsed := h.submit(events.RequestMessage{ID: "lapsed", Labels: []string{"small"}, LeaseUntil: &soon})
	renewed := h.submit(events.RequestMessage{ID: "renewed", Labels: []string{"small"}, LeaseUntil: &soon})
	plain := h.submit(events.RequestMessage{ID: "plain", Labels: []string{"small"}})
	h.waitDone(20*time.Second, lapsed, renewed, plain)
	r, _ := h.request(lapsed)
	node := r.Nodes[0]
	if r.LeaseUntil == nil || !r.LeaseUntil.Equal(soon.UTC()) {
		t.Errorf("lease_until recorded as %v, want %v", r.LeaseUntil, soon.UTC())
	}
	// The renewing requestor renews its lease past the lapsed one's.
	if err := h.client.RenewRequest(t.Context(), renewed, soon.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour + time.Minute)
	h.untilSwept(clk, 30*time.Second, "the lapsed request deleted and its node free", func() bool {
		_, there := h.request(lapsed)
		n, ok := h.nodes.Get(node)
		return !there && ok && n.Value.AllocatedTo == "" && n.Value.State == kv.NodeReady
	})
	for _, id := range []string{renewed, plain} {
		if r, ok := h.request(id); !ok || r.State != kv.RequestFulfilled {
			t.Errorf("request %s: %v %s", id, ok, r.State)
		}
	}
}
