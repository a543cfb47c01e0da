package kv_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/kv"
)

// List reads the last value of every key, deleted and purged keys and
// records that do not decode left out, in the order of their last
// writes, whether it pulls
// from the bucket's stream (stores of kv.Ensure, which know the JetStream
// context) or watches (a store of a bare bucket); a filtered store lists
// only its keys.
func TestStoreList(t *testing.T) {
	t.Parallel()
	b, js := bucketsJS(t)
	ctx := t.Context()
	bare, err := js.KeyValue(ctx, kv.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 2500 {
		id := fmt.Sprintf("n%05d", i)
		rev, err := b.Nodes.Create(ctx, id, &kv.Node{ID: id, State: kv.NodeBuilding})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i%10 == 1:
			if err := b.Nodes.Delete(ctx, id, rev); err != nil {
				t.Fatal(err)
			}
		case i%10 == 2:
			if err := bare.Purge(ctx, id); err != nil {
				t.Fatal(err)
			}
		case i%10 == 3:
			if _, err := b.Nodes.Update(ctx, id, &kv.Node{ID: id, State: kv.NodeReady}, rev); err != nil {
				t.Fatal(err)
			}
			want = append(want, id+"=ready")
		default:
			want = append(want, id+"=building")
		}
	}
	if _, err := bare.Put(ctx, "not-json", []byte("{")); err != nil {
		t.Fatal(err)
	}
	empty, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "empty"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		store *kv.Store[kv.Node]
		want  []string
	}{
		{"pulled", b.Nodes, want},
		{"watched", kv.NewStore[kv.Node](bare), want},
		{"pulled, filtered, nothing matches", b.Nodes.Filtered("m*"), nil},
		{"pulled, one key", b.Nodes.Filtered("n00013"), []string{"n00013=ready"}},
		{"watched, one key", kv.NewStore[kv.Node](bare).Filtered("n00013"), []string{"n00013=ready"}},
		{"empty", kv.NewStore[kv.Node](empty), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.store.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var have []string
			for _, e := range got {
				if e.Key != e.Value.ID || e.Revision == 0 {
					t.Errorf("entry %s: id %s, revision %d", e.Key, e.Value.ID, e.Revision)
				}
				have = append(have, e.Key+"="+string(e.Value.State))
			}
			if !slices.Equal(have, tc.want) {
				t.Errorf("listed %d records, want %d; first differences: %v", len(have), len(tc.want), firstDiff(have, tc.want))
			}
			if tc.name == "pulled" { // before any watch, whose consumer the server ends on its own
				st, err := js.Stream(ctx, "KV_"+kv.BucketNodes)
				if err != nil {
					t.Fatal(err)
				}
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.State.Consumers != 0 {
					t.Errorf("%d consumers left on the bucket after listing; want none", info.State.Consumers)
				}
			}
		})
	}
}

// A cache started on a bucket that holds records holds the same records
// List (which pulls) reads, the one that does not decode among its bad
// records; then its watch goes on.
func TestCacheHoldsWhatListReads(t *testing.T) {
	t.Parallel()
	b, js := bucketsJS(t)
	// Everything here waits on the server or the cache's watch: a
	// deadline turns a hang into a failure that says where.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	bare, err := js.KeyValue(ctx, kv.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1500 {
		id := fmt.Sprintf("n%05d", i)
		rev, err := b.Nodes.Create(ctx, id, &kv.Node{ID: id, State: kv.NodeBuilding})
		if err != nil {
			t.Fatal(err)
		}
		if i%10 == 1 {
			if err := b.Nodes.Delete(ctx, id, rev); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := bare.Put(ctx, "not-json", []byte("{")); err != nil {
		t.Fatal(err)
	}
	want, err := b.Nodes.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := kv.NewCache(b.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Start()()
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Len() != len(want) {
		t.Errorf("cache holds %d records, want %d", c.Len(), len(want))
	}
	for _, w := range want {
		if e, ok := c.Get(w.Key); !ok || e.Revision != w.Revision || e.Value.State != w.Value.State {
			t.Fatalf("cache holds %s as %+v (%v), want revision %d", w.Key, e, ok, w.Revision)
		}
	}
	if bad := c.BadRecords(); len(bad) != 1 || bad[0].Key != "not-json" {
		t.Errorf("bad records %v, want not-json", bad)
	}
	// Deleted and changed after the start: the watch brings both.
	if err := b.Nodes.Delete(ctx, "n00000", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Nodes.Modify(ctx, "n00002", func(n *kv.Node) error { n.State = kv.NodeReady; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Has("n00000") {
		t.Error("n00000 deleted after the start is still in the cache")
	}
	if e, _ := c.Get("n00002"); e.Value.State != kv.NodeReady {
		t.Errorf("n00002 changed after the start is %s in the cache, want ready", e.Value.State)
	}
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("at %d: %s, want %s", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(a), len(b))
}
