package kv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

type rec struct {
	N int `json:"n"`
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// On a replicated bucket, Get goes to the stream leader and answers as the
// bucket's own Get does: the newest value and revision, not found for a
// key never written, deleted or purged. A bucket with one replica is left
// as it is.
func TestReadFromLeader(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	_, js := c.Connect(t, 1)
	ctx := t.Context()
	b, err := kv.EnsureBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "r3", History: 1, Replicas: 3}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	s := kv.NewStore[rec](b)
	rev, err := s.Create(ctx, "a", &rec{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rev, err = s.Update(ctx, "a", &rec{N: 2}, rev); err != nil {
		t.Fatal(err)
	}
	e, err := s.Get(ctx, "a")
	if err != nil || e.Value.N != 2 || e.Revision != rev {
		t.Errorf("Get = %+v, %v; want n=2 at revision %d", e, err, rev)
	}
	if _, err := s.Get(ctx, "never"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("a key never written: %v", err)
	}
	if err := s.Delete(ctx, "a", rev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("a deleted key: %v", err)
	}
	if _, err := s.Create(ctx, "b", &rec{N: 3}); err != nil {
		t.Fatal(err)
	}
	if err := b.Purge(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("a purged key: %v", err)
	}
	deleted, _, _, err := s.LastDeletion(ctx, "a")
	if err != nil || !deleted {
		t.Errorf("LastDeletion of a deleted key: %v, %v", deleted, err)
	}

	one, err := kv.EnsureBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "r1", History: 1, Replicas: 1}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.ReadFromLeader(ctx, js, one); err != nil {
		t.Fatal(err)
	}
}

// A cache whose watch lived on the server that led its bucket's stream,
// killed, holds every change made after the kill (its watch is started
// again where it stopped), and Sync returns once it does.
func TestCacheFollowsLeaderLoss(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
	}{
		{name: "own probe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := natstest.StartCluster(t, 3)
			_, js := c.Connect(t, 0)
			ctx := t.Context()
			b, err := kv.EnsureBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "watched", History: 1, Replicas: 3}, quietLog())
			if err != nil {
				t.Fatal(err)
			}
			var cache interface {
				Start() func()
				WaitSynced(context.Context) error
				Sync(context.Context) error
				Has(string) bool
			} = kv.NewCache(kv.NewStore[rec](b), quietLog())
			t.Cleanup(cache.Start())
			if err := cache.WaitSynced(ctx); err != nil {
				t.Fatal(err)
			}
			_, wjs := c.Connect(t, 2)
			writer, err := wjs.KeyValue(ctx, "watched")
			if err != nil {
				t.Fatal(err)
			}
			leader := c.WaitStreamLeader("KV_watched", 10*time.Second)
			c.Stop(leader)
			for i := range 5 {
				key := fmt.Sprintf("k%d", i)
				for attempt := 0; ; attempt++ {
					actx, cancel := context.WithTimeout(ctx, 2*time.Second)
					_, err := writer.Put(actx, key, []byte(`{"n": 1}`))
					cancel()
					if err == nil {
						break
					}
					if attempt > 60 {
						t.Fatalf("writing %s: %v", key, err)
					}
					time.Sleep(250 * time.Millisecond)
				}
			}
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := cache.Sync(sctx); err != nil {
				t.Fatalf("Sync after the leader was lost: %v", err)
			}
			for i := range 5 {
				if !cache.Has(fmt.Sprintf("k%d", i)) {
					t.Errorf("the cache lacks k%d", i)
				}
			}
			if err := c.Restart(leader); err != nil {
				t.Fatal(err)
			}
		})
	}
}
