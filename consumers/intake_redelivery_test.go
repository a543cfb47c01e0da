package consumers_test

import (
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A request message delivered again as if for the first time (the intake
// consumer's state lost, as with a server of a cluster) after its request
// was served and deleted does not bring the request back, which would pin
// a node to it for ever; a new message that reuses the id after the
// deletion does make a new request.
func TestIntakeRedeliveryDoesNotResurrect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools: [{name: main, labels: [small]}]
`)
	l1 := h.startLauncher("l1")
	id := h.submit(events.RequestMessage{ID: "served", Labels: []string{"small"}})
	h.waitDone(30*time.Second, id)
	r, _ := h.request(id)
	if _, err := h.client.Take(t.Context(), r.Nodes[0], id, "me", nil); err != nil {
		t.Fatal(err)
	}
	if err := h.client.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Return(t.Context(), r.Nodes[0]); err != nil {
		t.Fatal(err)
	}
	l1.Stop()

	// The consumer's state is lost: every message comes again, counted as
	// a first delivery.
	if err := h.js.DeleteConsumer(t.Context(), events.RequestsStream, consumers.IntakeConsumer); err != nil {
		t.Fatal(err)
	}
	sentinel := h.submit(events.RequestMessage{ID: "sentinel", Labels: []string{"small"}})
	h.startLauncher("l2")
	h.waitDone(30*time.Second, sentinel)
	h.until(30*time.Second, "the intake consumer past every message", func() bool {
		cons, err := h.js.Consumer(t.Context(), events.RequestsStream, consumers.IntakeConsumer)
		if err != nil {
			return false
		}
		info, err := cons.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if _, err := h.b.Requests.Get(t.Context(), id); err == nil {
		t.Fatalf("request %s, served and deleted, was made again by its message's redelivery", id)
	}

	// The requestor reuses the id with a new message: a new request.
	h.publishRaw(`{"id": "served", "labels": ["small"]}`)
	h.waitDone(30*time.Second, id)
	if r, ok := h.request(id); !ok || r.State != kv.RequestFulfilled {
		t.Errorf("the id reused after its deletion: %+v", r)
	}
}
