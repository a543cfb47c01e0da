package consumers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
)

// The case: a user deletes the consumer of the nodes' work (once
// node-lifecycle: `nats consumer rm -f NODEPOOL_WORK deletes`). It is made
// again at once, with a log line, and the next request is served and its
// node deleted, where it used to stay for ever.
func TestWorkConsumerDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	for _, name := range []string{events.DeleteConsumer, events.LaunchConsumer("cloud1")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, onePool)
			log, logs := logtest.New(t)
			h.log = log
			h.startLauncher("l1")
			h.serveOne(t, "before")

			if err := h.js.DeleteConsumer(t.Context(), events.WorkStream, name); err != nil {
				t.Fatal(err)
			}
			logs.Wait(t, 10*time.Second, "WARN", "the consumer was missing; made it again", "consumer="+name)
			h.serveOne(t, "after")
			h.until(15*time.Second, "every node given back deleted", func() bool { return h.nodes.Len() == 0 })
		})
	}
}

// The intake consumer deleted is made again starting after the last
// message it acknowledged: a request served and deleted long ago (its
// delete marker purged) is not recorded again, and the next one is
// served.
func TestIntakeConsumerDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	log, logs := logtest.New(t)
	h.log = log
	h.startLauncher("l1")
	h.serveOne(t, "served-long-ago")
	// Its delete marker goes, as cleanup purges those older than half
	// an hour.
	if err := h.b.Requests.Bucket().PurgeDeletes(t.Context(), jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	info, err := h.js.Consumer(t.Context(), events.RequestsStream, consumers.IntakeConsumer)
	if err != nil {
		t.Fatal(err)
	}
	served := info.CachedInfo().Delivered.Stream
	// Long ago: the launcher has read the consumer's ack floor since.
	logs.Wait(t, 10*time.Second, "ack floor read", "consumer=intake", fmt.Sprintf("ack_floor=%d", served))

	if err := h.js.DeleteConsumer(t.Context(), events.RequestsStream, consumers.IntakeConsumer); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, 10*time.Second, "WARN", "the consumer was missing; made it again", "consumer=intake")
	h.serveOne(t, "after")
	info, err = h.js.Consumer(t.Context(), events.RequestsStream, consumers.IntakeConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := info.CachedInfo().Config; cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq <= served {
		t.Errorf("the intake consumer made again starts with %v at %d: the message of a request served before (sequence %d) is delivered again",
			cfg.DeliverPolicy, cfg.OptStartSeq, served)
	}
	if _, ok := h.requests.Get("served-long-ago"); ok {
		t.Error("a request served and deleted before was recorded again")
	}
}

// serveOne asks for one node with a request id of its own, takes it and
// gives it back.
func (h *harness) serveOne(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	nodes, err := h.client.Request(ctx, events.RequestMessage{ID: id, Labels: []string{"small"}, Requestor: "test"}, "test")
	if err != nil {
		t.Fatalf("request %s: %v", id, err)
	}
	for _, n := range nodes {
		if err := h.client.Return(t.Context(), n.ID); err != nil {
			t.Fatal(err)
		}
	}
}
