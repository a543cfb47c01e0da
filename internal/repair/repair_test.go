package repair_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/repair"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

const within = 10 * time.Second

func bucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: "things", History: 1, Storage: jetstream.FileStorage}
}

// keepBucket has a keeper look after the bucket "things".
func keepBucket(k *repair.Keeper, js jetstream.JetStream) {
	k.Keep("KV_things", "bucket things", nil, func(ctx context.Context, _ uint64) error {
		_, err := js.CreateKeyValue(ctx, bucketConfig())
		return err
	})
}

// keepStreams has a keeper look after the event streams, each followed.
func keepStreams(k *repair.Keeper, js jetstream.JetStream, log *slog.Logger) {
	for _, cfg := range events.StreamConfigs(1) {
		k.Keep(cfg.Name, "stream "+cfg.Name, cfg.Subjects, func(ctx context.Context, last uint64) error {
			return events.Remake(ctx, js, cfg, last, log)
		})
	}
}

func run(t *testing.T, k *repair.Keeper) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// A bucket deleted is made again within seconds, with its settings and a
// log line.
func TestDeletedBucketIsMadeAgain(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), bucketConfig()); err != nil {
		t.Fatal(err)
	}
	log, logs := logtest.New(t)
	k := repair.New(js, 100*time.Millisecond, log)
	keepBucket(k, js)
	run(t, k)
	logs.Wait(t, within, "DEBUG bucket things is there")

	start := time.Now()
	if err := js.DeleteKeyValue(t.Context(), "things"); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, within, "WARN bucket things was missing; made it again", "stream=KV_things")
	t.Logf("made again in %s", time.Since(start))
	b, err := js.KeyValue(t.Context(), "things")
	if err != nil {
		t.Fatalf("the bucket was not made again: %v", err)
	}
	if _, err := b.Put(t.Context(), "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
}

