package metastatic

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// testEnv is a real server with the streams and buckets, and a metastatic
// provider on it.
type testEnv struct {
	t   *testing.T
	srv *natstest.Server
	js  jetstream.JetStream
	b   *kv.Buckets
	p   *Provider
	log *slog.Logger
}

func newTestEnv(t *testing.T, yaml string) *testEnv {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := t.Context()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := events.Ensure(ctx, js, 1, log); err != nil {
		t.Fatal(err)
	}
	b, err := kv.Ensure(ctx, js, kv.Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := cfg.Provider("meta")
	p, err := New(js, meta, views(t, js, log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.synced(ctx); err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, srv: srv, js: js, b: b, p: p, log: log}
}

func (e *testEnv) manager() *manager {
	return &manager{p: e.p, filed: e.p.filed, orphans: map[string]int{}, broken: map[string]uint64{}}
}

// node writes a node record through the provider's cache.
func (e *testEnv) node(n *kv.Node) {
	e.t.Helper()
	now := time.Now().UTC()
	n.Created, n.StateTime = now, now
	if _, err := e.p.nodes.Create(e.t.Context(), n.ID, n); err != nil {
		e.t.Fatal(err)
	}
}

// request writes a request record through the provider's cache.
func (e *testEnv) request(r *kv.Request) {
	e.t.Helper()
	now := time.Now().UTC()
	r.Created, r.StateTime = now, now
	if _, err := e.p.requests.Create(e.t.Context(), r.ID, r); err != nil {
		e.t.Fatal(err)
	}
}

// published is the number of requests published so far.
func (e *testEnv) published() uint64 {
	e.t.Helper()
	s, err := e.js.Stream(e.t.Context(), events.RequestsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func (e *testEnv) carved(id, label string) *kv.Node {
	return &kv.Node{ID: id, State: kv.NodeBuilding, Provider: "meta", Pool: "main", Labels: []string{label},
		DriverData: encodeJSON(CarvedData{Step: StepWaiting})}
}

// The pass that takes the backing node of a fulfilled request counts its
// free slots for the nodes that started waiting after the request was
// filed: they take them, no second backing node is requested (issue 9:
// three requests at once on an 8-slot label used two backing nodes).
func TestPassCountsTheSlotsOfTheNodeItTakes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, testConfig)
	me := Requestor("meta")
	e.node(&kv.Node{ID: "bk", State: kv.NodeReady, Provider: "cloud", Pool: "main", Labels: []string{"big"}, AllocatedTo: "req1", InterfaceIP: "10.0.0.9"})
	for _, id := range []string{"a", "b", "c"} {
		e.node(e.carved(id, "small"))
	}
	e.request(&kv.Request{ID: "req1", State: kv.RequestFulfilled, Labels: []string{"big"}, Nodes: []string{"bk"}, Requestor: me,
		RequestorData: encodeJSON(RequestData{Provider: "meta", Pool: "main", Label: "small", Slots: 8, Nodes: []string{"a", "b"}})})

	e.manager().pass(t.Context())

	bn, _ := e.p.nodes.Get("bk")
	if d, ok := e.p.owned(&bn.Value); !ok || d.Used() != 0 || d.Slots != 8 || d.Request != "req1" {
		t.Fatalf("backing node not taken with 8 free slots: %s %s", bn.Value.State, bn.Value.UserData)
	}
	if n := e.published(); n != 0 {
		t.Fatalf("%d backing requests published while the backing node just taken has 8 free slots for 3 waiting nodes", n)
	}
	for i, id := range []string{"a", "b", "c"} {
		sm, _ := e.p.Create(createReq(id, "small"), nil)
		step, err := sm.Advance(t.Context())
		if err != nil || !step.Done || step.Instance.InterfaceIP != "10.0.0.9" {
			t.Fatalf("%s: %+v, %v; want a slot on bk", id, step, err)
		}
		if st, _ := decodeCarved(sm.State()); st.BackingNode != "bk" || st.Slot != i {
			t.Errorf("%s: %+v; want slot %d of bk", id, st, i)
		}
	}
}

// A new term of the manager in the same process (its lease lost and
// taken again, as a busy process renewing late does) knows the backing
// requests the last term published whose records have not shown up yet,
// and does not publish them again: a third backing node showed up so in
// consumers' TestMetastaticMaxAgeAndMinRetention under load.
func TestNewTermDoesNotFileAgain(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, testConfig)
	e.node(e.carved("a", "small"))
	e.manager().pass(t.Context())
	if n := e.published(); n != 1 {
		t.Fatalf("%d backing requests published for one waiting node; want 1", n)
	}
	// No intake runs here: the request's record never shows up.
	e.manager().pass(t.Context())
	if n := e.published(); n != 1 {
		t.Fatalf("%d backing requests published after a new term; want still 1", n)
	}
}

// A term that ends while it publishes a backing request (its lease lost
// mid-publish) leaves it counted as filed, since the stream may have
// stored it: the next term publishes it again under the same id, which
// the stream takes once, and files no other for the same node.
func TestNewTermPublishesAgainWhatWasCutShort(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, testConfig)
	e.node(e.carved("a", "small"))
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	e.manager().pass(ended)
	if n := e.published(); n != 0 {
		t.Fatalf("%d backing requests stored by a term that had ended", n)
	}
	var id string
	for k, f := range e.p.filed {
		if f.stored {
			t.Fatalf("request %s marked stored, though its publish failed", k)
		}
		id = k
	}
	if len(e.p.filed) != 1 {
		t.Fatalf("%d requests counted as filed after a publish cut short; want 1", len(e.p.filed))
	}
	e.manager().pass(t.Context())
	e.manager().pass(t.Context())
	if n := e.published(); n != 1 {
		t.Fatalf("%d backing requests published by the next terms; want the one cut short, once", n)
	}
	if f, ok := e.p.filed[id]; !ok || !f.stored {
		t.Fatalf("request %s not published again under its id: filed %+v", id, e.p.filed)
	}
}

