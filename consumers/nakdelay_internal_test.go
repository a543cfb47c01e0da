package consumers

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
)

// A message given back with a short delay comes back after that delay on
// every delivery, not only the first: with a BackOff the server counted a
// later NAK's delay from an ack wait it does not use, and the message came
// back an ack wait later or more (see workAckWait).
func TestNAKDelayHoldsOnLaterDeliveries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		stream  string
		config  jetstream.ConsumerConfig
		publish func(context.Context, jetstream.JetStream) error
	}{
		{"work", events.WorkStream, workConsumer(events.DeleteConsumer, "deletes", events.WorkSubjects(events.KindDelete, "")),
			func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.PublishMsg(ctx, events.WorkMsg(events.KindDelete, "c", "n1", 1))
				return err
			}},
		{"intake", events.RequestsStream, intakeConsumer(),
			func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.Publish(ctx, events.NewRequestSubject, []byte(`{"labels":["small"]}`))
				return err
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t)
			_, js := srv.Connect(t)
			log, _ := logtest.New(t)
			ctx := t.Context()
			if err := events.Ensure(ctx, js, 1, log); err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, c.stream, c.config)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.publish(ctx, js); err != nil {
				t.Fatal(err)
			}
			// Each delivery is given back with 50 ms; the next must come
			// well before the ack wait (5 s, 10 s) would bring it.
			const nakDelay, within = 50 * time.Millisecond, 3 * time.Second
			for delivery := 1; delivery <= 4; delivery++ {
				batch, err := cons.Fetch(1, jetstream.FetchMaxWait(within))
				if err != nil {
					t.Fatal(err)
				}
				var got jetstream.Msg
				for m := range batch.Messages() {
					got = m
				}
				if got == nil {
					t.Fatalf("delivery %d did not come within %s of the last NAK (delay %s): %v", delivery, within, nakDelay, batch.Error())
				}
				if n := deliveries(got); n != uint64(delivery) {
					t.Fatalf("delivery %d counted %d", delivery, n)
				}
				if err := got.NakWithDelay(nakDelay); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
