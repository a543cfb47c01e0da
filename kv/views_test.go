package kv_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
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

// TestIdleViewsAskNoStream: the caches of a process's views take their
// staleness probes from the infos of the streams the process's keeper
// reads each second: idle, they ask no stream for its info themselves
// (one STREAM.INFO a second per bucket before). The keeper asks with a
// connection of its own inbox prefix, so the count tells its requests
// from the caches'. Nothing lists the streams (STREAM.LIST has a
// cluster's meta leader ask every stream of the account). A cache of no
// views asks its stream, as a check that the count sees those calls.
func TestIdleViewsAskNoStream(t *testing.T) {
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
	// count counts the requests on subject, the keeper's apart.
	count := func(subject string) (others, keeper *atomic.Int64, stop func()) {
		others, keeper = &atomic.Int64{}, &atomic.Int64{}
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			if strings.HasPrefix(m.Reply, keeperInbox+".") {
				keeper.Add(1)
			} else {
				others.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return others, keeper, func() { _ = sub.Unsubscribe() }
	}
	observe := func(start func() func()) (infos, keeperInfos, lists int64) {
		stopCache := start()
		defer stopCache()
		info, keeperInfo, stopInfo := count("$JS.API.STREAM.INFO.>")
		defer stopInfo()
		list, keeperList, stopList := count("$JS.API.STREAM.LIST")
		defer stopList()
		// Idle for a few probe intervals: there is no state to wait for.
		time.Sleep(3 * time.Second)
		return info.Load(), keeperInfo.Load(), list.Load() + keeperList.Load()
	}

	views := kv.NewViews(b, log)
	keeper := repair.New(kjs, 0, log)
	for _, bc := range kv.BucketConfigs(kv.Options{Replicas: 1, LeaseTTL: time.Second}) {
		keeper.Keep("KV_"+bc.Bucket, "bucket "+bc.Bucket, false, func(context.Context, uint64) error { return nil })
	}
	keeper.OnList(views.Listing().Listed)
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); keeper.Run(kctx) }()
	defer func() { stop(); <-done }()
	infos, keeperInfos, lists := observe(func() func() {
		stops := []func(){views.Nodes(b, log).Start(), views.Requests(b, log).Start(), views.Components(b, log).Start(), views.Images(b, log).Images.Start()}
		for _, c := range []interface{ WaitSynced(context.Context) error }{views.Nodes(b, log), views.Requests(b, log), views.Components(b, log), views.Images(b, log).Images} {
			if err := c.WaitSynced(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return func() {
			for _, s := range stops {
				s()
			}
		}
	})
	if infos != 0 || keeperInfos == 0 || lists != 0 {
		t.Errorf("idle views over 3 s: %d stream info calls of the caches, %d of the keeper, %d listings; want none, the keeper's, none", infos, keeperInfos, lists)
	}

	alone := kv.NewCache(b.Nodes, log)
	infos, _, _ = observe(func() func() {
		s := alone.Start()
		if err := alone.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	})
	if infos == 0 {
		t.Error("a cache of no views asked its stream nothing over 3 s: the count sees no calls")
	}
}