// A stream whose sequence is tracked is made again past the sequences the
// old one gave, so that no message of the new one is taken for an old
// one; a process starting later opens it without complaint.
func TestStreamMadeAgainContinuesItsSequence(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, logs := logtest.New(t)
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := js.Publish(t.Context(), events.NewRequestSubject, []byte(`{"labels": ["x"]}`)); err != nil {
			t.Fatal(err)
		}
	}
	k := repair.New(js, 100*time.Millisecond, log)
	keepStreams(k, js, log)
	run(t, k)
	logs.Wait(t, within, "DEBUG stream NODEPOOL_REQUESTS is there", "last_sequence=5")
	if err := js.DeleteStream(t.Context(), events.RequestsStream); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, within, "WARN stream NODEPOOL_REQUESTS was missing; made it again", "last_sequence=5")
	ack, err := js.Publish(t.Context(), events.NewRequestSubject, []byte(`{"labels": ["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(5 + events.RemadeSequenceGap); ack.Sequence != want {
		t.Errorf("the first message of the stream made again has sequence %d, want %d", ack.Sequence, want)
	}
	before := len(logs.Lines("WARN"))
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	if warns := logs.Lines("WARN"); len(warns) != before {
		t.Errorf("a process starting later warns: %q", warns[before:])
	}
}

// A bucket deleted again soon after it was made again waits a while
// before it is made again, longer each time.
func TestDeletedAgainPauses(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), bucketConfig()); err != nil {
		t.Fatal(err)
	}
	log, logs := logtest.New(t)
	k := repair.New(js, 100*time.Millisecond, log)
	keepBucket(k, js)
	run(t, k)
	logs.Wait(t, within, "DEBUG bucket things is there")
	for i := range 2 {
		if err := js.DeleteKeyValue(t.Context(), "things"); err != nil {
			t.Fatal(err)
		}
		logs.WaitCount(t, within, i+1, "bucket things was missing; made it again")
	}
	if len(logs.Lines("WARN bucket things is missing again; making it again after a pause", "pause=1s")) != 1 {
		t.Errorf("the second time did not pause for a second:\n%s", logs)
	}
}

// Two processes that find a bucket missing at once both go on with the
// one bucket made again.
func TestTwoKeepersAtOnce(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), bucketConfig()); err != nil {
		t.Fatal(err)
	}
	var recs []*logtest.Recorder
	for range 2 {
		log, logs := logtest.New(t)
		k := repair.New(js, 100*time.Millisecond, log)
		keepBucket(k, js)
		run(t, k)
		logs.Wait(t, within, "DEBUG bucket things is there")
		recs = append(recs, logs)
	}
	if err := js.DeleteKeyValue(t.Context(), "things"); err != nil {
		t.Fatal(err)
	}
	for _, logs := range recs {
		logs.Wait(t, within, "bucket things was missing;") // "made it again" or "another process made it again"
	}
	log, logs := logtest.New(t)
	if _, err := kv.EnsureBucket(t.Context(), js, bucketConfig(), log); err != nil {
		t.Fatal(err)
	}
	if n := len(logs.Lines("exists with other settings")); n > 0 {
		t.Error("the bucket made again has other settings")
	}
}

// A keeper reads a followed stream's last sequence because it was
// published to, not at each look: while it looks ten times a second, three
// publications cost at most three reads of the stream (a read within a
// second of the last), and a stream deleted then is made again past the
// sequence followed.
func TestKeeperReadsWhatIsPublishedTo(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	log, logs := logtest.New(t)
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	k := repair.New(js, 100*time.Millisecond, log)
	keepStreams(k, js, log)
	run(t, k)
	logs.Wait(t, within, "DEBUG stream NODEPOOL_REQUESTS is there", "last_sequence=0")

	// Every API request from now on (ours: publishing is not one).
	api := requests(t, nc, "$JS.API.>")
	for range 3 {
		if _, err := js.Publish(t.Context(), events.NewRequestSubject, []byte(`{"labels": ["x"]}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The keeper reads the stream it saw published to.
	waitfor.Until(t, within, "the keeper knows the stream's last sequence", func() bool {
		return k.LastSequence(events.RequestsStream) == 3
	}, waitfor.Every(20*time.Millisecond))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for len(api) > 0 {
		seen = append(seen, (<-api).Subject)
	}
	if err := js.DeleteStream(t.Context(), events.RequestsStream); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, within, "WARN stream NODEPOOL_REQUESTS was missing; made it again", "last_sequence=3")
	if reads := countOf(seen, "$JS.API.STREAM.INFO."+events.RequestsStream); reads < 1 || reads > 3 {
		t.Errorf("the stream published to three times was read %d times, want 1 to 3; requests seen before the deletion: %q", reads, seen)
	}
	ack, err := js.Publish(t.Context(), events.NewRequestSubject, []byte(`{"labels": ["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(3 + events.RemadeSequenceGap); ack.Sequence != want {
		t.Errorf("the first message of the stream made again has sequence %d, want %d", ack.Sequence, want)
	}
}

// What the servers announced while a keeper was cut off from them (a
// bucket deleted, messages published to a tracked stream) is found when
// its connection comes back, though its periodic look is an hour away.
func TestKeeperLooksWhenTheConnectionComesBack(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, logs := logtest.New(t)
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(t.Context(), bucketConfig()); err != nil {
		t.Fatal(err)
	}
	proxy := natstest.StartProxy(t, srv)
	knc, err := nats.Connect(proxy.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(knc.Close)
	kjs, err := jetstream.New(knc)
	if err != nil {
		t.Fatal(err)
	}
	k := repair.New(kjs, time.Hour, log)
	keepBucket(k, kjs)
	cfg := events.StreamConfigs(1)[0]
	k.Keep(cfg.Name, "stream "+cfg.Name, cfg.Subjects, func(ctx context.Context, last uint64) error {
		return events.Remake(ctx, kjs, cfg, last, log)
	})
	run(t, k)
	logs.Wait(t, within, "DEBUG bucket things is there")
	logs.Wait(t, within, "DEBUG stream NODEPOOL_REQUESTS is there")

	proxy.Cut()
	waitfor.Until(t, within, "the keeper's connection is down", func() bool { return !knc.IsConnected() }, waitfor.Every(10*time.Millisecond))
	for range 2 {
		if _, err := js.Publish(t.Context(), events.NewRequestSubject, []byte(`{"labels": ["x"]}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := js.DeleteKeyValue(t.Context(), "things"); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	logs.Wait(t, within, "WARN bucket things was missing; made it again")
	waitfor.Until(t, within, "the keeper knows the stream's last sequence", func() bool {
		return k.LastSequence(events.RequestsStream) == 2
	}, waitfor.Every(20*time.Millisecond))
}

// requests are the API requests on subject from now on, for the test's
// length.
func requests(t *testing.T, nc *nats.Conn, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 1000)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

func countOf(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// A keeper told that a stream it keeps may be missing looks at once,
// though its periodic look is an hour away.
func TestKeeperLooksWhenTold(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), bucketConfig()); err != nil {
		t.Fatal(err)
	}
	log, logs := logtest.New(t)
	k := repair.New(js, time.Hour, log)
	keepBucket(k, js)
	run(t, k)
	logs.Wait(t, within, "DEBUG bucket things is there")

	looks := requests(t, nc, "$JS.API.STREAM.NAMES")
	for range 3 {
		k.Missing("KV_things")
		select {
		case <-looks:
		case <-time.After(within):
			t.Fatalf("no look within %s of being told", within)
		}
	}
}
