package metastatic

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// A term of the manager that follows another process's (the lease moved)
// begins once the intake has recorded the requests published before it:
// a backing request the other process published for node a, not yet
// recorded, is counted, and node b, which starts waiting meanwhile, joins
// it instead of a second backing request being published for both (a
// fourth backing node for twelve nodes of four slots showed up so in
// consumers' TestMetastaticTwoLaunchersNeverShareASlot under load).
func TestNewTermWaitsForTheIntake(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, testConfig)
	ctx := t.Context()
	intake, err := e.js.CreateConsumer(ctx, events.RequestsStream, jetstream.ConsumerConfig{
		Durable: events.IntakeConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubjects: []string{events.NewRequestSubject, events.OwnedRequestSubjects},
	})
	if err != nil {
		t.Fatal(err)
	}
	me := Requestor("meta")
	e.node(e.carved("a", "small"))
	e.node(e.carved("b", "small"))
	// The other process's term published this one, and ended.
	theirs := events.RequestMessage{ID: newRequestID(), Labels: []string{"big"}, Requestor: me,
		RequestorData: encodeJSON(RequestData{Provider: "meta", Pool: "main", Label: "small", Slots: 4, Nodes: []string{"a"}})}
	if _, err := events.PublishRequest(ctx, e.js, theirs); err != nil {
		t.Fatal(err)
	}

	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.p.Manage(mctx, time.Hour)
	}()
	t.Cleanup(func() { stop(); <-done })

	// The intake, slower than the manager's start: it records the
	// request, then acknowledges its message.
	batch, err := intake.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if _, err := e.b.Requests.Create(ctx, theirs.ID, &kv.Request{ID: theirs.ID, State: kv.RequestRequested, Labels: theirs.Labels,
			Requestor: me, RequestorData: theirs.RequestorData, Created: time.Now().UTC(), StateTime: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Until(t, 10*time.Second, "node b joined the recorded backing request", func() bool {
		r, err := e.b.Requests.Get(ctx, theirs.ID)
		if err != nil {
			return false
		}
		d, err := decodeRequest(r.Value.RequestorData)
		return err == nil && slices.Contains(d.Nodes, "b")
	}, waitfor.Every(20*time.Millisecond))
	if n := e.published(); n != 1 {
		t.Fatalf("%d backing requests published; want the other term's only", n)
	}
}
