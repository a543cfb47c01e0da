package consumers_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// takeAll takes every node of a fulfilled request and deletes the request,
// as a requestor does; it returns the nodes.
func (h *harness) takeAll(id string) []string {
	h.t.Helper()
	r, ok := h.request(id)
	if !ok || r.State != kv.RequestFulfilled {
		h.t.Fatalf("request %s is not fulfilled: %+v", id, r)
	}
	for _, nid := range r.Nodes {
		if _, err := h.client.Take(h.t.Context(), nid, id, "tester", nil); err != nil {
			h.t.Fatal(err)
		}
	}
	if err := h.client.DeleteRequest(h.t.Context(), id); err != nil {
		h.t.Fatal(err)
	}
	return r.Nodes
}

func (h *harness) returnNodes(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		if err := h.client.Return(h.t.Context(), id); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *harness) state(id string) kv.RequestState {
	r, _ := h.request(id)
	return r.State
}

func intp(i int) *int { return &i }

// Quota in every dimension: a request that does not fit waits in its
// place, and is served as soon as a node is given back.
func TestQuotaLimits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		yaml     string
		tenant   string
		others   int // foreign instances in the cloud
		fitting  int // of 3 single-node requests, how many fit at first
		otherTen bool
	}{
		{name: "max-servers", fitting: 2, yaml: `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, max-servers: 2, labels: [small]}]
`},
		{name: "max-cores", fitting: 2, yaml: `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    flavors: [{name: f, cores: 4, ram: 1024}]
    pools: [{name: p, max-cores: 9, labels: [{name: small, flavor-name: f}]}]
`},
		{name: "max-ram", fitting: 1, yaml: `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    flavors: [{name: f, cores: 1, ram: 4096}]
    pools: [{name: p, max-ram: 6000, labels: [{name: small, flavor-name: f}]}]
`},
		{name: "provider quota with instances that are not ours", others: 2, fitting: 1, yaml: `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    quota: {instances: 3}
    pools: [{name: p, labels: [small]}]
`},
		{name: "tenant limit, other tenants go on", tenant: "t1", fitting: 1, otherTen: true, yaml: `
labels: [{name: small}]
tenant-resource-limits: [{tenant-name: t1, max-servers: 1}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, c.yaml)
			l := h.startLauncher("l1")
			for i := range c.others {
				if _, err := l.Providers["c"].(*fake.Provider).Inject(t.Context(), fmt.Sprintf("theirs-%d", i), nil, 1, 512); err != nil {
					t.Fatal(err)
				}
			}
			// Let the scheduler see the cloud's quota before requests come.
			h.until(10*time.Second, "instances listed", func() bool { return h.instanceCount("c") == c.others })
			var ids []string
			for range 3 {
				ids = append(ids, h.submitRecorded(events.RequestMessage{Labels: []string{"small"}, Tenant: c.tenant}))
			}
			h.waitDone(10*time.Second, ids[:c.fitting]...)
			if c.otherTen {
				other := h.submit(events.RequestMessage{Labels: []string{"small"}, Tenant: "t2"})
				h.waitDone(10*time.Second, other)
				if h.state(other) != kv.RequestFulfilled {
					t.Errorf("another tenant's request is %s, want fulfilled", h.state(other))
				}
			}
			for _, id := range ids[c.fitting:] {
				if st := h.state(id); st != kv.RequestRequested {
					t.Fatalf("request %s is %s, want it waiting (requested)", id, st)
				}
			}
			// Give one node back: the first waiting request is served.
			nodes := h.takeAll(ids[0])
			h.returnNodes(nodes...)
			h.waitDone(10*time.Second, ids[c.fitting])
			if st := h.state(ids[c.fitting]); st != kv.RequestFulfilled {
				t.Errorf("waiting request ended %s, want fulfilled", st)
			}
		})
	}
}

// A request that can never fit the pool is declined at once.
func TestNeverFittingRequestsFail(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		yaml   string
		labels []string
		tenant string
		reason string
	}{
		{"label bigger than the pool", `
labels: [{name: huge}, {name: small}]
providers:
  - name: c
    driver: fake
    flavors: [{name: xl, cores: 16}, {name: s, cores: 1}]
    pools: [{name: p, max-cores: 8, labels: [{name: huge, flavor-name: xl}, {name: small, flavor-name: s}]}]
`, []string{"huge"}, "", "needs more than the pool's whole quota (16 cores, limit 8)"},
		{"more nodes than max-servers", `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, max-servers: 2, labels: [small]}]
