package kv_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

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
