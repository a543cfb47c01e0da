package consumers_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers/metastatic"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// metaConfig is a fake cloud with "big" nodes and a metastatic provider
// carving "small" nodes out of them.
func metaConfig(bootDelay string, labelKeys string) string {
	return fmt.Sprintf(`
labels:
  - name: big
  - name: small
providers:
  - name: cloud
    driver: fake
    boot-delay: %s
    delete-delay: 0.3
    launch-retries: 1
    pools:
      - name: main
        max-servers: 10
        node-attributes: {zone: cloud, kind: big}
        labels: [big]
  - name: meta
    driver: metastatic
    rate: 1000 # the driver is wrapped by the rate limiter; its manager still runs
    pools:
      - name: main
        max-servers: 40
        node-attributes: {kind: small}
        labels:
          - name: small
            backing-label: big
%s`, bootDelay, labelKeys)
}

var metaOwner = metastatic.Requestor("meta")

func backingData(n *kv.Node) (metastatic.BackingData, bool) {
	var d metastatic.BackingData
	if n.Provider != "cloud" || json.Unmarshal(n.UserData, &d) != nil || d.Owner != metaOwner {
		return d, false
	}
	return d, true
}

func carvedData(n *kv.Node) metastatic.CarvedData {
	var d metastatic.CarvedData
	_ = json.Unmarshal(n.DriverData, &d)
	return d
}

// backings returns the backing nodes held by the metastatic provider.
func (h *harness) backings() map[string]kv.Node {
	out := map[string]kv.Node{}
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if _, ok := backingData(&e.Value); ok && e.Value.State == kv.NodeInUse && e.Value.Holder == metaOwner {
			out[e.Key] = e.Value
		}
		return true
	})
	return out
}

// slotMaps describes every node that has a slot map, held or not, for
// failure messages.
func (h *harness) slotMaps() string {
	var b strings.Builder
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if d, ok := backingData(&e.Value); ok {
			fmt.Fprintf(&b, "  %s rev %d %s holder=%q slots=%v\n", e.Key, e.Revision, e.Value.State, e.Value.Holder, d.Allocations)
		}
		return true
	})
	return b.String()
}

// requestSmall submits n requests for one small node each and returns them
// once all are fulfilled, taken and deleted, with their node.
func (h *harness) requestSmall(n int) []string {
	h.t.Helper()
	var ids []string
	for range n {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}, Requestor: "test"}))
	}
	h.waitDone(30*time.Second, ids...)
	var nodes []string
	for _, id := range ids {
		r, _ := h.request(id)
		if r.State != kv.RequestFulfilled {
			h.t.Fatalf("request %s is %s (%s)\n%s", id, r.State, r.Reason, h.dump())
		}
		h.takeAll(id)
		nodes = append(nodes, r.Nodes[0])
	}
	return nodes
}

// checkCarved checks that every carved node has a slot of its own, that the
// slot maps of the backing nodes say the same, and that each carved node
// carries its backing node's connection details. It returns the backing
// node of each carved node.
func (h *harness) checkCarved() map[string]string {
	h.t.Helper()
	failed := h.t.Failed()
	defer func() {
		if !failed && h.t.Failed() {
			h.t.Logf("backing nodes:\n%s%s", h.slotMaps(), h.dump())
		}
	}()
	backings := h.backings()
	owner := map[string]string{} // carved node -> "backing/slot"
	for bid, bn := range backings {
		d, _ := backingData(&bn)
		for slot, id := range d.Allocations {
			if id == "" {
				continue
			}
			if prev, dup := owner[id]; dup {
				h.t.Errorf("carved node %s has two slots: %s and %s/%d", id, prev, bid, slot)
			}
			owner[id] = fmt.Sprintf("%s/%d", bid, slot)
		}
	}
	backingOf := map[string]string{}
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := e.Value
		if n.Provider != "meta" || n.State == kv.NodeBuilding {
			return true
		}
		d := carvedData(&n)
		where := fmt.Sprintf("%s/%d", d.BackingNode, d.Slot)
		if owner[n.ID] != where {
			h.t.Errorf("carved node %s (%s) says it is in slot %s; the slot maps say %q", n.ID, n.State, where, owner[n.ID])
		}
		bn := backings[d.BackingNode]
		if n.InterfaceIP == "" || n.InterfaceIP != bn.InterfaceIP || n.Username != bn.Username || n.ConnectionPort != bn.ConnectionPort || n.ConnectionType != bn.ConnectionType {
			h.t.Errorf("carved node %s connection %s@%s:%d, backing node %s has %s@%s:%d", n.ID, n.Username, n.InterfaceIP, n.ConnectionPort, d.BackingNode, bn.Username, bn.InterfaceIP, bn.ConnectionPort)
		}
		backingOf[n.ID] = d.BackingNode
		return true
	})
	return backingOf
}

