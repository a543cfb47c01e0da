package consumers_test

import (
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A request that reuses a ready node gets its new nodes in that node's
// availability zone: the scheduler writes the zone on their records, and
// the driver boots them there.
func TestNewNodesFollowTheZoneOfReusedOnes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small, min-ready: 1}]
providers:
  - name: c
    driver: fake
    boot-delay: 1
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	h.until(30*time.Second, "a ready unallocated node", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady && n.AZ != "" && n.AllocatedTo == "" }) == 1
	})
	// Every change is looked at, not only the records as they are when
	// the wait wakes: a 1 s boot may be over by then on a busy machine.
	sub := h.nodes.Subscribe()
	defer h.nodes.Unsubscribe(sub)
	id := h.submit(events.RequestMessage{Labels: []string{"small", "small", "small", "small"}, Requestor: "t"})
	h.until(30*time.Second, "a new node of the request in the reused node's zone", func() bool {
		for _, ch := range sub.Drain() {
			if n := ch.New; n != nil && n.Value.State == kv.NodeBuilding && n.Value.AllocatedTo == id && n.Value.AZ == "fake-az" {
				return true
			}
		}
		return false
	})
	h.waitDone(30*time.Second, id)
}
