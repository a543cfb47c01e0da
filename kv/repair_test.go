package kv_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// remakeWithin bounds how long a cache or lease takes to follow a bucket
// deleted and made again.
const remakeWithin = 10 * time.Second

// remake deletes a bucket and makes it again with its settings, as the
// process's keeper does (internal/repair).
func remake(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	for _, cfg := range kv.BucketConfigs(kv.Options{Replicas: 1, LeaseTTL: time.Second}) {
		if cfg.Bucket != name {
			continue
		}
		if err := js.DeleteKeyValue(t.Context(), name); err != nil {
			t.Fatal(err)
		}
		log, _ := logtest.New(t)
		if _, err := kv.EnsureBucket(t.Context(), js, cfg, log); err != nil {
			t.Fatal(err)
		}
		// A stream deleted and made again at once on the same server
		// may come back with the old one's last messages (about one
		// time in twenty, nats-server 2.15.2, file storage); the tests are
		// about a bucket made again empty, so it is emptied.
		st, err := js.Stream(t.Context(), "KV_"+name)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(t.Context()); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no bucket %s", name)
}

// A cache whose bucket is deleted and made again drops the records it
// held (its subscribers see them deleted) and holds the new bucket's,
// whose revisions start again from one.
func TestCacheFollowsABucketMadeAgain(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, logs := logtest.New(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		if _, err := b.Nodes.Create(t.Context(), id, &kv.Node{ID: id, State: kv.NodeReady}); err != nil {
			t.Fatal(err)
		}
	}
	c := kv.NewCache(b.Nodes, log)
	t.Cleanup(c.Start())
	if err := c.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	sub := c.Subscribe()
	defer c.Unsubscribe(sub)

	remake(t, js, kv.BucketNodes)
	if _, err := b.Nodes.Create(t.Context(), "new-1", &kv.Node{ID: "new-1", State: kv.NodeBuilding}); err != nil {
		t.Fatalf("writing to the bucket made again through the old handle: %v", err)
	}
	deleted := map[string]bool{}
	waitfor.Until(t, remakeWithin, "the cache to hold only new-1", func() bool { return c.Has("new-1") && c.Len() == 1 },
		waitfor.Wake(sub.C()), waitfor.Before(func() {
			for _, ch := range sub.Drain() {
				if ch.New == nil {
					deleted[ch.Key] = true
				}
			}
		}), waitfor.Detail(func() string { return fmt.Sprintf("the cache holds %d records, new-1: %v", c.Len(), c.Has("new-1")) }))
	for _, ch := range sub.Drain() {
		if ch.New == nil {
			deleted[ch.Key] = true
		}
	}
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		if !deleted[id] {
			t.Errorf("subscribers were not told that %s is gone", id)
		}
	}
	if c.Restarted().IsZero() {
		t.Error("the cache does not say when it started afresh")
	}
	logs.Wait(t, time.Second, "the bucket was deleted and made again")
	if err := c.Sync(t.Context()); err != nil {
		t.Errorf("Sync after the bucket was made again: %v", err)
	}
}

// A lease whose key goes with its bucket (deleted and made again) is
// written again by its holder's next renewal, as long as nobody took it
// meanwhile; a lease somebody took is lost.
func TestLeaseWrittenAgainAfterItsBucketWasMadeAgain(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, logs := logtest.New(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	a := kv.NewLease(b.Locks, "work", "a", time.Minute, log)
	if held, err := a.TryAcquire(t.Context()); err != nil || !held {
		t.Fatalf("taking the lease: %v %v", held, err)
	}
	remake(t, js, kv.BucketLocks)
	if err := a.Renew(t.Context()); err != nil {
		t.Fatalf("renewing a lease whose bucket was made again: %v", err)
	}
	e, err := b.Locks.Get(t.Context(), "work")
	if err != nil || e.Value.Holder != "a" {
		t.Fatalf("the lease's key after the renewal: %+v %v", e.Value, err)
	}
	logs.Wait(t, time.Second, "the lease's key was deleted while held; written again")
	if err := a.Renew(t.Context()); err != nil {
		t.Fatalf("renewing it again: %v", err)
	}

	// Taken by another holder after the bucket was made again: lost.
	remake(t, js, kv.BucketLocks)
	other := kv.NewLease(b.Locks, "work", "b", time.Minute, log)
	if held, err := other.TryAcquire(t.Context()); err != nil || !held {
		t.Fatalf("another holder taking the free lease: %v %v", held, err)
	}
	if err := a.Renew(t.Context()); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("the first holder renewing a lease another holder took: %v, want ErrConflict", err)
	}
}