// The scenario: 3 requests make one backing node with 8 slots, 5
// more go to the same one, a restart changes nothing, 1 more makes a second
// backing node, and once all are returned both backing nodes go back after
// the grace time and their instances are deleted.
func TestMetastaticCarvesBackingNodes(t *testing.T) {
	t.Parallel()
	const grace = 1500 * time.Millisecond
	h := newHarness(t, metaConfig("0.2", "            max-parallel-jobs: 8\n            grace-time: 1.5\n"))
	l1 := h.startLauncher("l1")

	first := h.requestSmall(3)
	if got := h.instancesEverCreated("cloud"); got != 1 {
		t.Fatalf("%d backing instances created for 3 nodes of 8 slots\n%s", got, h.dump())
	}
	backings := h.backings()
	if len(backings) != 1 {
		t.Fatalf("%d backing nodes, want 1\n%s", len(backings), h.dump())
	}
	var backingA string
	for id, bn := range backings {
		backingA = id
		d, _ := backingData(&bn)
		if d.Slots != 8 || d.Used() != 3 || d.Label != "small" || d.Pool != "main" || bn.Holder != metaOwner {
			t.Errorf("backing node %s: %+v", id, d)
		}
	}
	for _, id := range first {
		n, _ := h.node(id)
		if n.State != kv.NodeInUse || carvedData(&n).BackingNode != backingA {
			t.Errorf("carved node %s = %s on %q", id, n.State, carvedData(&n).BackingNode)
		}
		// The backing node's attributes are the defaults; the pool's win.
		// How to reach it is the backing node's.
		if want := map[string]string{"zone": "cloud", "kind": "small"}; !maps.Equal(n.Attributes, want) ||
			n.Username != "zuul" || n.PythonPath != "auto" || n.ShellType != "sh" {
			t.Errorf("carved node %s: attributes %v, username %q, python_path %q, shell_type %q", id, n.Attributes, n.Username, n.PythonPath, n.ShellType)
		}
	}
	h.checkCarved()

	second := h.requestSmall(5)
	if got := h.instancesEverCreated("cloud"); got != 1 {
		t.Fatalf("%d backing instances created for 8 nodes of 8 slots", got)
	}
	if d, _ := backingData(ptr(h.backings()[backingA])); d.Used() != 8 {
		t.Fatalf("backing node %s has %d slots used, want 8\n%s", backingA, d.Used(), h.dump())
	}
	before := h.backings()[backingA]

	// A restart in the middle: another process carries on from the
	// records.
	l1.Stop()
	h.startLauncher("l2")
	third := h.requestSmall(1)
	if got := h.instancesEverCreated("cloud"); got != 2 {
		t.Fatalf("%d backing instances created for 9 nodes, want 2\n%s", got, h.dump())
	}
	backingOf := h.checkCarved()
	if backingOf[third[0]] == backingA {
		t.Errorf("the ninth node went to the full backing node %s", backingA)
	}
	after, _ := backingData(ptr(h.backings()[backingA]))
	beforeData, _ := backingData(&before)
	if !slices.Equal(after.Allocations, beforeData.Allocations) {
		t.Errorf("slot map of %s changed across the restart: %v, then %v", backingA, beforeData.Allocations, after.Allocations)
	}
	if len(h.backings()) != 2 {
		t.Fatalf("%d backing nodes, want 2", len(h.backings()))
	}

	// Give everything back; watch the backing nodes go.
	released := h.watchReleases()
	for _, id := range slices.Concat(first, second, third) {
		if err := h.client.Return(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	h.until(30*time.Second, "every node, request and instance gone", func() bool {
		return h.nodes.Len() == 0 && h.requests.Len() == 0 && h.instanceCount("cloud") == 0
	})
	got := released()
	if len(got) != 2 {
		t.Fatalf("saw %d backing nodes given back, want 2: %v", len(got), got)
	}
	for id, d := range got {
		if d.IdleSince == nil || d.Released.Sub(*d.IdleSince) < grace {
			t.Errorf("backing node %s given back %v after its last slot was freed (idle since %v); grace-time is %s", id, d.Released, d.IdleSince, grace)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// release is a backing node given back: its slot map, and when its record
// was made (the node launched).
type release struct {
	metastatic.BackingData
	created time.Time
}

// watchReleases records the slot maps of backing nodes given back from now
// on (from every write to the nodes bucket: a cache may skip versions); the
// function returned gives them, by backing node.
func (h *harness) watchReleases() func() map[string]release {
	var mu sync.Mutex
	out := map[string]release{}
	natstest.Puts(h.t, h.nc, kv.BucketNodes, ">", func(key string, n kv.Node) {
		if d, ok := backingData(&n); ok && d.Released != nil {
			mu.Lock()
			out[key] = release{BackingData: d, created: n.Created}
			mu.Unlock()
		}
	})
	return func() map[string]release {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(out)
	}
}

// A launcher stopped while the backing node boots leaves nothing behind for
// the next one to redo: one backing node, taken once, serving every node
// that waited.
func TestMetastaticRestartWhileBackingNodeBoots(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("1", "            max-parallel-jobs: 4\n"))
	l1 := h.startLauncher("l1")
	var ids []string
	for range 3 {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}}))
	}
	h.until(10*time.Second, "a backing request waiting for all three nodes while its node boots", func() bool {
		found := false
		h.requests.Range(func(e *kv.Entry[kv.Request]) bool {
			var d metastatic.RequestData
			if e.Value.Requestor == metaOwner && e.Value.State == kv.RequestPending && json.Unmarshal(e.Value.RequestorData, &d) == nil && len(d.Nodes) == 3 {
				found = true
			}
			return !found
		})
		return found
	})
	l1.Stop()
	h.startLauncher("l2")
	h.waitDone(30*time.Second, ids...)
	for _, id := range ids {
		if r, _ := h.request(id); r.State != kv.RequestFulfilled {
			t.Errorf("request %s = %s (%s)", id, r.State, r.Reason)
		}
	}
	if got := h.instancesEverCreated("cloud"); got != 1 {
		t.Errorf("%d backing instances created, want 1\n%s", got, h.dump())
	}
	if b := h.backings(); len(b) != 1 {
		t.Errorf("%d backing nodes, want 1\n%s", len(b), h.dump())
	}
	h.checkCarved()
	h.until(10*time.Second, "the backing request deleted once its node was taken", func() bool {
		n := 0
		h.requests.Range(func(e *kv.Entry[kv.Request]) bool {
			if e.Value.Requestor == metaOwner {
				n++
			}
			return true
		})
		return n == 0
	})
}

