package consumers_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A pool with max-servers 0 or less is disabled (operation.rst: how a
// provider is removed from the launcher): it declines every request. A
// label with min-ready -1 is disabled: no node of it is created.
func TestDisabledPoolsAndLabels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: a
  - name: retired
    min-ready: -1
providers:
  - name: cloud
    driver: fake
    pools:
      - name: off
        max-servers: -1
        labels: [a]
      - name: on
        labels: [a, retired]
`)
	h.startLauncher("l1")
	ok := h.submit(events.RequestMessage{Labels: []string{"a"}})
	retired := h.submit(events.RequestMessage{Labels: []string{"retired"}})
	h.waitDone(10*time.Second, ok, retired)
	r, _ := h.request(ok)
	if r.State != kv.RequestFulfilled || r.Pool != "on" {
		t.Errorf("request for a: %s by %s (%s), want fulfilled by the enabled pool", r.State, r.Pool, r.Reason)
	}
	h.until(10*time.Second, "the disabled pool declines", func() bool {
		r, _ := h.request(retired)
		return slices.Contains(r.DeclinedBy, "cloud/off") && slices.Contains(r.DeclinedBy, "cloud/on")
	})
	r, _ = h.request(retired)
	if r.State != kv.RequestFailed || !strings.Contains(r.Reason, "disabled") {
		t.Errorf("request for a disabled label: %s (%s)", r.State, r.Reason)
	}
	if n := h.countNodes(func(n *kv.Node) bool { return n.HasLabel("retired") }); n != 0 {
		t.Errorf("%d nodes of a disabled label", n)
	}
}