// A process starting on buckets another one made (or a restart) opens
// them without a warning: the consumer limits set on their streams after
// the create make the server refuse a second create of the same settings,
// which said "bucket exists with other settings" at every start. A bucket
// whose settings do differ is still warned of, naming what differs.
func TestEnsureBucketsTwiceWarnsOfRealDifferencesOnly(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	opts := kv.Options{Replicas: 1, LeaseTTL: time.Second}
	log, logs := logtest.New(t)
	for range 2 {
		if _, err := kv.Ensure(t.Context(), js, opts, log); err != nil {
			t.Fatal(err)
		}
	}
	if got := logs.Lines("WARN"); len(got) > 0 {
		t.Errorf("opening buckets made with the same settings warned: %q", got)
	}
	cfg := kv.BucketConfigs(opts)[0]
	cfg.History = 5
	if _, err := kv.EnsureBucket(t.Context(), js, cfg, log); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, remakeWithin, "WARN bucket exists with other settings", "bucket="+cfg.Bucket, "differs=[history]")
}

// told collects the streams a store or a cache reported missing.
type told struct{ ch chan string }

func newTold() *told { return &told{ch: make(chan string, 100)} }

func (m *told) missing(stream string) {
	select {
	case m.ch <- stream:
	default:
	}
}

// wait waits until stream is reported.
func (m *told) wait(t *testing.T, stream string) {
	t.Helper()
	select {
	case got := <-m.ch:
		if got != stream {
			t.Fatalf("reported %q missing, want %q", got, stream)
		}
	case <-time.After(remakeWithin):
		t.Fatalf("%s was not reported missing within %s", stream, remakeWithin)
	}
}

// A store's calls and its caches' watches report its bucket missing when
// it is deleted (the process's keeper then makes it again at once); a
// store of buckets that are there reports nothing.
func TestStoresReportTheirBucketMissing(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, _ := logtest.New(t)
	m := newTold()
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Second, Missing: m.missing}, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Nodes.Create(t.Context(), "0000000001", &kv.Node{State: kv.NodeBuilding}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Nodes.Get(t.Context(), "0000000002"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("reading a key that is not there: %v, want ErrNotFound", err)
	}
	select {
	case s := <-m.ch:
		t.Fatalf("%s reported missing while it is there", s)
	default:
	}

	t.Run("call", func(t *testing.T) {
		if err := js.DeleteKeyValue(t.Context(), kv.BucketLocks); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Locks.Create(t.Context(), "x", &kv.LeaseRecord{Holder: "a"}); err == nil {
			t.Fatal("a write to a deleted bucket succeeded")
		}
		m.wait(t, "KV_"+kv.BucketLocks)
	})
	t.Run("list", func(t *testing.T) {
		if err := js.DeleteKeyValue(t.Context(), kv.BucketRequests); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.NewStore[kv.Request](b.Requests.Bucket()).Reporting(m.missing).List(t.Context()); err == nil {
			t.Fatal("listing a deleted bucket succeeded")
		}
		m.wait(t, "KV_"+kv.BucketRequests)
	})
	t.Run("cache", func(t *testing.T) {
		c := kv.NewCache(b.Components, log)
		stop := c.Start()
		defer stop()
		if err := c.WaitSynced(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteKeyValue(t.Context(), kv.BucketComponents); err != nil {
			t.Fatal(err)
		}
		m.wait(t, "KV_"+kv.BucketComponents)
	})
	t.Run("images", func(t *testing.T) {
		img := b.ImageCaches(log)
		stop := img.Images.Start()
		defer stop()
		if err := img.Images.WaitSynced(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteKeyValue(t.Context(), kv.BucketImages); err != nil {
			t.Fatal(err)
		}
		m.wait(t, "KV_"+kv.BucketImages)
	})
}