// A backing request that fails fails the requests waiting on it, with its
// reason, at once (no further attempts), and leaves nothing behind.
func TestMetastaticBackingRequestFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, strings.Replace(metaConfig("0.05", "            max-parallel-jobs: 4\n"), "    launch-retries: 1\n", "    launch-retries: 1\n    failure-rate: 1\n", 1))
	h.startLauncher("l1")
	a := h.submit(events.RequestMessage{Labels: []string{"small"}})
	b := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(20*time.Second, a, b)
	for _, id := range []string{a, b} {
		r, _ := h.request(id)
		if r.State != kv.RequestFailed || !strings.Contains(r.Reason, "backing request metastatic-") || !strings.Contains(r.Reason, "went to ERROR") ||
			!strings.Contains(r.Reason, "after 1 attempt") {
			t.Errorf("request %s = %s (%s); want failed naming the backing request and its reason, after one attempt", id, r.State, r.Reason)
		}
	}
	for _, id := range []string{a, b} {
		if err := h.client.DeleteRequest(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	h.until(20*time.Second, "no node, request or instance left", func() bool {
		return h.nodes.Len() == 0 && h.requests.Len() == 0 && h.instanceCount("cloud") == 0
	})
}

// A backing node past max-age takes no new slots and goes back as soon as
// it is empty, grace-time or not; one within min-retention-time stays even
// when idle past its grace-time. The launcher and its metastatic manager go
// by a fake clock: a backing node grows old only when the test moves it,
// however long a busy machine takes to serve the requests.
func TestMetastaticMaxAgeAndMinRetention(t *testing.T) {
	t.Parallel()
	t.Run("max-age", func(t *testing.T) {
		t.Parallel()
		h, clk := newFakeClockHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 600\n            max-age: 1\n"))
		h.recordLog()
		h.startLauncher("l1")
		first := h.requestSmall(1)
		var backingA string
		for id := range h.backings() {
			backingA = id
		}
		a, _ := h.node(backingA)
		if age := clk.Since(a.Created); age >= time.Second {
			t.Fatalf("backing node %s is %s old on the fake clock before the test moved it", backingA, age)
		}
		if got := h.instancesEverCreated("cloud"); got != 1 {
			t.Fatalf("%d backing instances for one node, want 1\n%s", got, h.dump())
		}
		clk.Set(a.Created.Add(1100 * time.Millisecond))
		second := h.requestSmall(1)
		backingOf := h.checkCarved()
		if backingOf[second[0]] == backingA || h.instancesEverCreated("cloud") != 2 {
			t.Fatalf("a node past max-age took a new slot (%s on %s)\n%s", second[0], backingOf[second[0]], h.dump())
		}
		if err := h.client.Return(t.Context(), first[0]); err != nil {
			t.Fatal(err)
		}
		h.until(10*time.Second, "the old backing node given back and deleted", func() bool {
			_, still := h.nodes.Get(backingA)
			return !still
		})
		if len(h.backings()) != 1 {
			t.Errorf("%d backing nodes, want the one in use", len(h.backings()))
		}
	})
	t.Run("min-retention-time", func(t *testing.T) {
		t.Parallel()
		const retention = 2 * time.Second
		h, clk := newFakeClockHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 0\n            min-retention-time: 2\n"))
		h.startLauncher("l1")
		released := h.watchReleases()
		nodes := h.requestSmall(1)
		if err := h.client.Return(t.Context(), nodes[0]); err != nil {
			t.Fatal(err)
		}
		// The clock moves a sync interval at a time (each a pass of the
		// manager) until the idle backing node goes back.
		h.untilSwept(clk, 15*time.Second, "the backing node given back", func() bool { return len(released()) == 1 })
		// Nodepool counts min-retention-time from the backing node's
		// launch (its record's creation), not from when the driver took
		// it.
		for id, d := range released() {
			if age := d.Released.Sub(d.created); age < retention {
				t.Errorf("backing node %s given back %s after it was launched; min-retention-time is %s", id, age, retention)
			}
		}
	})
}

// Two launchers serve one metastatic pool: every node gets a slot of its
// own, never one that another node has, and no more backing nodes are
// requested than the nodes need.
func TestMetastaticTwoLaunchersNeverShareASlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.3", "            max-parallel-jobs: 4\n            grace-time: 600\n"))
	h.recordLog() // a failure prints which manager requested what
	h.startLauncher("l1")
	h.startLauncher("l2")
	nodes := h.requestSmall(12)
	backingOf := h.checkCarved()
	if got := len(h.backings()); got != 3 {
		t.Errorf("%d backing nodes for 12 nodes of 4 slots, want 3\n%s", got, h.dump())
	}
	perBacking := map[string]int{}
	for _, id := range nodes {
		perBacking[backingOf[id]]++
	}
	for b, n := range perBacking {
		if n > 4 {
			t.Errorf("backing node %s carries %d nodes in 4 slots", b, n)
		}
	}
	// Half go back, twice as many come: the freed slots are used first.
	for _, id := range nodes[:6] {
		if err := h.client.Return(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	h.until(10*time.Second, "the returned nodes deleted", func() bool {
		for _, id := range nodes[:6] {
			if h.nodes.Has(id) {
				return false
			}
		}
		return true
	})
	more := h.requestSmall(10)
	h.checkCarved()
	if got := len(h.backings()); got != 4 {
		t.Errorf("%d backing nodes for 16 nodes of 4 slots, want 4\n%s", got, h.dump())
	}
	if got := h.instancesEverCreated("cloud"); got != 4 {
		t.Errorf("%d backing instances created, want 4", got)
	}
	_ = more
}

// A slot whose carved node record vanished (deleted by hand, say) is found
// by cleanup as a leaked instance and freed; the backing node then goes
// back as usual. Nothing is leaked.
func TestMetastaticFreesSlotsOfVanishedNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 0.5\n"))
	h.startLauncher("l1")
	nodes := h.requestSmall(2)
	var bid string
	for id := range h.backings() {
		bid = id
	}
	e, err := h.b.Nodes.Get(t.Context(), nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := h.b.Nodes.Delete(t.Context(), nodes[0], e.Revision); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "the slot of the vanished node freed", func() bool {
		bn, ok := h.nodes.Get(bid)
		d, _ := backingData(&bn.Value)
		return ok && d.Used() == 1 && !slices.Contains(d.Allocations, nodes[0])
	})
	if err := h.client.Return(t.Context(), nodes[1]); err != nil {
		t.Fatal(err)
	}
	h.until(15*time.Second, "every node, request and instance gone", func() bool {
		return h.nodes.Len() == 0 && h.requests.Len() == 0 && h.instanceCount("cloud") == 0
	})
}

// A backing node an operator deletes takes its ready carved nodes with it;
// nothing is handed out on a machine that is gone, and nothing is left.
func TestMetastaticDropsCarvedNodesOfADeletedBackingNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 60\n"))
	h.startLauncher("l1")
	id := h.submit(events.RequestMessage{Labels: []string{"small", "small"}, Requestor: "test"})
	h.waitDone(30*time.Second, id)
	r, _ := h.request(id)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request is %s: %s", r.State, r.Reason)
	}
	// Not taken: the carved nodes go back to the pool, ready.
	if err := h.client.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "two ready carved nodes", func() bool {
		return h.countNodes(func(n *kv.Node) bool {
			return n.Provider == "meta" && n.State == kv.NodeReady && n.AllocatedTo == ""
		}) == 2
	})
	backing := h.backings()
	if len(backing) != 1 {
		t.Fatalf("%d backing nodes", len(backing))
	}
	for bid := range backing {
		if err := h.client.DeleteNode(t.Context(), bid); err != nil {
			t.Fatal(err)
		}
	}
	h.until(20*time.Second, "carved nodes and backing node gone", func() bool {
		return h.nodes.Len() == 0 && h.instanceCount("cloud") == 0
	})
}

