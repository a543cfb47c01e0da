package kv_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/repair"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// TestViewsShareOneCache: the views of a process give every reader the
// same cache; it watches while any reader has it started, a reader that
// stops leaves it watching for the others, and the last stop ends the
// watch (it waits for that), which a later start begins again.
func TestViewsShareOneCache(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := kv.NewViews(b, log)
	a, c := v.Nodes(b, log), v.Nodes(b, log)
	if a != c {
		t.Fatal("two readers of the nodes bucket got two caches")
	}
	r1, r2 := v.Requests(b, log), v.Requests(b, log)
	c1, c2 := v.Components(b, log), v.Components(b, log)
	if r1 != r2 || c1 != c2 {
		t.Fatal("two readers of the requests or components bucket got two caches")
	}
	var none *kv.Views
	if n1, n2 := none.Nodes(b, log), none.Nodes(b, log); n1 == n2 {
		t.Fatal("without views, two readers share a cache")
	}

	stopA, stopC := a.Start(), a.Start()
	if err := a.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	seen := func(id string) bool {
		return waitfor.True(10*time.Second, func() bool { return a.Has(id) }, waitfor.Every(10*time.Millisecond))
	}
	write := func(id string) {
		t.Helper()
		n := kv.Node{ID: id, State: kv.NodeReady, Provider: "p", Pool: "main", Labels: []string{"small"}, Created: time.Now().UTC(), StateTime: time.Now().UTC()}
		if _, err := b.Nodes.Create(t.Context(), id, &n); err != nil {
			t.Fatal(err)
		}
	}
	write("0000000001")
	if !seen("0000000001") {
		t.Fatal("a started cache did not see a new record")
	}
	stopA()
	stopA() // a second stop of the same reader changes nothing
	write("0000000002")
	if !seen("0000000002") {
		t.Fatal("the cache stopped watching when one of its two readers stopped")
	}
	stopC() // returns once the watch ended
	// Started again, it watches again from where it was.
	write("0000000003")
	stop := a.Start()
	defer stop()
	if !seen("0000000003") {
		t.Fatal("a cache started again after its last reader stopped does not watch")
	}
}

// TestIdleProcessAsksLittle: idle, each bucket a process's views watch
// gets one staleness probe (STREAM.INFO) a second at most, however many
// caches read it (the images bucket has three); the repair keeper asks
// for the streams' names, and reads no untracked stream's info; nothing
// lists the streams (STREAM.LIST has a cluster's meta leader ask every
// stream of the account). The keeper asks with a connection of its own
// inbox prefix, so the count tells its requests from the caches'.
func TestIdleProcessAsksLittle(t *testing.T) {
	t.Parallel()
	b, js := bucketsJS(t)
	ctx := t.Context()
	log := quietLog()
	nc := js.Conn()
	const keeperInbox = "_KEEPER"
	kc, err := nats.Connect(nc.ConnectedUrl(), nats.CustomInboxPrefix(keeperInbox))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kjs, err := jetstream.New(kc)
	if err != nil {
		t.Fatal(err)
	}

	views := kv.NewViews(b, log)
	caches := []interface {
		Start() func()
		WaitSynced(context.Context) error
	}{views.Nodes(b, log), views.Requests(b, log), views.Components(b, log), views.Images(b, log).Images, views.Images(b, log).Builds, views.Images(b, log).Uploads}
	for _, c := range caches {
		t.Cleanup(c.Start())
		if err := c.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keeper := repair.New(kjs, 0, log)
	for _, bc := range kv.BucketConfigs(kv.Options{Replicas: 1, LeaseTTL: time.Second}) {
		keeper.Keep("KV_"+bc.Bucket, "bucket "+bc.Bucket, nil, func(context.Context, uint64) error { return nil })
	}

	var mu sync.Mutex
	asked := map[string]int{} // subject, with "keeper " before the keeper's
	sub, err := nc.Subscribe("$JS.API.STREAM.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(m.Reply, keeperInbox+".") {
			asked["keeper "+m.Subject]++
		} else {
			asked[m.Subject]++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); keeper.Run(kctx) }()
	// Idle for a few probe intervals: there is no state to wait for.
	const idle = 3 * time.Second
	time.Sleep(idle)
	stop()
	<-done
	_ = sub.Unsubscribe()

	mu.Lock()
	defer mu.Unlock()
	const most = int(idle/time.Second) + 1
	for _, bucket := range []string{kv.BucketNodes, kv.BucketRequests, kv.BucketComponents, kv.BucketImages} {
		n := asked["$JS.API.STREAM.INFO.KV_"+bucket]
		if n == 0 || n > most {
			t.Errorf("idle over %v, bucket %s: %d staleness probes; want 1 to %d (one a second)", idle, bucket, n, most)
		}
	}
	if asked["keeper $JS.API.STREAM.NAMES"] == 0 {
		t.Errorf("the keeper did not ask for the streams' names: %v", asked)
	}
	for subject, n := range asked {
		if strings.HasPrefix(subject, "keeper $JS.API.STREAM.INFO.") || strings.HasSuffix(subject, "STREAM.LIST") {
			t.Errorf("%d requests on %s; want none", n, subject)
		}
	}
}
