package consumers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// The ways an instance dies out of band, each with the reason its ready
// node fails with.
var deaths = []struct {
	name   string
	kill   func(cloud *fake.Provider, ctx context.Context, id string) error
	reason string
}{
	{"deleted", (*fake.Provider).Remove, "instance gone from the cloud"},
	{"shut off", (*fake.Provider).Stop, "instance is SHUTOFF"},
	{"in error", (*fake.Provider).Break, "instance is ERROR"},
}

// seenStates follows a node's records from now on: every state it is
// written in, with its reason and allocation.
func (h *harness) seenStates(id string) func() []kv.Node {
	// Every write of the record, from the bucket's subjects: a cache (or
	// a watch) that lags skips the states in between, and the failed
	// state lasts only until the lifecycle deletes the node.
	var mu sync.Mutex
	var seen []kv.Node
	natstest.Writes(h.t, h.nc, kv.BucketNodes, id, func(_ string, value []byte, deleted bool) {
		var n kv.Node
		if deleted || json.Unmarshal(value, &n) != nil {
			return
		}
		mu.Lock()
		seen = append(seen, n)
		mu.Unlock()
	})
	return func() []kv.Node {
		mu.Lock()
		defer mu.Unlock()
		return append([]kv.Node(nil), seen...)
	}
}

// failedWith finds the write that failed a node.
func failedWith(seen []kv.Node) (kv.Node, bool) {
	for _, n := range seen {
		if n.State == kv.NodeFailed {
			return n, true
		}
	}
	return kv.Node{}, false
}

// readyFree lists the ready, unallocated nodes of a label.
func (h *harness) readyFree(label string) []kv.Node {
	var out []kv.Node
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.State == kv.NodeReady && e.Value.AllocatedTo == "" && e.Value.HasLabel(label) {
			out = append(out, e.Value)
		}
		return true
	})
	return out
}

