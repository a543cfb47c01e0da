package durable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

const within = 10 * time.Second

// received collects the payloads a consumer handled, acknowledging each
// (the server has the acknowledgement once it is recorded).
type received struct {
	mu   sync.Mutex
	got  []string
	more chan struct{}
}

func newReceived() *received { return &received{more: make(chan struct{}, 1)} }

func (r *received) handle(msg jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	_ = msg.DoubleAck(ctx)
	r.mu.Lock()
	r.got = append(r.got, string(msg.Data()))
	r.mu.Unlock()
	select {
	case r.more <- struct{}{}:
	default:
	}
}

func (r *received) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// wait waits until payload was handled.
func (r *received) wait(t *testing.T, payload string) {
	t.Helper()
	waitfor.Until(t, within, fmt.Sprintf("%q handled", payload), func() bool { return slices.Contains(r.all(), payload) },
		waitfor.Wake(r.more), waitfor.Detail(func() string { return fmt.Sprintf("handled: %q", r.all()) }))
}

func setup(t *testing.T) (jetstream.JetStream, jetstream.StreamConfig) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	cfg := jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}
	if _, err := js.CreateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	return js, cfg
}

// makeAgain makes a deleted stream again, as the process's repair
// keeper does: trying again while the server refuses it, for a moment
// after the deletion, with "error creating store for stream" (it was
// still removing the old one's store; seen under load).
func makeAgain(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	waitfor.UntilErr(t, within, "the stream made again", func(ctx context.Context) (bool, error) {
		_, err := js.CreateStream(ctx, cfg)
		return err == nil, err
	}, waitfor.Every(50*time.Millisecond))
}

func publish(t *testing.T, js jetstream.JetStream, payload string) {
	t.Helper()
	if _, err := js.Publish(t.Context(), "work.x", []byte(payload)); err != nil {
		t.Fatal(err)
	}
}

// consumerConfig is the test's consumer. A message delivered to a process
// that stopped (a pull outlives its client until it expires) comes back
// after a second.
func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: time.Second}
}

