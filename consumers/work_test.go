package consumers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// workCounts are the launch messages the work stream took, what its
// consumers delivered, and what waits in it.
type workCounts struct {
	published, delivered, redelivered, waiting uint64
}

func (h *harness) workCounts() workCounts {
	h.t.Helper()
	st, err := h.js.Stream(h.t.Context(), events.WorkStream)
	if err != nil {
		h.t.Fatal(err)
	}
	si, err := st.Info(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	c := workCounts{published: si.State.LastSeq, waiting: si.State.Msgs}
	infos := st.ListConsumers(h.t.Context())
	for ci := range infos.Info() {
		c.delivered += ci.Delivered.Consumer
		c.redelivered += uint64(ci.NumRedelivered)
	}
	if err := infos.Err(); err != nil {
		h.t.Fatal(err)
	}
	return c
}

// TestQueuedLaunchesAreDeliveredOnce: launches beyond max-concurrency wait
// in the work stream instead of being delivered and refused again and
// again. Two launchers of one provider, two slots each, twenty launches:
// each launch is one message, delivered once (nothing NAKed for a slot).
func TestQueuedLaunchesAreDeliveredOnce(t *testing.T) {
	t.Parallel()
	const n = 20
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 0.1
    max-concurrency: 2
    pools: [{name: p, max-servers: 40, labels: [small]}]
`)
	h.recordLog()
	h.startLauncher("l1")
	h.startLauncher("l2")
	var ids []string
	for range n {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}}))
	}
	h.waitDone(60*time.Second, ids...)
	for _, id := range ids {
		if h.state(id) != kv.RequestFulfilled {
			t.Fatalf("request %s: %s", id, h.state(id))
		}
	}
	var w workCounts
	h.until(10*time.Second, "every launch message acknowledged", func() bool {
		w = h.workCounts()
		return w.waiting == 0 && w.delivered >= w.published
	})
	t.Logf("%d launches: %d work messages, %d deliveries, %d redelivered", n, w.published, w.delivered, w.redelivered)
	if w.published != n {
		t.Errorf("%d launch messages for %d launches; want one each", w.published, n)
	}
	if w.delivered != w.published || w.redelivered != 0 {
		t.Errorf("%d launch messages were delivered %d times (%d redelivered); want once each", w.published, w.delivered, w.redelivered)
	}
}

// TestBadLaunchMessages: what arrives on the work stream from outside the
// launchers (a malformed message, one for a node that does not exist,
// one replayed for a node launched long ago, a delete of a node in use)
// is dropped at once: it takes no slot for good, launches or deletes
// nothing, loops nowhere, and the provider's one slot still launches the
// next request.
func TestBadLaunchMessages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 0.05
    max-concurrency: 1
    pools: [{name: p, labels: [small]}]
`)
	rec := h.recordLog()
	h.startLauncher("l1")
	first := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(30*time.Second, first)
	r, _ := h.request(first)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request %s: %s (%s)", first, r.State, r.Reason)
	}
	ready, _ := h.nodes.Get(r.Nodes[0])
	bad := []struct {
		name    string
		subject string
		header  map[string]string
	}{
		{"no headers", "nodepool.work.c.launch.x1", nil},
		{"node of another subject", "nodepool.work.c.launch.x2", map[string]string{events.HeaderNode: "y", events.HeaderRevision: "1"}},
		{"no revision", "nodepool.work.c.launch.x3", map[string]string{events.HeaderNode: "x3"}},
		{"revision not a number", "nodepool.work.c.launch.x4", map[string]string{events.HeaderNode: "x4", events.HeaderRevision: "soon"}},
		{"node id not a key", events.WorkSubjectOf(events.KindLaunch, "c", "a/../b"), map[string]string{events.HeaderNode: "a/../b", events.HeaderRevision: "1"}},
		{"node that does not exist", "nodepool.work.c.launch.nosuchnode", map[string]string{events.HeaderNode: "nosuchnode", events.HeaderRevision: "1"}},
		{"node launched long ago", events.WorkSubjectOf(events.KindLaunch, "c", ready.Key), map[string]string{events.HeaderNode: ready.Key, events.HeaderRevision: fmt.Sprint(ready.Revision)}},
		{"delete of a node in use", events.WorkSubjectOf(events.KindDelete, "c", ready.Key), map[string]string{events.HeaderNode: ready.Key, events.HeaderRevision: fmt.Sprint(ready.Revision)}},
		{"provider not configured", events.WorkSubjectOf(events.KindLaunch, "elsewhere", ready.Key), map[string]string{events.HeaderNode: ready.Key, events.HeaderRevision: fmt.Sprint(ready.Revision)}},
	}
	for _, b := range bad {
		m := nats.NewMsg(b.subject)
		for k, v := range b.header {
			m.Header.Set(k, v)
		}
		m.Data = []byte(b.name)
		if _, err := h.js.PublishMsg(t.Context(), m); err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
	}
	second := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(30*time.Second, second)
	if s := h.state(second); s != kv.RequestFulfilled {
		t.Fatalf("request %s after the bad launch messages: %s", second, s)
	}
	// Everything but the provider nobody has is taken off the stream, each
	// delivered once.
	h.until(10*time.Second, "the bad launch messages dropped", func() bool {
		return h.workCounts().waiting == 1
	})
	if w := h.workCounts(); w.redelivered != 0 || w.delivered != w.published-1 {
		t.Errorf("%d launch messages delivered %d times (%d redelivered); want each once but the one of a provider nobody has", w.published, w.delivered, w.redelivered)
	}
	if got := len(rec.Lines("work message is not valid")); got != 5 {
		t.Errorf("%d launch messages refused as not valid; want 5", got)
	}
	if got := h.instancesEverCreated("c"); got != 2 {
		t.Errorf("%d instances ever created; want 2 (the replayed launch launched again?)", got)
	}
	if n, _ := h.node(ready.Key); n.State != kv.NodeReady || n.AllocatedTo != first {
		t.Errorf("node %s is %s for %q after its launch was replayed; want ready for %s", ready.Key, n.State, n.AllocatedTo, first)
	}
}