// A ready node whose instance is deleted, shut off or in error out of band
// is failed with the reason, its instance (if any) deleted, and min-ready
// replaces it: nothing hands out the dead machine.
func TestDeadInstanceOfReadyNodeIsReplaced(t *testing.T) {
	t.Parallel()
	for _, d := range deaths {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, `
labels: [{name: small, min-ready: 1}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
			l := h.startLauncher("l1")
			cloud := l.Providers["c"].(*fake.Provider)
			h.until(10*time.Second, "a ready node", func() bool { return len(h.readyFree("small")) == 1 })
			dead := h.readyFree("small")[0]
			seen := h.seenStates(dead.ID)
			if err := d.kill(cloud, t.Context(), dead.ExternalID); err != nil {
				t.Fatal(err)
			}
			h.until(15*time.Second, "the dead node replaced and its instance deleted", func() bool {
				_, there := h.nodes.Get(dead.ID)
				_, inst := h.instances["c"].Get(dead.ExternalID)
				fresh := h.readyFree("small")
				return !there && !inst && len(fresh) == 1 && fresh[0].ID != dead.ID
			})
			n, ok := failedWith(seen())
			if !ok || n.Reason != d.reason {
				t.Errorf("the node was not failed with %q: %+v", d.reason, seen())
			}
			if got := l.Metrics().Registry().Sum("nodepool_dead_instances_total", "action=failed"); got != 1 {
				t.Errorf("dead instances counted: %v, want 1", got)
			}
			h.checkConsistent("c")
		})
	}
}

// gated holds the launches of one label until its gate opens.
type gated struct {
	drivers.Provider
	label string
	gate  chan struct{}
}

func (p *gated) Unwrap() drivers.Provider { return p.Provider }

func (p *gated) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	sm, err := p.Provider.Create(req, state)
	if err != nil || req.Label != p.label {
		return sm, err
	}
	return &gatedMachine{StateMachine: sm, gate: p.gate}, nil
}

type gatedMachine struct {
	drivers.StateMachine
	gate chan struct{}
}

func (m *gatedMachine) Advance(ctx context.Context) (drivers.Step, error) {
	select {
	case <-m.gate:
	case <-ctx.Done():
		return drivers.Step{}, ctx.Err()
	}
	return m.StateMachine.Advance(ctx)
}

// A ready node allocated to a pending request (its other node still
// booting) that dies fails over: the request gets another node and is
// fulfilled, never with the dead one, and does not fail.
func TestDeadInstanceOfAllocatedNodeFailsOver(t *testing.T) {
	t.Parallel()
	for _, d := range deaths[:2] {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, `
labels: [{name: small, min-ready: 1}, {name: slow}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small, slow]}]
`)
			gate := make(chan struct{})
			var cloud *fake.Provider
			h.wrap = func(_ string, p drivers.Provider) drivers.Provider {
				cloud = p.(*fake.Provider)
				return &gated{Provider: p, label: "slow", gate: gate}
			}
			l := h.startLauncher("l1")
			h.until(10*time.Second, "a ready node", func() bool { return len(h.readyFree("small")) == 1 })
			id := h.submit(events.RequestMessage{Labels: []string{"small", "slow"}, Requestor: "test"})
			var dead kv.Node
			h.until(10*time.Second, "a ready node allocated to the pending request", func() bool {
				r, ok := h.request(id)
				if !ok || r.State != kv.RequestPending || len(r.Nodes) != 2 {
					return false
				}
				n, there := h.nodes.Get(r.Nodes[0])
				dead = n.Value
				return there && n.Value.AllocatedTo == id && n.Value.State == kv.NodeReady
			})
			seen := h.seenStates(dead.ID)
			if err := d.kill(cloud, t.Context(), dead.ExternalID); err != nil {
				t.Fatal(err)
			}
			h.until(15*time.Second, "another node planned for the request", func() bool {
				r, _ := h.request(id)
				_, there := h.nodes.Get(dead.ID)
				return !there && r.State == kv.RequestPending && r.Nodes[0] != dead.ID && r.Nodes[0] != ""
			})
			close(gate)
			h.waitDone(20*time.Second, id)
			r, _ := h.request(id)
			if r.State != kv.RequestFulfilled {
				t.Fatalf("request %s: %s\n%s", r.State, r.Reason, h.dump())
			}
			for _, nid := range r.Nodes {
				n, ok := h.node(nid)
				if nid == dead.ID || !ok || n.State != kv.NodeReady || n.AllocatedTo != id {
					t.Errorf("request fulfilled with node %s (%s, allocated to %q)", nid, n.State, n.AllocatedTo)
				}
			}
			n, ok := failedWith(seen())
			if !ok || n.Reason != d.reason || n.AllocatedTo != "" {
				t.Errorf("the dead node was not failed with %q and freed: %+v", d.reason, seen())
			}
			if got := l.Metrics().Registry().Sum("nodepool_dead_instances_total", "action=failed"); got != 1 {
				t.Errorf("dead instances counted: %v, want 1", got)
			}
			h.checkConsistent("c")
		})
	}
}

// A node of a request already fulfilled (not taken yet) that dies is
// failed too, keeping its allocation: the request stays fulfilled (request
// states never go back), and its requestor's take is refused.
func TestDeadInstanceOfFulfilledRequestIsNotHandedOut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	l := h.startLauncher("l1")
	cloud := l.Providers["c"].(*fake.Provider)
	id := h.submit(events.RequestMessage{Labels: []string{"small"}, Requestor: "test"})
	h.waitDone(10*time.Second, id)
	r, _ := h.request(id)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request %s: %s", r.State, r.Reason)
	}
	dead, _ := h.node(r.Nodes[0])
	seen := h.seenStates(dead.ID)
	if err := cloud.Stop(t.Context(), dead.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the dead node failed", func() bool {
		_, ok := failedWith(seen())
		return ok
	})
	if n, _ := failedWith(seen()); n.AllocatedTo != id || n.Reason != "instance is SHUTOFF" {
		t.Errorf("failed node: allocated to %q, reason %q", n.AllocatedTo, n.Reason)
	}
	if _, err := h.client.Take(t.Context(), dead.ID, id, "me", nil); err == nil {
		t.Error("the dead node was taken")
	}
	if r, _ := h.request(id); r.State != kv.RequestFulfilled {
		t.Errorf("request is %s", r.State)
	}
	h.until(10*time.Second, "the dead node and its instance deleted", func() bool {
		_, there := h.nodes.Get(dead.ID)
		return !there && h.instanceCount("c") == 0
	})
}

// A node in use (or held) stays its holder's when its instance dies (as in
// Nodepool): its instance_down says what was seen, and is cleared when
// the instance runs again. Given back, it is deleted as usual.
func TestDeadInstanceOfNodeInUseIsToldToItsHolder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	l := h.startLauncher("l1")
	cloud := l.Providers["c"].(*fake.Provider)
	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"small"}, Requestor: "test"}, "me")
	if err != nil {
		t.Fatal(err)
	}
	used := nodes[0]
	told := func(want string) func() bool {
		return func() bool {
			e, ok := h.nodes.Get(used.ID)
			return ok && e.Value.State == kv.NodeInUse && e.Value.InstanceDown == want
		}
	}
	if err := cloud.Stop(t.Context(), used.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the holder told", told("instance is SHUTOFF"))
	if err := cloud.Start(t.Context(), used.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the note cleared", told(""))
	if err := cloud.Remove(t.Context(), used.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the holder told", told("instance gone from the cloud"))
	if err := h.client.Return(t.Context(), used.ID); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "the returned node deleted", func() bool { return h.nodes.Len() == 0 })
	// Counted after the write: looked at once the node is gone.
	if got := l.Metrics().Registry().Sum("nodepool_dead_instances_total", "action=told"); got != 2 {
		t.Errorf("told: %v, want 2", got)
	}
}

// A metastatic node is dead with its backing node: when the backing
// node's instance is shut off, the backing node (in use by the
// metastatic provider) is told, the carved ready nodes on it are failed
// and deleted, the backing node takes no new slot and is given back and
// deleted, and the next request is served on a new backing node.
func TestDeadBackingNodeTakesItsCarvedNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 60\n"))
	l := h.startLauncher("l1")
	cloud := l.Providers["cloud"].(*fake.Provider)
	id := h.submit(events.RequestMessage{Labels: []string{"small", "small"}, Requestor: "test"})
	h.waitDone(30*time.Second, id)
	r, _ := h.request(id)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request is %s: %s", r.State, r.Reason)
	}
	if err := h.client.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "two ready carved nodes", func() bool { return len(h.readyFree("small")) == 2 })
	backing := h.backings()
	if len(backing) != 1 {
		t.Fatalf("%d backing nodes", len(backing))
	}
	var bn kv.Node
	for _, n := range backing {
		bn = n
	}
	carved := r.Nodes
	seen := map[string]func() []kv.Node{bn.ID: h.seenStates(bn.ID)}
	for _, nid := range carved {
		seen[nid] = h.seenStates(nid)
	}
	if err := cloud.Stop(t.Context(), bn.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(20*time.Second, "the carved nodes and the backing node gone", func() bool {
		return h.nodes.Len() == 0 && h.instanceCount("cloud") == 0
	})
	told := false
	for _, n := range seen[bn.ID]() {
		told = told || n.InstanceDown == "instance is SHUTOFF"
	}
	if !told {
		t.Errorf("the backing node was not told: %+v", seen[bn.ID]())
	}
	for _, nid := range carved {
		n, ok := failedWith(seen[nid]())
		if !ok || !strings.Contains(n.Reason, "down with backing node "+bn.ID+" (instance is SHUTOFF)") {
			t.Errorf("carved node %s not failed with its backing node: %+v", nid, seen[nid]())
		}
	}
	id = h.submit(events.RequestMessage{Labels: []string{"small"}, Requestor: "test"})
	h.waitDone(30*time.Second, id)
	if r, _ := h.request(id); r.State != kv.RequestFulfilled {
		t.Fatalf("request is %s: %s", r.State, r.Reason)
	}
	for bid := range h.backings() {
		if bid == bn.ID {
			t.Error("the dead backing node took a new node")
		}
	}
}

// sweptListings signals each listing of a provider that the cleanup's
// cloud sweep makes (not the quota watcher's).
type sweptListings struct {
	drivers.Provider
	mu     sync.Mutex
	starts []time.Time
	c      chan struct{}
}

func (p *sweptListings) Unwrap() drivers.Provider { return p.Provider }

func (p *sweptListings) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for f, more := frames.Next(); ; f, more = frames.Next() {
		if strings.HasSuffix(f.Function, "consumers.(*cleanup).leaks") {
			p.mu.Lock()
			p.starts = append(p.starts, time.Now())
			p.mu.Unlock()
			select {
			case p.c <- struct{}{}:
			default:
			}
			break
		}
		if !more {
			break
		}
	}
	return p.Provider.ListInstances(ctx)
}

// since counts the listings that started after t.
func (p *sweptListings) since(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.starts {
		if s.After(t) {
			n++
		}
	}
	return n
}

// A static host is no instance of a cloud: its provider lists none
// (drivers.Liveness is not its), and its ready node is never judged dead
// by the sweeps that fail a cloud's dead nodes beside it.
func TestStaticNodesAreNotJudgedDead(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	h := newHarness(t, fmt.Sprintf(`
labels: [{name: static-a}, {name: small, min-ready: 1}]
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: %s
            connection-port: %d
            labels: [static-a]
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`, srv.Host, srv.Port))
	rack := &sweptListings{c: make(chan struct{}, 1)}
	var cloud *fake.Provider
	h.wrap = func(name string, p drivers.Provider) drivers.Provider {
		if name == "rack" {
			rack.Provider = p
			return rack
		}
		cloud = p.(*fake.Provider)
		return p
	}
	l := h.startLauncher("l1")
	static := staticNodeID(srv, "zuul", 0)
	h.until(10*time.Second, "the static node ready", func() bool {
		n, ok := h.nodes.Get(static)
		return ok && n.Value.State == kv.NodeReady
	})
	before, _ := h.node(static)
	// The sweeps do judge this launcher's cloud nodes.
	h.until(10*time.Second, "a ready cloud node", func() bool { return len(h.readyFree("small")) == 1 })
	dead := h.readyFree("small")[0]
	if err := cloud.Remove(t.Context(), dead.ExternalID); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the dead cloud node gone", func() bool {
		_, there := h.nodes.Get(dead.ID)
		return !there
	})
	// Two passes of the static provider's sweep that started well after
	// the static node was ready (a second past the margin a node must be
	// ready for before a listing judges it): the first has ended when the
	// second starts, and would have judged the static node.
	judgeable := before.StateTime.Add(3 * time.Second)
	waitfor.Until(t, 15*time.Second, "two passes of the static provider's sweep", func() bool { return rack.since(judgeable) >= 2 },
		waitfor.Wake(rack.c), waitfor.Detail(func() string { return fmt.Sprintf("%d passes", rack.since(judgeable)) }))
	after, ok := h.node(static)
	if !ok || after.State != kv.NodeReady || !after.StateTime.Equal(before.StateTime) || after.Reason != "" {
		t.Errorf("the static node was judged: %+v", after)
	}
	if got := l.Metrics().Registry().Sum("nodepool_dead_instances_total", "action=failed"); got != 1 {
		t.Errorf("dead instances counted: %v, want 1 (the cloud's)", got)
	}
}