`, []string{"small", "small", "small"}, "", "3 servers, limit 2"},
		{"more than the cloud's quota", `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    quota: {instances: 1}
    pools: [{name: p, labels: [small]}]
`, []string{"small", "small"}, "", "needs more than the provider's whole quota"},
		{"more than the tenant may hold", `
labels: [{name: small}]
tenant-resource-limits: [{tenant-name: t1, max-servers: 1}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`, []string{"small", "small"}, "t1", "needs more than tenant t1 may ever hold"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, c.yaml)
			h.startLauncher("l1")
			id := h.submit(events.RequestMessage{Labels: c.labels, Tenant: c.tenant})
			h.waitDone(10*time.Second, id)
			r, _ := h.request(id)
			if r.State != kv.RequestFailed || !strings.Contains(r.Reason, c.reason) {
				t.Errorf("request = %s %q, want failed with %q", r.State, r.Reason, c.reason)
			}
			if h.nodes.Len() != 0 {
				t.Errorf("%d nodes launched for a request that cannot fit", h.nodes.Len())
			}
		})
	}
}

// Waiting requests are served by priority, then relative priority (which a
// requestor may change while the request waits), then submission.
func TestWaitingRequestsAreServedInPriorityOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, smallPoolOfOne)
	h.startLauncher("l1")
	first := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(10*time.Second, first)
	held := h.takeAll(first)

	late := h.submit(events.RequestMessage{ID: "late", Labels: []string{"small"}})
	low := h.submit(events.RequestMessage{ID: "low", Labels: []string{"small"}, Priority: intp(200)})
	high := h.submit(events.RequestMessage{ID: "high", Labels: []string{"small"}, Priority: intp(50)})
	bumped := h.submit(events.RequestMessage{ID: "bumped", Labels: []string{"small"}})
	h.until(5*time.Second, "all recorded", func() bool {
		for _, id := range []string{late, low, high, bumped} {
			if _, ok := h.request(id); !ok {
				return false
			}
		}
		return true
	})
	// A requestor moves "bumped" ahead of "late" with a revision-checked
	// update of relative_priority.
	if _, err := h.b.Requests.Modify(t.Context(), bumped, func(r *kv.Request) error {
		r.RelativePriority = -1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.until(5*time.Second, "relative priority seen", func() bool {
		r, _ := h.request(bumped)
		return r.RelativePriority == -1
	})
	var order []string
	for range 4 {
		h.returnNodes(held...)
		h.until(10*time.Second, "next request served", func() bool {
			for _, id := range []string{late, low, high, bumped} {
				if h.state(id) == kv.RequestFulfilled && !slices.Contains(order, id) {
					order = append(order, id)
					return true
				}
			}
			return false
		})
		held = h.takeAll(order[len(order)-1])
	}
	if want := []string{high, bumped, late, low}; !slices.Equal(order, want) {
		t.Errorf("served in order %v, want %v", order, want)
	}
}

// A request waiting for a big label does not hold up a smaller label that
// fits now.
func TestOtherLabelsPassAWaitingRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: big}, {name: small}]
providers:
  - name: c
    driver: fake
    flavors: [{name: l, cores: 8}, {name: s, cores: 2}]
    pools: [{name: p, max-cores: 10, labels: [{name: big, flavor-name: l}, {name: small, flavor-name: s}]}]
`)
	h.startLauncher("l1")
	a := h.submit(events.RequestMessage{Labels: []string{"small", "small"}})
	h.waitDone(10*time.Second, a)
	h.takeAll(a) // 4 of 10 cores in use
	// big is recorded first: submitted together, concurrent intake
	// workers may record small before big, which is then not waiting yet.
	big := h.submitRecorded(events.RequestMessage{Labels: []string{"big"}})
	small := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(10*time.Second, small)
	if h.state(small) != kv.RequestFulfilled || h.state(big) != kv.RequestRequested {
		t.Fatalf("small is %s and big is %s; want small served and big waiting", h.state(small), h.state(big))
	}
}

