package kv

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natstest"
)

func TestKeyMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"*", "debian", true},
		{"*", "debian.0000000001", false},
		{"*.*", "debian.0000000001", true},
		{"*.*", "debian", false},
		{"*.*.*.*", "debian.0000000002.cloud1.0000000001", true},
		{"*.*.*.*", "debian.0000000002.cloud1", false},
		{"debian.*", "debian.0000000001", true},
		{"debian.*", "ubuntu.0000000001", false},
		{">", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "a.b.c", true},
		{"", "", true},
		{"*", "", false},
	} {
		if got := keyMatches(c.pattern, c.key); got != c.want {
			t.Errorf("keyMatches(%q, %q) = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}

// pullLast hands over the last value of every key, deletions left out, a
// fetch of at most the size asked at a time, in the stream's order.
func TestPullLastBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	b, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pull"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for i := range 40 {
		key := fmt.Sprintf("k%02d", i%25) // 15 keys written twice
		if _, err := b.PutString(ctx, key, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		want[key] = true
	}
	if err := b.Delete(ctx, "k03"); err != nil {
		t.Fatal(err)
	}
	if err := b.Purge(ctx, "k04"); err != nil {
		t.Fatal(err)
	}
	delete(want, "k03")
	delete(want, "k04")
	var (
		sizes []int
		got   = map[string]bool{}
		prev  uint64
	)
	err = newStore[struct{}](js, b).pullLast(ctx, 7, func(batch []rawRecord) {
		sizes = append(sizes, len(batch))
		for _, r := range batch {
			if r.rev <= prev {
				t.Errorf("%s at %d after %d: out of the stream's order", r.key, r.rev, prev)
			}
			prev = r.rev
			got[r.key] = true
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("pulled %v, want %v", got, want)
	}
	if slices.Max(sizes) > 7 || len(sizes) != 4 {
		t.Errorf("batches of %v for 25 keys, 2 of them deleted; want 4 of at most 7", sizes)
	}

	// list puts the decoded batches together in the stream's order, as
	// entries (List) or values (Values).
	store := newStore[int](js, b)
	es, err := list(ctx, store, 7, func(r *rawRecord, v int) Entry[int] { return Entry[int]{Key: r.key, Value: v, Revision: r.rev} })
	if err != nil {
		t.Fatal(err)
	}
	vals, err := list(ctx, store, 7, func(_ *rawRecord, v int) int { return v })
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != len(want) || len(vals) != len(es) {
		t.Fatalf("listed %d entries and %d values, want %d", len(es), len(vals), len(want))
	}
	for i, e := range es {
		var k int
		if _, err := fmt.Sscanf(e.Key, "k%02d", &k); err != nil {
			t.Fatal(err)
		}
		last := k // the last value written to the key
		if k < 15 {
			last = k + 25
		}
		if e.Value != last || vals[i] != last || (i > 0 && e.Revision <= es[i-1].Revision) {
			t.Errorf("entry %d: %s=%d (value %d) at %d; want %d, after %d", i, e.Key, e.Value, vals[i], e.Revision, last, es[max(i-1, 0)].Revision)
		}
	}
}
