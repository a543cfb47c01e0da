package metastatic

import (
	"encoding/json"
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
	t  *testing.T
	js jetstream.JetStream
	b  *kv.Buckets
	p  *Provider
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
	p, err := New(ctx, js, meta, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.synced(ctx); err != nil {
		t.Fatal(err)
	}
	return &testEnv{t: t, js: js, b: b, p: p}
}

func (e *testEnv) manager() *manager {
	return &manager{p: e.p, filed: map[string]filed{}, orphans: map[string]int{}, broken: map[string]uint64{}}
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

func createReq(id, label string) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: id, Provider: "meta", Pool: "main", Label: label, Attempt: 1}
}

var _ = json.Marshal
var _ = strings.Contains