// Pools are tried by priority; a paused (full) better pool lets the next
// one serve; a request naming a provider is left to it.
func TestPoolPriorityAndProviderChoice(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: primary
    driver: fake
    pools: [{name: p, priority: 1, max-servers: 1, labels: [small]}]
  - name: overflow
    driver: fake
    pools: [{name: p, priority: 2, labels: [small]}]
`)
	h.startLauncher("l1")
	from := func(id string) string {
		r, _ := h.request(id)
		return r.Provider
	}
	first := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(10*time.Second, first)
	if from(first) != "primary" {
		t.Errorf("first request served by %s, want primary", from(first))
	}
	h.takeAll(first)
	second := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(10*time.Second, second)
	if from(second) != "overflow" {
		t.Errorf("with primary full, served by %s, want overflow", from(second))
	}
	named := h.submit(events.RequestMessage{Labels: []string{"small"}, Provider: "overflow"})
	h.waitDone(10*time.Second, named)
	if from(named) != "overflow" {
		t.Errorf("request naming overflow served by %s", from(named))
	}
}

// min-ready requests wait behind real ones for a freed slot.
func TestMinReadyYieldsToRealRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small, min-ready: 1}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, max-servers: 1, labels: [small]}]
`)
	h.startLauncher("l1")
	h.until(10*time.Second, "min-ready node", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady && n.AllocatedTo == "" }) == 1
	})
	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"small"}}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	// min-ready wants a new node but the pool is full: its request waits.
	h.until(10*time.Second, "min-ready request waiting", func() bool { return h.state(consumers.MinReadyID("small", 0)) == kv.RequestRequested })
	real := h.submit(events.RequestMessage{Labels: []string{"small"}, Priority: intp(300)})
	h.until(5*time.Second, "real request recorded", func() bool { _, ok := h.request(real); return ok })
	h.returnNodes(nodes[0].ID)
	h.waitDone(10*time.Second, real)
	if st := h.state(consumers.MinReadyID("small", 0)); st != kv.RequestRequested {
		t.Errorf("min-ready request is %s while a real request took the slot; want it still waiting", st)
	}
}

// A cloud quota error on create is not a failed attempt: the launch waits
// and completes when room appears.
func TestCloudQuotaErrorIsNotAFailedAttempt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    launch-retries: 1
    quota: {instances: 1}
    pools: [{name: p, labels: [small]}]
