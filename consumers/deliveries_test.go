package consumers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// lifecycleInfo reads the node-lifecycle consumer's counts.
func (h *harness) lifecycleInfo() *jetstream.ConsumerInfo {
	h.t.Helper()
	c, err := h.js.Consumer(h.t.Context(), "KV_"+kv.BucketNodes, consumers.LifecycleConsumer)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := c.Info(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	return info
}

// TestDeliveriesPerNodeLifetime counts what the node-lifecycle consumer
// delivers over whole node lifetimes (launched for a request, taken,
// given back, deleted): every write of a node record is a delivery, and
// so is every redelivery. Issue 19 asks for at most 3 (the launch, the
// delete, one spare for a crash); today's design delivers every write,
// the node's own ones included, so this test holds today's figure as a
// ceiling, and the work queue of docs/work-queue.md lowers it.
func TestDeliveriesPerNodeLifetime(t *testing.T) {
	t.Parallel()
	const nodes = 10
	h := newHarness(t, `
labels:
  - name: small
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools:
      - name: main
        max-servers: 20
        labels: [small]
`)
	h.recordLog()
	h.startLauncher("l1")
	var ids []string
	for i := range nodes {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}, Requestor: fmt.Sprintf("test-%d", i)}))
	}
	h.waitDone(30*time.Second, ids...)
	for _, id := range ids {
		r, _ := h.request(id)
		if r.State != kv.RequestFulfilled || len(r.Nodes) != 1 {
			t.Fatalf("request %s is %s (%s), want fulfilled with one node", id, r.State, r.Reason)
		}
		if _, err := h.client.Take(t.Context(), r.Nodes[0], id, "tester", nil); err != nil {
			t.Fatal(err)
		}
		if err := h.client.DeleteRequest(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if err := h.client.Return(t.Context(), r.Nodes[0]); err != nil {
			t.Fatal(err)
		}
	}
	var info *jetstream.ConsumerInfo
	h.until(30*time.Second, "every node deleted and every delivery acknowledged", func() bool {
		info = h.lifecycleInfo()
		return h.nodes.Len() == 0 && info.NumPending == 0 && info.NumAckPending == 0
	})
	stream, err := h.js.Stream(t.Context(), "KV_"+kv.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	deliveries := float64(info.Delivered.Consumer) / nodes
	writes := float64(si.State.LastSeq) / nodes
	t.Logf("per node lifetime: %.1f deliveries, %.1f record writes (deletes included)", deliveries, writes)
	// Today: one delivery per write. The ceiling is today's figure with
	// room for a retried write; issue 19 wants 3.
	const ceiling = 8
	if deliveries > ceiling {
		t.Errorf("%.1f deliveries per node lifetime, want at most %d (issue 19: 3)", deliveries, ceiling)
	}
}