// Requests for a metastatic label published at once share backing nodes:
// nodes that start waiting while a backing node is requested, booting or
// just taken get its free slots, so a burst needs no more backing nodes
// than its nodes fill (issue 9: three at once on an 8-slot label used two).
func TestMetastaticBurstSharesBackingNodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		bootDelay string
		requests  int
		want      int
	}{
		{"three at once, instant boot", "0", 3, 1},
		{"three at once, slow boot", "0.5", 3, 1},
		{"twenty at once, instant boot", "0", 20, 3},
		{"twenty at once, slow boot", "0.5", 20, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, metaConfig(tc.bootDelay, "            max-parallel-jobs: 8\n            grace-time: 600\n"))
			h.recordLog()
			h.startLauncher("l1")
			h.waitLaunchers(1)
			ids := make([]string, tc.requests)
			errs := make([]error, tc.requests)
			var wg sync.WaitGroup
			for i := range tc.requests {
				wg.Go(func() {
					ids[i], errs[i] = h.client.Submit(t.Context(), events.RequestMessage{Labels: []string{"small"}, Requestor: "test"})
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			h.waitDone(30*time.Second, ids...)
			for _, id := range ids {
				if r, _ := h.request(id); r.State != kv.RequestFulfilled {
					t.Fatalf("request %s is %s (%s)\n%s", id, r.State, r.Reason, h.dump())
				}
			}
			if got := h.instancesEverCreated("cloud"); got != tc.want {
				t.Errorf("%d backing instances created for %d nodes of 8 slots, want %d\n%s", got, tc.requests, tc.want, h.dump())
			}
			h.checkCarved()
		})
	}
}