`)
	l := h.startLauncher("l1")
	cloud := l.Providers["c"].(*fake.Provider)
	theirs, err := cloud.Inject(t.Context(), "theirs", nil, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A node record written directly (as a scheduler whose view of the
	// cloud was stale would): its create meets the full cloud.
	now := time.Now().UTC()
	n := &kv.Node{ID: "n1", State: kv.NodeBuilding, Labels: []string{"small"}, Provider: "c", Pool: "p", Created: now, StateTime: now}
	if _, err := h.b.Nodes.Create(t.Context(), n.ID, n); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "launch waiting for quota", func() bool {
		got, _ := h.node("n1")
		return strings.Contains(got.Reason, "quota exceeded")
	})
	if got, _ := h.node("n1"); got.State != kv.NodeBuilding || got.Attempt > 1 {
		t.Fatalf("node after a quota error: %s attempt %d", got.State, got.Attempt)
	}
	sm, err := cloud.Delete(theirs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sm.Advance(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.until(20*time.Second, "node ready once room appeared", func() bool {
		got, _ := h.node("n1")
		return got.State == kv.NodeReady
	})
	if got, _ := h.node("n1"); got.Attempt != 1 {
		t.Errorf("attempt = %d, want 1", got.Attempt)
	}
}

// boot-timeout fails an attempt and launch-timeout ends the retries; each
// failed instance is deleted before the next attempt; after the last the
// request fails with the reason. The launcher goes by a fake clock, which
// the test moves a sync interval at a time: the timeouts run out only as
// it moves, whatever a busy machine does meanwhile.
func TestLaunchTimeouts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, keys, reason string
		attempts           int // instances created; 0: fewer than launch-retries
	}{
		{"boot-timeout on every attempt", "boot-timeout: 0.3\n    launch-retries: 2", "after 2 attempt(s): not ready within boot-timeout", 2},
		{"launch-timeout ends the retries", "boot-timeout: 0.3\n    launch-timeout: 0.5\n    launch-retries: 10", "not ready within boot-timeout", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h, clk := newFakeClockHarness(t, fmt.Sprintf(`
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 3600
    %s
    pools: [{name: p, labels: [small]}]
`, c.keys))
			l := h.startLauncher("l1")
			id := h.submit(events.RequestMessage{Labels: []string{"small"}})
			h.untilSwept(clk, 30*time.Second, "the request failed", func() bool {
				r, _ := h.request(id)
				return r.State == kv.RequestFailed || r.State == kv.RequestFulfilled
			})
			r, _ := h.request(id)
			if r.State != kv.RequestFailed || !strings.Contains(r.Reason, c.reason) {
				t.Fatalf("request = %s %q, want failed with %q", r.State, r.Reason, c.reason)
			}
			if got := l.Metrics().Registry().Sum("nodepool_launch_failures_total", "provider=c", "kind=boot_timeout"); got != 1 {
				t.Errorf("nodepool_launch_failures_total{provider=c,kind=boot_timeout} = %v, want 1", got)
			}
			h.until(10*time.Second, "nothing left", func() bool { return h.nodes.Len() == 0 && h.instanceCount("c") == 0 })
			got := h.instancesEverCreated("c")
			switch {
			case c.attempts > 0 && got != c.attempts:
				t.Errorf("%d instances created, want %d (one per attempt)", got, c.attempts)
			case c.attempts == 0 && (got < 1 || got >= 10):
				t.Errorf("%d instances created; launch-timeout should stop retries well before 10", got)
			}
		})
	}
}

// max-concurrency bounds the launches one process runs at once.
func TestMaxConcurrency(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    boot-delay: 0.3
    max-concurrency: 2
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	var ids []string
	for range 6 {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}}))
	}
	h.waitDone(30*time.Second, ids...)
	for _, id := range ids {
		if h.state(id) != kv.RequestFulfilled {
			t.Fatalf("request %s: %s", id, h.state(id))
		}
	}
	// The cloud's own view: each instance booted from its creation to its
	// ready time, inside the launch that made it; no more than two may
	// overlap. (Records are no measure: a node this process claimed may
	// wait for a slot, its record saying building all the while.)
	type edge struct {
		at   time.Time
		step int
	}
	var edges []edge
	h.instances["c"].Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		edges = append(edges, edge{e.Value.Created, 1}, edge{e.Value.ReadyAt, -1})
		return true
	})
	if len(edges) != 12 {
		t.Fatalf("%d instances in the cloud; want 6", len(edges)/2)
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.step - b.step // an end before a start at the same instant
	})
	most, booting := 0, 0
	for _, e := range edges {
		booting += e.step
		most = max(most, booting)
	}
	if most > 2 {
		t.Errorf("%d instances booting at once, max-concurrency is 2", most)
	}
	if most < 2 {
		t.Errorf("never more than %d instance booting; the test shows nothing", most)
	}
}

// The provider's rate holds for all launchers together: each takes an
// equal share, so a cloud that refuses calls beyond the rate refuses none.
func TestRateIsSharedByAllLaunchers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    rate: 4
    api-rate-limit: 6
    pools: [{name: p, labels: [small]}]
`)
	l1 := h.startLauncher("l1")
	h.startLauncher("l2")
	h.waitLaunchers(2)
	var ids []string
	for range 12 {
		ids = append(ids, h.submit(events.RequestMessage{Labels: []string{"small"}}))
	}
	h.waitDone(60*time.Second, ids...)
	refused, err := l1.Providers["c"].(*fake.Provider).Refused(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if refused > 0 {
		t.Errorf("the cloud refused %d calls: the launchers together went over the rate", refused)
	}
	for _, id := range ids {
		if h.state(id) != kv.RequestFulfilled {
			t.Errorf("request %s is %s", id, h.state(id))
		}
	}
}

