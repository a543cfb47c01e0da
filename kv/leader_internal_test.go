package kv

import (
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natstest"
)

// The initial-values marker of a watch of a replicated bucket covers the
// stream's last sequence only if the stream's leader has no change after
// what the watch delivered: the watch's consumer may sit on a replica that
// is catching up, whose marker says nothing of what it lacks. Changes
// that are gone (deleted messages, an expired tail) do not hold it back;
// changes of keys the watch does not follow neither.
func TestWatchCoversWhatTheLeaderHas(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	_, js := c.Connect(t, 0)
	ctx := t.Context()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := EnsureBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "covered", History: 1, Replicas: 3}, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.(*leaderKV); !ok {
		t.Fatalf("a bucket of three replicas is read as %T, not from its leader", b)
	}
	for _, k := range []string{"a.1", "b", "a.2", "c", "d"} { // sequences 1 to 5
		if _, err := b.Put(ctx, k, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	all := &watchLoop{kv: b, log: log}
	onlyA := &watchLoop{kv: b, keys: "a.*", log: log}
	for _, tc := range []struct {
		name         string
		w            *watchLoop
		last, target uint64
		want         uint64
	}{
		{"delivered everything", all, 5, 5, 5},
		{"changes after it on the leader", all, 2, 5, 2},
		{"changes after it, of other keys", onlyA, 3, 5, 5},
		{"a change of its keys after it", onlyA, 1, 5, 1},
	} {
		if got := tc.w.covered(ctx, tc.last, tc.target); got != tc.want {
			t.Errorf("%s: delivered up to %d, stream at %d: covers %d, want %d", tc.name, tc.last, tc.target, got, tc.want)
		}
	}
	// A key written and deleted (sequences 6 and 7), then purged from
	// the stream (the leader answers once it has): the stream's last
	// sequence stays 7, with nothing after 5. (The bucket's PurgeDeletes
	// would not do: it finds the delete markers with a watch, which may
	// be on a replica that has not stored the marker yet.)
	if _, err := b.Put(ctx, "e", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "e"); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_covered")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject("$KV.covered.e")); err != nil {
		t.Fatal(err)
	}
	if got := all.covered(ctx, 5, 7); got != 7 {
		t.Errorf("the stream's tail purged: a watch at 5 covers %d, want 7", got)
	}

	one, err := EnsureBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "single", History: 1, Replicas: 1}, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := (&watchLoop{kv: one, log: log}).covered(ctx, 0, 7); got != 7 {
		t.Errorf("one replica: covers %d, want the stream's last sequence 7", got)
	}
}
