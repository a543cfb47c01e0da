package consumers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// TestDeliveriesPerNodeLifetime counts what the work stream's consumers
// deliver over whole node lifetimes (launched for a request, taken, given
// back, deleted): a node's own writes are no work, so a life is two
// deliveries, its launch and its delete (issue 19 asks for at most 3, one
// spare for a crash). Before the work stream, every write of a node
// record was a delivery: seven.
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
	// Every node's launch and delete are asked for; a delete may be done
	// before its message is even published (the create machine's last
	// look claims a node given back at once), so wait for the messages,
	// not only for the nodes to go.
	var w workCounts
	h.until(30*time.Second, "every node deleted and a launch and a delete message each acknowledged", func() bool {
		w = h.workCounts()
		return h.nodes.Len() == 0 && w.waiting == 0 && w.published >= 2*nodes && w.delivered >= w.published
	})
	stream, err := h.js.Stream(t.Context(), "KV_"+kv.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	deliveries := float64(w.delivered) / nodes
	writes := float64(si.State.LastSeq) / nodes
	t.Logf("per node lifetime: %.1f deliveries (%d work messages, %d redelivered), %.1f record writes (deletes included)", deliveries, w.published, w.redelivered, writes)
	if deliveries > 3 {
		t.Errorf("%.1f deliveries per node lifetime, want at most 3", deliveries)
	}
	if w.published > 3*nodes {
		t.Errorf("%d work messages for %d node lifetimes; want a launch and a delete each, and few more", w.published, nodes)
	}
}
