package kv_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

func buckets(t *testing.T) *kv.Buckets {
	t.Helper()
	b, _ := bucketsJS(t)
	return b
}

// bucketsJS is buckets with the connection's JetStream context.
func bucketsJS(t testing.TB) (*kv.Buckets, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	// Ensure is idempotent.
	if _, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return b, js
}

func TestStoreRevisionChecks(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	ctx := t.Context()
	s := b.Nodes
	rev, err := s.Create(ctx, "n1", &kv.Node{ID: "n1", State: kv.NodeBuilding})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "n1", &kv.Node{ID: "n1"}); !errors.Is(err, kv.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	if _, err := s.Update(ctx, "n1", &kv.Node{ID: "n1", State: kv.NodeReady}, rev+100); !errors.Is(err, kv.ErrConflict) {
		t.Errorf("update at a wrong revision: %v, want ErrConflict", err)
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("get missing: %v, want ErrNotFound", err)
	}
	// Concurrent Modify calls all land: each retries on conflict.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := s.Modify(ctx, "n1", func(n *kv.Node) error { n.Attempt++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	e, err := s.Get(ctx, "n1")
	if err != nil || e.Value.Attempt != 20 {
		t.Fatalf("attempt = %d, %v; want 20", e.Value.Attempt, err)
	}
	if err := s.Delete(ctx, "n1", e.Revision-1); !errors.Is(err, kv.ErrConflict) {
		t.Errorf("delete at an old revision: %v", err)
	}
	if err := s.Delete(ctx, "n1", e.Revision); err != nil {
		t.Fatal(err)
	}
	// CreateNew refuses a key that was deleted (its marker remains);
	// Create allows it.
	if _, err := s.CreateNew(ctx, "n1", &kv.Node{ID: "n1"}); !errors.Is(err, kv.ErrExists) {
		t.Errorf("CreateNew of a deleted key: %v, want ErrExists", err)
	}
	if _, err := s.Create(ctx, "n1", &kv.Node{ID: "n1"}); err != nil {
		t.Errorf("create after delete: %v", err)
	}
	if _, err := s.CreateNew(ctx, "n2", &kv.Node{ID: "n2"}); err != nil {
		t.Errorf("CreateNew of a fresh key: %v", err)
	}
	if _, err := s.CreateNew(ctx, "n2", &kv.Node{ID: "n2"}); !errors.Is(err, kv.ErrExists) {
		t.Errorf("CreateNew of an existing key: %v, want ErrExists", err)
	}
}

func TestCacheFollowsTheBucket(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	ctx := t.Context()
	if _, err := b.Requests.Create(ctx, "before", &kv.Request{ID: "before"}); err != nil {
		t.Fatal(err)
	}
	c := kv.NewCache(b.Requests, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Run(cctx) }()
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.Has("before") {
		t.Fatal("cache lacks a record that existed before it started")
	}
	sub := c.Subscribe()
	e, err := c.Create(ctx, "after", &kv.Request{ID: "after", State: kv.RequestRequested})
	if err != nil {
		t.Fatal(err)
	}
	// Applied at once, before the watch delivers it.
	if got, _ := c.Get("after"); got.Revision != e.Revision {
		t.Fatalf("cache revision %d, want %d", got.Revision, e.Revision)
	}
	// An older revision never replaces a newer one.
	c.Apply(kv.Entry[kv.Request]{Key: "after", Revision: e.Revision - 1, Value: kv.Request{ID: "stale"}})
	if got, _ := c.Get("after"); got.Value.ID != "after" {
		t.Fatal("a stale revision replaced the cached one")
	}
	if err := b.Requests.Delete(ctx, "after", e.Revision); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 5*time.Second, "the delete to reach the cache", func() bool { return !c.Has("after") }, waitfor.Changes(sub))
}