// A request that claims to be a metastatic provider's backing request but
// whose requestor_data is not valid (issue 9: {"slots": -1} crashed every
// launcher that took it over) is failed with a reason naming what is wrong;
// the launcher keeps serving, and nothing is held for it.
func TestMetastaticRefusesBadBackingRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 600\n"))
	h.startLauncher("l1")
	cases := []struct {
		id, data, want string
	}{
		{"neg-slots", `{"slots": -1}`, "slots is -1; expected 1 to 10000"},
		{"neg-slots-ours", `{"provider": "meta", "pool": "main", "label": "small", "slots": -1}`, "slots is -1"},
		{"huge-slots", `{"provider": "meta", "slots": 1000000000000}`, "slots is 1000000000000"},
		{"twice", `{"provider": "meta", "slots": 4, "nodes": ["a", "a"]}`, "node a is listed twice"},
		{"too-many", `{"provider": "meta", "slots": 1, "nodes": ["a", "b"]}`, "nodes lists 2 nodes; expected at most one per slot (1)"},
		{"bad-id", `{"provider": "meta", "slots": 2, "nodes": ["../x"]}`, `nodes[0] is "../x"; expected a node id`},
		{"other", `{"provider": "elsewhere", "slots": 2}`, `names provider "elsewhere"; expected "meta"`},
		{"not-object", `"slots"`, "expected a JSON object"}, // refused at intake
		{"wrong-type", `{"provider": "meta", "slots": "eight"}`, "not valid JSON for it"},
	}
	for _, tc := range cases {
		h.publishRaw(fmt.Sprintf(`{"id": %q, "labels": ["big"], "requestor": %q, "requestor_data": %s}`, tc.id, metaOwner, tc.data))
	}
	// The launcher still serves: a real request goes through the same
	// manager.
	good := h.requestSmall(1)
	for _, tc := range cases {
		h.waitDone(20*time.Second, tc.id)
		r, _ := h.request(tc.id)
		if r.State != kv.RequestFailed || !strings.Contains(r.Reason, "requestor_data") || !strings.Contains(r.Reason, tc.want) {
			t.Errorf("request %s = %s (%q); want failed naming %q", tc.id, r.State, r.Reason, tc.want)
		}
	}
	// Only the good request's backing node is held; the crafted requests'
	// nodes went back to their pool.
	h.until(10*time.Second, "crafted requests' nodes back in the pool", func() bool {
		return len(h.backings()) == 1 && h.countNodes(func(n *kv.Node) bool {
			return n.Provider == "cloud" && n.AllocatedTo != "" && n.State != kv.NodeInUse
		}) == 0
	})
	if n := h.countNodes(func(n *kv.Node) bool { return n.Holder == metaOwner }); n != 1 {
		t.Errorf("%d nodes held by %s, want the one backing node\n%s", n, metaOwner, h.dump())
	}
	h.checkCarved()
	_ = good
}

