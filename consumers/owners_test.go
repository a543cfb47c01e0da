package consumers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// Every node that needs a launcher's work and has none is taken up, even
// when it was written while no launcher ran (an operator's delete during
// a launch, a launch failed just before a crash, a node given back): a
// launcher that starts asks for the work of every such node, and each
// ends deleted with its instance, or launched.
func TestUnownedNodesAreTakenUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    delete-delay: 0.1
    pools: [{name: p, labels: [small]}]
`)
	now := time.Now().UTC()
	instances := 0
	instance := func(node string) string {
		instances++
		rec := fake.InstanceRecord{ID: fmt.Sprintf("i-%016x", instances), Name: "np" + node, Created: now, ReadyAt: now, IPv4: "10.0.0.1",
			Tags: map[string]string{drivers.TagProvider: "c", drivers.TagPool: "p", drivers.TagNode: node, drivers.TagLabel: "small"}}
		if _, err := h.instances["c"].Create(t.Context(), rec.ID, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.ID
	}
	cases := []struct {
		id       string
		state    kv.NodeState
		launcher string
		recorded bool // the record names its instance
	}{
		{"deleted-booting", kv.NodeDeleting, "", false}, // deleted by an operator during an idempotent create
		{"deleted", kv.NodeDeleting, "", true},
		{"failed", kv.NodeFailed, "dead-launcher", true}, // failed just before its launcher died
		{"used", kv.NodeUsed, "dead-launcher", true},
		{"aborted", kv.NodeAborted, "", true},
		{"building", kv.NodeBuilding, "", false},
	}
	for _, c := range cases {
		n := &kv.Node{ID: c.id, State: c.state, Labels: []string{"small"}, Provider: "c", Pool: "p", Launcher: c.launcher,
			Attempt: 1, Created: now, StateTime: now}
		if c.state != kv.NodeBuilding {
			ext := instance(c.id)
			if c.recorded {
				n.ExternalID = ext
			}
		}
		if _, err := h.b.Nodes.Create(t.Context(), n.ID, n); err != nil {
			t.Fatal(err)
		}
	}
	h.startLauncher("l1")
	h.until(30*time.Second, "every unowned node deleted with its instance, the building one launched", func() bool {
		if h.nodes.Len() != 1 || h.instanceCount("c") != 1 {
			return false
		}
		n, ok := h.nodes.Get("building")
		return ok && n.Value.State == kv.NodeReady
	})
	h.checkConsistent("c")
}

// A launcher cut off from NATS for longer than its lease stops driving its
// machines before another launcher takes them over, and once back never
// touches the instance the new owner drives: one instance is made for the
// attempt, and the node ends ready on it.
func TestFencedLauncherLeavesItsMachines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 6
    pools: [{name: p, labels: [small]}]
`)
	proxy := natstest.StartProxy(t, h.srv)
	h.startLauncherVia("l1", h.cfg, proxy.URL())
	h.waitLaunchers(1)
	id := h.submit(events.RequestMessage{Labels: []string{"small"}})
	var node string
	h.until(20*time.Second, "the node booting under l1 with its instance", func() bool {
		r, ok := h.request(id)
		if !ok || len(r.Nodes) != 1 {
			return false
		}
		node = r.Nodes[0]
		n, ok := h.nodes.Get(node)
		return ok && n.Value.State == kv.NodeBuilding && n.Value.Launcher == "l1" && h.instanceCount("c") == 1
	})
	h.startLauncher("l2")
	h.waitLaunchers(2)
	proxy.Cut()
	h.until(20*time.Second, "l2 driving the node", func() bool {
		n, ok := h.nodes.Get(node)
		return ok && n.Value.Launcher == "l2"
	})
	proxy.Restore()
	h.until(20*time.Second, "l1 back", func() bool { return h.components.Has("l1") })
	h.waitDone(20*time.Second, id)
	if r, _ := h.request(id); r.State != kv.RequestFulfilled {
		t.Fatalf("request %s: %s", r.State, r.Reason)
	}
	n, _ := h.node(node)
	if _, ok := h.instances["c"].Get(n.ExternalID); n.State != kv.NodeReady || !ok {
		t.Errorf("node %s is %s on instance %q (exists: %v)", node, n.State, n.ExternalID, ok)
	}
	if got := h.instancesEverCreated("c"); got != 1 {
		t.Errorf("%d instances created for one attempt", got)
	}
}

// A launcher whose heartbeats land but are answered late (a loaded
// cluster, here through a proxy that delays what the server sends by more
// than half the heartbeat's period) is alive to every other process,
// which leave its nodes to it: it must not fence itself for as long as
// that lasts. A heartbeat waits for its answer until the process would
// fence itself, and writes once; the launcher goes on launching.
func TestLateHeartbeatAnswersDoNotFence(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	rec := h.recordLog()
	proxy := natstest.StartProxy(t, h.srv)
	h.startLauncherVia("l1", h.cfg, proxy.URL())
	h.waitLaunchers(1)
	// Heartbeats every quarter of the TTL (500 ms), fenced after two
	// thirds (1.33 s): 300 ms on each answer makes a heartbeat that reads
	// before it writes miss its period, as they did before heartbeats
	// wrote once. (Much more and the leases, renewed every 500 ms from
	// when they were taken, step down: a lease taken with its answer D
	// late is renewed with an answer 2D+500 ms after it was sent, which
	// at 400 ms left 33 ms to spare and failed 7 of 10 runs under load.)
	proxy.Delay(300 * time.Millisecond)
	l1, ok := h.components.Get("l1")
	if !ok {
		t.Fatal("no heartbeat record of l1")
	}
	h.until(20*time.Second, "three heartbeats written through the delay", func() bool {
		e, ok := h.components.Get("l1")
		return ok && e.Revision > l1.Revision+2
	})
	id := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(30*time.Second, id)
	if r, _ := h.request(id); r.State != kv.RequestFulfilled {
		t.Fatalf("request %s: %s (%s)", id, r.State, r.Reason)
	}
	if got := rec.Lines("stopping every machine"); len(got) > 0 {
		t.Errorf("the launcher fenced itself while its heartbeats landed: %q", got)
	}
	proxy.Delay(0)
}