// Node ages: max-ready-age, holds (expiry and max-hold-age) and in-use
// leases that run out. The launcher goes by a fake clock, which the test
// moves past each age.
func TestNodeAges(t *testing.T) {
	t.Parallel()
	h, clk := newFakeClockHarness(t, `
labels:
  - {name: aging, min-ready: 1, max-ready-age: 3600}
  - {name: small}
max-hold-age: 7200
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [aging, small]}]
`)
	h.startLauncher("l1")
	var firstReady string
	h.until(10*time.Second, "a min-ready node", func() bool {
		h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.Labels[0] == "aging" && e.Value.State == kv.NodeReady {
				firstReady = e.Key
			}
			return firstReady == ""
		})
		return firstReady != ""
	})
	clk.Advance(time.Hour + time.Minute)
	h.untilSwept(clk, 10*time.Second, "old ready node replaced", func() bool {
		_, there := h.nodes.Get(firstReady)
		return !there && h.countNodes(func(n *kv.Node) bool { return n.Labels[0] == "aging" && n.State == kv.NodeReady }) == 1
	})

	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"small", "small", "small", "small"}}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	kept, expiring, aged, leased := nodes[0].ID, nodes[1].ID, nodes[2].ID, nodes[3].ID
	held, err := h.client.Hold(t.Context(), expiring, "debugging", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Hold(t.Context(), aged, "forgotten", 0); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Renew(t.Context(), leased, "tester", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := held.Value; n.State != kv.NodeHold || n.Comment != "debugging" || n.HoldExpiration == nil {
		t.Fatalf("held node = %s %q %v", n.State, n.Comment, n.HoldExpiration)
	}
	// An hour on, the hold's expiry and the lease have passed, not
	// max-hold-age; two hours on, max-hold-age has.
	clk.Advance(time.Hour + time.Minute)
	h.untilSwept(clk, 10*time.Second, "expired hold and lease deleted", func() bool {
		_, a := h.nodes.Get(expiring)
		_, c := h.nodes.Get(leased)
		return !a && !c
	})
	clk.Advance(time.Hour)
	h.untilSwept(clk, 10*time.Second, "the node held for longer than max-hold-age deleted", func() bool {
		_, b := h.nodes.Get(aged)
		return !b
	})
	if n, ok := h.node(kept); !ok || n.State != kv.NodeInUse {
		t.Errorf("the node in use without a lease was touched: %+v", n)
	}
}

// Instances tagged as ours without a record are deleted on their second
// sighting; instances that are not ours are left alone, and so are those
// of a Python Nodepool serving the provider beside this one during a
// migration (their node ids are ZooKeeper sequences).
func TestLeakedInstancesAreDeleted(t *testing.T) {
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
	leaked, err := cloud.Inject(t.Context(), "npghost", map[string]string{drivers.TagProvider: "c", drivers.TagNode: "ghost"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := cloud.Inject(t.Context(), "someone-elses", map[string]string{"owner": "them"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	pythons, err := cloud.Inject(t.Context(), "np0000001234", map[string]string{drivers.TagProvider: "c", drivers.TagNode: "0000001234"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "leaked instance deleted", func() bool {
		_, there := h.instances["c"].Get(leaked)
		return !there && l.Metrics().Registry().Sum("nodepool_leaked_resources_deleted_total", "kind=instances") == 1
	})
	if _, there := h.instances["c"].Get(theirs); !there {
		t.Error("an instance that is not ours was deleted")
	}
	if _, there := h.instances["c"].Get(pythons); !there {
		t.Error("a Python Nodepool's instance was deleted")
	}
	if l.Metrics().Registry().Sum("nodepool_leaked_resources_deleted_total", "kind=instances") != 1 {
		t.Errorf("leaked deleted = %v", l.Metrics().Registry().Sum("nodepool_leaked_resources_deleted_total", "kind=instances"))
	}
}

// Work left by a process that is gone is taken over: launches it owned are
// handed back and resumed, and requests pending in a pool no live launcher
// serves go back to waiting and are served.
func TestWorkOfDeadProcessesIsTakenOver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	now := time.Now().UTC()
	orphan := &kv.Node{ID: "orphan", State: kv.NodeBuilding, Labels: []string{"small"}, Provider: "c", Pool: "p", Launcher: "dead-launcher", Created: now, StateTime: now}
	if _, err := h.b.Nodes.Create(t.Context(), orphan.ID, orphan); err != nil {
		t.Fatal(err)
	}
	lost := &kv.Request{ID: "lost", State: kv.RequestPending, Labels: []string{"small"}, Nodes: []string{"x"}, Provider: "gone", Pool: "p",
		Priority: 100, Reuse: true, RequestorData: json.RawMessage("{}"), Created: now, StateTime: now}
	if _, err := h.b.Requests.Create(t.Context(), lost.ID, lost); err != nil {
		t.Fatal(err)
	}
	h.startLauncher("l1")
	h.waitDone(20*time.Second, "lost")
	if h.state("lost") != kv.RequestFulfilled {
		t.Errorf("lost request is %s", h.state("lost"))
	}
	h.until(10*time.Second, "orphan launch resumed", func() bool {
		n, ok := h.node("orphan")
		return ok && n.State == kv.NodeReady && n.Launcher == "l1"
	})
}

// declined_by is judged against live pools: a request waits while a live
// pool that could serve it has not declined, and fails once every live pool
// has.
func TestDeclinesAreJudgedAgainstLivePools(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: a}, {name: b}]
providers:
  - name: c1
    driver: fake
    pools: [{name: p1, labels: [a]}]
  - name: c2
    driver: fake
    pools: [{name: p2, max-servers: 1, labels: [a, b]}]
`)
	onlyA := parseConfig(t, `
labels: [{name: a}]
providers:
  - name: c1
    driver: fake
    pools: [{name: p1, labels: [a]}]
`)
	h.startLauncherWith("l1", onlyA)
	l2 := h.startLauncher("l2")
	h.waitLaunchers(2)
	fill := h.submit(events.RequestMessage{Labels: []string{"b"}})
	h.waitDone(10*time.Second, fill)
	h.takeAll(fill) // c2/p2 is now full
	waiting := h.submit(events.RequestMessage{Labels: []string{"b"}})
	h.until(10*time.Second, "declined by c1/p1", func() bool {
		r, _ := h.request(waiting)
		return slices.Contains(r.DeclinedBy, "c1/p1")
	})
	if st := h.state(waiting); st != kv.RequestRequested {
		t.Fatalf("request is %s while live c2/p2 could still serve it", st)
	}
	l2.Stop() // the only pool with b is gone
	h.waitDone(10*time.Second, waiting)
	r, _ := h.request(waiting)
	if r.State != kv.RequestFailed || !strings.Contains(r.Reason, "declined by every live pool") {
		t.Errorf("request = %s %q", r.State, r.Reason)
	}
}