// Labels of a metastatic provider with the same backing-label share
// backing nodes, in one pool or across pools, as in Nodepool (issue 10).
func TestMetastaticLabelsShareBackingNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: big
  - name: small
  - name: medium
  - name: tiny
providers:
  - name: cloud
    driver: fake
    boot-delay: 0.2
    pools:
      - name: main
        max-servers: 10
        labels: [big]
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 4
            grace-time: 600
          - name: medium
            backing-label: big
            max-parallel-jobs: 4
            grace-time: 600
      - name: other
        labels:
          - name: tiny
            backing-label: big
            max-parallel-jobs: 4
            grace-time: 600
`)
	h.recordLog()
	h.startLauncher("l1")
	var ids []string
	for _, label := range []string{"small", "medium", "tiny", "medium"} {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{label}, Requestor: "test"}))
	}
	h.waitDone(30*time.Second, ids...)
	for _, id := range ids {
		if r, _ := h.request(id); r.State != kv.RequestFulfilled {
			t.Fatalf("request %s is %s (%s)\n%s", id, r.State, r.Reason, h.dump())
		}
	}
	if got := h.instancesEverCreated("cloud"); got != 1 {
		t.Fatalf("%d backing instances for 4 nodes of 3 labels sharing backing label big (4 slots), want 1\n%s", got, h.dump())
	}
	h.until(10*time.Second, "four carved nodes ready", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.Provider == "meta" && n.State == kv.NodeReady }) == 4
	})
	h.checkCarved()
	// The fifth node needs a second backing node.
	id := h.submit(events.RequestMessage{Labels: []string{"small"}, Requestor: "test"})
	h.waitDone(30*time.Second, id)
	if got := h.instancesEverCreated("cloud"); got != 2 {
		t.Errorf("%d backing instances for 5 nodes of 4 slots, want 2\n%s", got, h.dump())
	}
	h.checkCarved()
}