func TestLeaseHasOneHolder(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var holders, maxHolders atomic.Int32
	var runs atomic.Int32
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	leased := make(chan struct{}, 10)
	for _, id := range []string{"a", "b", "c"} {
		l := kv.NewLease(b.Locks, "test", id, time.Second, log)
		wg.Go(func() {
			l.Elect(ctx, func(lctx context.Context) {
				n := holders.Add(1)
				for {
					m := maxHolders.Load()
					if n <= m || maxHolders.CompareAndSwap(m, n) {
						break
					}
				}
				runs.Add(1)
				leased <- struct{}{}
				// Hold briefly, then give the lease up to let another in.
				select {
				case <-lctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				holders.Add(-1)
			})
		})
	}
	for range 6 {
		select {
		case <-leased:
		case <-time.After(10 * time.Second):
			t.Fatal("the lease was not passed on")
		}
	}
	cancel()
	wg.Wait()
	if maxHolders.Load() != 1 {
		t.Errorf("%d holders at once", maxHolders.Load())
	}
}

// Clone copies every field: a record changed through Cache.Modify never
// touches the cached one.
func TestCloneIsDeep(t *testing.T) {
	now := time.Now()
	n := kv.Node{ID: "n", Labels: []string{"a"}, HostKeys: []string{"k"}, Attributes: map[string]string{"x": "y"},
		DriverData: []byte(`{"a":1}`), UserData: []byte(`{}`), LeaseUntil: &now, HoldExpiration: &now,
		Kubernetes: &kv.KubernetesAccess{Namespace: "ns", Token: "t"}}
	c := n.Clone()
	if !reflect.DeepEqual(n, c) {
		t.Fatalf("clone differs:\n%+v\n%+v", n, c)
	}
	c.Labels[0], c.HostKeys[0], c.Attributes["x"], c.DriverData[0] = "b", "l", "z", 'X'
	*c.LeaseUntil = now.Add(time.Hour)
	c.Kubernetes.Token = "other"
	if n.Labels[0] != "a" || n.HostKeys[0] != "k" || n.Attributes["x"] != "y" || n.DriverData[0] != '{' || !n.LeaseUntil.Equal(now) ||
		n.Kubernetes.Token != "t" {
		t.Errorf("changing the clone changed the original: %+v", n)
	}
	// Every field of Node is copied: a field added later without Clone
	// support shows up here through its zero value in the copy.
	rv := reflect.ValueOf(kv.Node{}).NumField()
	if rv != 42 {
		t.Errorf("Node has %d fields; check that Clone copies the new ones deeply and update this count", rv)
	}
	r := kv.Request{ID: "r", Labels: []string{"a"}, Nodes: []string{"n"}, DeclinedBy: []string{"p"}, RequestorData: []byte(`{}`)}
	rc := r.Clone()
	rc.Labels[0], rc.Nodes[0], rc.DeclinedBy[0] = "b", "m", "q"
	if r.Labels[0] != "a" || r.Nodes[0] != "n" || r.DeclinedBy[0] != "p" {
		t.Errorf("changing the request clone changed the original: %+v", r)
	}
}

// Upsert creates or updates, and retries when another writer (or an
// expiry) got there first: concurrent upserts all land.
func TestUpsert(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			_, err := b.Requests.Upsert(ctx, "c1", func(r *kv.Request, found bool) {
				if !found {
					r.ID = "c1"
				}
				r.Priority++
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	e, err := b.Requests.Get(ctx, "c1")
	if err != nil || e.Value.Priority != 20 || e.Value.ID != "c1" {
		t.Fatalf("after 20 upserts: %+v, %v", e.Value, err)
	}
}

// Writers applying their writes at once never make a subscriber see a
// key go back to an older revision: changes are queued in the order the
// cache took them.
func TestCacheQueuesChangesInOrder(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	c := kv.NewCache(b.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sub := c.Subscribe()
	defer c.Unsubscribe(sub)
	const writers, revs = 4, 2000
	var next atomic.Uint64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for {
				rev := next.Add(1)
				if rev > revs {
					return
				}
				c.Apply(kv.Entry[kv.Node]{Key: "n", Value: kv.Node{ID: "n", Attempt: int(rev)}, Revision: rev})
			}
		})
	}
	wg.Wait()
	var last uint64
	for _, ch := range sub.Drain() {
		if ch.New.Revision < last {
			t.Fatalf("change at revision %d queued after one at %d", ch.New.Revision, last)
		}
		last = ch.New.Revision
	}
}

// Changes signals once at first, then after each change (many changes
// may make one signal), and nothing once stopped; it keeps no changes.
func TestCacheChangesSignals(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	c := kv.NewCache(b.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	changed, stop := c.Changes()
	select {
	case <-changed:
	default:
		t.Fatal("no first signal")
	}
	select {
	case <-changed:
		t.Fatal("a signal with nothing changed")
	default:
	}
	for rev := uint64(1); rev <= 3; rev++ {
		c.Apply(kv.Entry[kv.Node]{Key: "n", Value: kv.Node{ID: "n"}, Revision: rev})
	}
	select {
	case <-changed:
	default:
		t.Fatal("no signal after changes")
	}
	stop()
	c.Apply(kv.Entry[kv.Node]{Key: "n", Value: kv.Node{ID: "n"}, Revision: 4})
	select {
	case <-changed:
		t.Fatal("a signal after stop")
	default:
	}
}

// A process configured with another lease TTL than the buckets' adopts the
// buckets' and says so.
func TestEnsureAdoptsTheBucketsLeaseTTL(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: 2 * time.Second}, quiet); err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: 10 * time.Second}, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if b.LeaseTTL != 2*time.Second {
		t.Errorf("lease TTL %s, want the buckets' 2s", b.LeaseTTL)
	}
	if !strings.Contains(logged.String(), "differs from the buckets' TTL") || !strings.Contains(logged.String(), "buckets=2s") {
		t.Errorf("nothing said about the TTL:\n%s", logged.String())
	}
}