func createReq(id, label string) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: id, Provider: "meta", Pool: "main", Label: label, Attempt: 1}
}

// Records the driver cannot read are dealt with one by one, each with a
// reason, and never stop the pass: a backing request of ours with bad
// requestor_data fails (and goes after a while), a node we hold without a
// valid slot map goes back once no carved node names it, a carved node
// with bad driver_data neither waits nor resumes.
func TestPassDealsWithRecordsItCannotRead(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, testConfig)
	me := Requestor("meta")
	ctx := t.Context()
	held := func(id string, userData string) {
		e.node(&kv.Node{ID: id, State: kv.NodeInUse, Holder: me, Provider: "cloud", Pool: "main", Labels: []string{"big"}, UserData: json.RawMessage(userData)})
	}
	held("neg-slots", `{"owner": "NodePool:metastatic:meta", "slots": -1, "allocations": []}`)
	held("dup", `{"owner": "NodePool:metastatic:meta", "slots": 2, "allocations": ["x", "x"]}`)
	held("not-json", `"garbage"`)
	held("named", `{"owner": "NodePool:metastatic:meta", "slots": 1000000}`)
	held("other-owner", `{"owner": "someone", "slots": 1, "allocations": [""]}`)
	e.node(&kv.Node{ID: "carved-on-named", State: kv.NodeInUse, Provider: "meta", Pool: "main", Labels: []string{"small"},
		DriverData: encodeJSON(CarvedData{Step: StepAllocated, BackingNode: "named", Slot: 0})})
	e.node(&kv.Node{ID: "bad-carved", State: kv.NodeBuilding, Provider: "meta", Pool: "main", Labels: []string{"small"},
		DriverData: json.RawMessage(`{"step": "waiting", "slot": -7, "backing_node": "x/y"}`)})
	e.node(&kv.Node{ID: "bad-step", State: kv.NodeBuilding, Provider: "meta", Pool: "main", Labels: []string{"small"},
		DriverData: json.RawMessage(`{"step": "exploding"}`)})
	e.request(&kv.Request{ID: "bad-req", State: kv.RequestPending, Labels: []string{"big"}, Requestor: me,
		RequestorData: json.RawMessage(`{"provider": "meta", "slots": -1}`)})
	e.request(&kv.Request{ID: "bad-fulfilled", State: kv.RequestFulfilled, Labels: []string{"big"}, Nodes: []string{"nope"}, Requestor: me,
		RequestorData: json.RawMessage(`{"provider": "meta", "slots": 3, "nodes": ["a", "b", "c", "d"]}`)})
	e.request(&kv.Request{ID: "not-ours", State: kv.RequestPending, Labels: []string{"big"}, Requestor: "zuul",
		RequestorData: json.RawMessage(`{"slots": -1}`)})

	m := e.manager()
	m.pass(ctx)

	for id, want := range map[string]kv.NodeState{
		"neg-slots": kv.NodeUsed, "dup": kv.NodeUsed, "not-json": kv.NodeUsed, "other-owner": kv.NodeUsed,
		"named": kv.NodeInUse, // its carved node still uses it
	} {
		if n, _ := e.p.nodes.Get(id); n.Value.State != want {
			t.Errorf("node %s is %s, want %s", id, n.Value.State, want)
		}
	}
	for id, want := range map[string]string{
		"bad-req":       "requestor_data is not valid: slots is -1; expected 1 to 10000",
		"bad-fulfilled": "nodes lists 4 nodes; expected at most one per slot (3)",
	} {
		r, _ := e.p.requests.Get(id)
		if r.Value.State != kv.RequestFailed || !strings.Contains(r.Value.Reason, want) {
			t.Errorf("request %s = %s (%q); want failed naming %q", id, r.Value.State, r.Value.Reason, want)
		}
	}
	if r, _ := e.p.requests.Get("not-ours"); r.Value.State != kv.RequestPending {
		t.Errorf("another requestor's request was touched: %s", r.Value.State)
	}
	if n := e.published(); n != 0 {
		t.Errorf("%d backing requests published for carved nodes that do not wait", n)
	}
	for id, want := range map[string]string{"bad-carved": "slot is -7", "bad-step": `step is "exploding"`} {
		n, _ := e.p.nodes.Get(id)
		if _, err := e.p.Create(createReq(id, "small"), n.Value.DriverData); err == nil || !errors.Is(err, drivers.ErrFatal) || !strings.Contains(err.Error(), want) {
			t.Errorf("resuming %s: %v; want a fatal error naming %q", id, err, want)
		}
	}

	// A failed request that is not valid is deleted after a while.
	r, _ := e.p.requests.Get("bad-req")
	m.refuse(ctx, r, errors.New("x"), time.Now().Add(failedRequestKeep+time.Minute))
	if _, err := e.b.Requests.Get(ctx, "bad-req"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("failed request not deleted after %s: %v", failedRequestKeep, err)
	}
}

// A record whose handling panics is logged and left alone until it
// changes; the others are handled.
func TestGuardLeavesAPanickingRecordAlone(t *testing.T) {
	t.Parallel()
	m := &manager{p: &Provider{log: slog.New(slog.NewTextHandler(io.Discard, nil))}, broken: map[string]uint64{}}
	runs := 0
	boom := func() { runs++; panic("bad record") }
	m.guard("request", "r1", 5, boom)
	m.guard("request", "r1", 5, boom) // same revision: skipped
	ok := false
	m.guard("request", "r2", 5, func() { ok = true })
	m.guard("request", "r1", 6, boom) // changed: tried again
	if runs != 2 || !ok {
		t.Errorf("runs = %d, other record handled = %v; want 2, true", runs, ok)
	}
}

// views are a provider's options with views of the records of its own,
// on js's connection, as a process gives them.
func views(tb testing.TB, js jetstream.JetStream, log *slog.Logger) Options {
	tb.Helper()
	b, err := kv.Open(tb.Context(), js)
	if err != nil {
		tb.Fatal(err)
	}
	return Options{Nodes: kv.NewCache(b.Nodes, log), Requests: kv.NewCache(b.Requests, log), Log: log}
}