func openConsuming(t *testing.T, js jetstream.JetStream, resume bool, r *received, opts ...jetstream.PullConsumeOpt) (*durable.Consumer, *logtest.Recorder) {
	t.Helper()
	log, rec := logtest.New(t)
	c, err := durable.Open(t.Context(), js, durable.Options{Stream: "WORK", Config: consumerConfig(), Resume: resume, FloorEvery: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Consume(r.handle, append([]jetstream.PullConsumeOpt{jetstream.PullExpiry(time.Second)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c, rec
}

// openPulling opens the test's consumer for Next and Fetch (no Consume).
func openPulling(t *testing.T, js jetstream.JetStream) (*durable.Consumer, *logtest.Recorder) {
	t.Helper()
	log, logs := logtest.New(t)
	c, err := durable.Open(t.Context(), js, durable.Options{Stream: "WORK", Config: consumerConfig(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c, logs
}

// A consumer deleted under a running Consume is made again at once, with a
// log line, and the messages published afterwards are handled.
func TestDeletedConsumerIsMadeAgain(t *testing.T) {
	js, _ := setup(t)
	r := newReceived()
	_, logs := openConsuming(t, js, false, r)
	publish(t, js, "before")
	r.wait(t, "before")

	start := time.Now()
	if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, within, "WARN", "the consumer was missing; made it again", "consumer=workers", "stream=WORK")
	publish(t, js, "after")
	r.wait(t, "after")
	t.Logf("made again and consumed within %s", time.Since(start))
}

// With Resume, a consumer made again starts after the last message the
// old one acknowledged: what was handled is not delivered again. Without
// it, the configured DeliverAll starts from the beginning.
func TestResumeStartsAfterTheAckFloor(t *testing.T) {
	for _, resume := range []bool{true, false} {
		t.Run(fmt.Sprintf("resume=%v", resume), func(t *testing.T) {
			js, _ := setup(t)
			// A first process handles three messages and stops; the
			// process that opens the consumer next knows its ack floor.
			first := newReceived()
			c, _ := openConsuming(t, js, resume, first)
			for i := range 3 {
				publish(t, js, fmt.Sprint("old-", i))
			}
			first.wait(t, "old-2")
			c.Stop()

			r := newReceived()
			_, logs := openConsuming(t, js, resume, r)
			if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
				t.Fatal(err)
			}
			logs.Wait(t, within, "the consumer was missing; made it again")
			publish(t, js, "new")
			want := []string{"new"}
			if !resume {
				// From the start. A pull the consumer's previous life had
				// asked for may take a message of the new one and never
				// read it (loaded run 5 at eea46e5 handled old-1, old-2
				// and new, not yet old-0): it comes again after the ack
				// wait, so each is waited for.
				want = []string{"old-0", "old-1", "old-2", "new"}
			}
			for _, p := range want {
				r.wait(t, p)
			}
			got := slices.Compact(slices.Sorted(slices.Values(r.all())))
			if slices.Sort(want); !slices.Equal(got, want) {
				t.Errorf("handled %q after the consumer was made again, want %q (resume %v)", got, want, resume)
			}
			cons, err := js.Consumer(t.Context(), "WORK", "workers")
			if err != nil {
				t.Fatal(err)
			}
			if cfg := cons.CachedInfo().Config; resume && (cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq != 4) {
				t.Errorf("consumer made again: deliver policy %v from %d, want by start sequence from 4", cfg.DeliverPolicy, cfg.OptStartSeq)
			}
		})
	}
}

// A consumer made again from a start sequence is opened as it is by a
// process starting later (its start cannot be updated).
func TestOpenKeepsWhereAConsumerMadeAgainStarts(t *testing.T) {
	js, _ := setup(t)
	cfg := consumerConfig()
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, 7
	if _, err := js.CreateConsumer(t.Context(), "WORK", cfg); err != nil {
		t.Fatal(err)
	}
	log, _ := logtest.New(t)
	c, err := durable.Open(t.Context(), js, durable.Options{Stream: "WORK", Config: consumerConfig(), Resume: true, Log: log})
	if err != nil {
		t.Fatalf("opening a consumer made again from a start sequence: %v", err)
	}
	c.Stop()
}

// A stream deleted (its consumer with it) and made again: the consumer is
// made again on the new stream, read from its start even with Resume
// (the old ack floor means nothing there).
func TestConsumerOfAStreamMadeAgain(t *testing.T) {
	js, cfg := setup(t)
	r := newReceived()
	_, logs := openConsuming(t, js, true, r)
	for i := range 5 {
		publish(t, js, fmt.Sprint("old-", i))
	}
	r.wait(t, "old-4")
	if err := js.DeleteStream(t.Context(), "WORK"); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, within, "the consumer is missing and cannot be made again yet")
	makeAgain(t, js, cfg)
	publish(t, js, "new-1") // sequence 1 of the new stream
	logs.Wait(t, within, "the consumer was missing; made it again")
	r.wait(t, "new-1")
}

// Next finds the consumer gone, says so (ErrUnavailable), and the next
// calls get the messages from the consumer made again.
func TestNextAfterTheConsumerWasDeleted(t *testing.T) {
	js, _ := setup(t)
	c, logs := openPulling(t, js)
	if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Next(t.Context(), time.Second)
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("Next on a deleted consumer: %v, want ErrUnavailable", err)
	}
	logs.Wait(t, within, "the consumer was missing; made it again")
	publish(t, js, "after")
	waitfor.UntilErr(t, within, "a message from the consumer made again", func(context.Context) (bool, error) {
		msg, err := c.Next(t.Context(), time.Second)
		if err != nil {
			return false, err
		}
		if string(msg.Data()) != "after" {
			t.Fatalf("got %q", msg.Data())
		}
		_ = msg.Ack()
		return true, nil
	})
}

// Fetch hands over what came within its wait, no more than it asked
// for, and says nothing of a wait that ended with fewer; on a deleted
// consumer it says ErrUnavailable, and the consumer made again serves the
// next Fetch.
func TestFetch(t *testing.T) {
	js, _ := setup(t)
	c, logs := openPulling(t, js)
	for _, p := range []string{"a", "b", "c"} {
		publish(t, js, p)
	}
	var got []string
	take := func(m jetstream.Msg) {
		got = append(got, string(m.Data()))
		if err := m.DoubleAck(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.Fetch(t.Context(), 2, within, take); err != nil || n != 2 || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Fetch(2) of 3 waiting: %d %q, %v; want a and b", n, got, err)
	}
	got = nil
	if n, err := c.Fetch(t.Context(), 5, 2*time.Second, take); err != nil || n != 1 || !slices.Equal(got, []string{"c"}) {
		t.Fatalf("Fetch(5) of 1 waiting: %d %q, %v; want c and no error", n, got, err)
	}
	if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fetch(t.Context(), 1, time.Second, take); !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("Fetch on a deleted consumer: %v, want ErrUnavailable", err)
	}
	logs.Wait(t, within, "the consumer was missing; made it again")
	publish(t, js, "after")
	// The consumer made again reads this stream (limits retention) from
	// its start.
	got = nil
	waitfor.UntilErr(t, within, "the message published after from the consumer made again", func(context.Context) (bool, error) {
		_, err := c.Fetch(t.Context(), 4, time.Second, take)
		return slices.Contains(got, "after"), err
	})
}

// Two processes consuming one durable consumer repair it at once: one
// makes it, the other finds it made, and both go on consuming it. The one
// that found it made is the one checked: with the one that made it
// stopped, it gets the next message (at once, or after the ack wait if
// the stopped one's last pull took it).
func TestTwoProcessesRepairAtOnce(t *testing.T) {
	js, _ := setup(t)
	r1, r2 := newReceived(), newReceived()
	c1, logs1 := openConsuming(t, js, true, r1)
	c2, logs2 := openConsuming(t, js, true, r2)
	if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
		t.Fatal(err)
	}
	// Each logs that it made the consumer again, or that another process
	// did ("the consumer was missing; ..." or "was made again by ...").
	logs1.Wait(t, within, "the consumer was m")
	logs2.Wait(t, within, "the consumer was m")
	made := func(logs *logtest.Recorder) bool {
		return len(logs.Lines("the consumer was missing; made it again")) > 0
	}
	if !made(logs1) && !made(logs2) {
		t.Fatalf("neither process says it made the consumer again:\n%s\n%s", logs1, logs2)
	}
	other := r2
	if made(logs2) && !made(logs1) {
		c2.Stop()
		other = r1
	} else {
		c1.Stop()
	}
	publish(t, js, "after")
	other.wait(t, "after")
}

// A consumer deleted again soon after it was made again is made again
// after a pause, which grows, so as not to fight an operator in a loop.
func TestDeletedAgainAndAgainBacksOff(t *testing.T) {
	js, _ := setup(t)
	r := newReceived()
	_, logs := openConsuming(t, js, false, r)
	for i := range 2 {
		if err := js.DeleteConsumer(t.Context(), "WORK", "workers"); err != nil {
			t.Fatal(err)
		}
		logs.WaitCount(t, within, i+1, "the consumer was missing; made it again")
	}
	if len(logs.Lines("the consumer is missing again; making it again after a pause", "pause=1s")) != 1 {
		t.Errorf("the second repair did not pause for a second:\n%s", logs)
	}
	publish(t, js, "after")
	r.wait(t, "after")
}

// A consumer that a restarted server loaded from its store is opened as
// the same consumer: the watch's looks (the first one at most FloorEvery
// later, seen by the ack floor it reads) do not take it for one made
// again by another process. The answer of the create-or-update after a
// restart gives the time the server loaded the consumer as its creation,
// every info the original time: the watch compared the two and said, after
// every restart, that every consumer was made again.
func TestConsumerOfARestartedServerIsTheSame(t *testing.T) {
	dir := t.TempDir()
	srv := natstest.StartAt(t, dir, -1)
	nc, js := srv.Connect(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	first := newReceived()
	c, _ := openConsuming(t, js, true, first)
	publish(t, js, "before")
	first.wait(t, "before")
	c.Stop()
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	srv = natstest.StartAt(t, dir, -1)
	_, js = srv.Connect(t)
	r := newReceived()
	_, logs := openConsuming(t, js, true, r)
	publish(t, js, "after")
	r.wait(t, "after")
	// The ack floor moved from 1 to 2: the watch's next look logs it.
	logs.Wait(t, within, "ack floor read", "ack_floor=2")
	if got := logs.Lines("made again"); len(got) > 0 {
		t.Errorf("the consumer the server loaded from its store was taken for one made again: %q", got)
	}
}

// A consumer whose stream is deleted tells Options.Missing (the
// process's keeper then makes the stream again), and consumes from the
// stream made again.
func TestConsumerReportsItsStreamMissing(t *testing.T) {
	js, cfg := setup(t)
	log, _ := logtest.New(t)
	missing := make(chan string, 100)
	c, err := durable.Open(t.Context(), js, durable.Options{Stream: "WORK", Config: consumerConfig(), Log: log,
		Missing: func(stream string) {
			select {
			case missing <- stream:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	r := newReceived()
	if err := c.Consume(r.handle, jetstream.PullExpiry(time.Second)); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "before")
	r.wait(t, "before")

	if err := js.DeleteStream(t.Context(), "WORK"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-missing:
		if got != "WORK" {
			t.Fatalf("reported %q missing, want WORK", got)
		}
	case <-time.After(within):
		t.Fatalf("the deleted stream was not reported missing within %s", within)
	}
	makeAgain(t, js, cfg)
	publish(t, js, "after")
	r.wait(t, "after")
}