// TestLostLaunchMessagesAreAskedAgain: launches whose messages are lost
// (here an operator purges the work stream while they wait for the one
// slot) are asked for again by cleanup's revisit sweep, and launched.
func TestLostLaunchMessagesAreAskedAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 8
    max-concurrency: 1
    pools: [{name: p, labels: [small]}]
`)
	rec := h.recordLog()
	h.startLauncher("l1")
	var ids []string
	for range 3 {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}}))
	}
	// The first launch holds the one slot for its 8 s boot: long enough
	// for the purge to come while the other two wait, however busy the
	// machine (with a 2 s boot, a loaded run saw the first launch end,
	// and the second's message pulled, before the purge). All three
	// launches published, and one of them taken (acknowledged once its
	// machine started): two waiting. Two messages in the stream alone
	// were once the first launch's, not yet taken, and the second's, with
	// the third published only after the purge.
	h.until(30*time.Second, "one launch running and two waiting in the work stream", func() bool {
		c := h.workCounts()
		return c.published == 3 && c.waiting == 2
	})
	st, err := h.js.Stream(t.Context(), events.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.waitDone(120*time.Second, ids...)
	for _, id := range ids {
		if s := h.state(id); s != kv.RequestFulfilled {
			t.Fatalf("request %s: %s", id, s)
		}
	}
	if got := len(rec.Lines("node needs work nobody took up")); got != 2 {
		t.Errorf("cleanup wrote %d nodes again; want the 2 whose launch messages were purged", got)
	}
}

// TestStuckWorkIsTakenBack: a launch message that the server no longer
// delivers (here delivered once, to a pull that never answered, by a
// consumer made to deliver it only once) keeps the node's one message
// slot on the work stream: no new ask is taken, and the revisit sweep
// used to leave the node alone because its message was queued. With a
// launcher waiting for work on that consumer, cleanup removes the message
// and asks again, and the node is launched, once.
func TestStuckWorkIsTakenBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	rec := h.recordLog()
	ctx := t.Context()
	now := time.Now().UTC()
	n := kv.Node{ID: "stuck-node", State: kv.NodeBuilding, Provider: "c", Pool: "p", Labels: []string{"small"}, Created: now, StateTime: now}
	rev, err := h.b.Nodes.Create(ctx, n.ID, &n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.PublishMsg(ctx, events.WorkMsg(events.KindLaunch, "c", n.ID, rev)); err != nil {
		t.Fatal(err)
	}
	cons, err := h.js.CreateConsumer(ctx, events.WorkStream, jetstream.ConsumerConfig{
		Durable: events.LaunchConsumer("c"), FilterSubject: events.WorkSubjects(events.KindLaunch, "c"),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range batch.Messages() {
		got++ // taken, and never answered
	}
	if got != 1 {
		t.Fatalf("pulled %d launch messages; want 1", got)
	}
	h.until(10*time.Second, "the consumer done with the message (delivered as often as it may be)", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0
	})
	h.startLauncher("l1")
	h.until(30*time.Second, "the stuck node launched", func() bool {
		got, ok := h.node(n.ID)
		return ok && got.State == kv.NodeReady
	})
	if got := len(rec.Lines("work waited in the work stream", n.ID)); got != 1 {
		t.Errorf("the stuck launch was taken back %d times; want 1", got)
	}
	if got := h.instancesEverCreated("c"); got != 1 {
		t.Errorf("%d instances created; want 1", got)
	}
}
