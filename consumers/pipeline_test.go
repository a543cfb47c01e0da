package consumers_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

const onePool = `
labels:
  - name: small
  - name: big
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools:
      - name: main
        max-servers: 10
        labels: [small, big]
`

func TestRequestLifecycle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	h.startLauncher("l1")
	id := h.submit(events.RequestMessage{Labels: []string{"small", "big", "small"}, Requestor: "test"})
	if id != "0000000001" {
		t.Errorf("request id = %q, want the stream sequence 0000000001", id)
	}
	h.waitDone(10*time.Second, id)
	r, _ := h.request(id)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request %s is %s (%s), want fulfilled", id, r.State, r.Reason)
	}
	if len(r.Nodes) != 3 || r.Provider != "cloud1" || r.Pool != "main" {
		t.Fatalf("request = %+v", r)
	}
	for i, nid := range r.Nodes {
		n, ok := h.node(nid)
		if !ok {
			t.Fatalf("node %s missing", nid)
		}
		if n.State != kv.NodeReady || n.AllocatedTo != id || n.Labels[0] != r.Labels[i] {
			t.Errorf("node %d = %s %v allocated to %q; want ready %s allocated to %s", i, n.State, n.Labels, n.AllocatedTo, r.Labels[i], id)
		}
		if n.ExternalID == "" || n.InterfaceIP == "" {
			t.Errorf("node %s lacks instance details: %+v", nid, n)
		}
	}
	// The cloud's cache may be a moment behind the request's.
	h.until(5*time.Second, "the three instances seen", func() bool { return h.instanceCount("cloud1") >= 3 })
	if got := h.instanceCount("cloud1"); got != 3 {
		t.Errorf("cloud has %d instances, want 3", got)
	}
	// Take, delete the request, give back: every node and instance goes.
	for _, nid := range r.Nodes {
		if _, err := h.client.Take(t.Context(), nid, id, "tester", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.client.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	for _, nid := range r.Nodes {
		if err := h.client.Return(t.Context(), nid); err != nil {
			t.Fatal(err)
		}
	}
	h.until(10*time.Second, "nodes and instances deleted", func() bool {
		return h.nodes.Len() == 0 && h.instanceCount("cloud1") == 0
	})
}

// twoReadyConfig keeps two "small" nodes of a fake cloud ready.
const twoReadyConfig = `
labels:
  - name: small
    min-ready: 2
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools:
      - name: main
        labels: [small]
`

// untilReady waits until n nodes are ready and allocated to nobody.
func (h *harness) untilReady(n int) {
	h.t.Helper()
	h.until(10*time.Second, fmt.Sprintf("%d ready nodes", n), func() bool {
		return h.countNodes(func(x *kv.Node) bool { return x.State == kv.NodeReady && x.AllocatedTo == "" }) == n
	})
}

func TestReuseReadyNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, twoReadyConfig)
	h.startLauncher("l1")
	h.untilReady(2)
	var ready []string
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool { ready = append(ready, e.Key); return true })
	before := h.instancesEverCreated("cloud1")

	id := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(10*time.Second, id)
	r, _ := h.request(id)
	if r.State != kv.RequestFulfilled || !slices.Contains(ready, r.Nodes[0]) {
		t.Fatalf("request = %s %v, want fulfilled from the ready nodes %v", r.State, r.Nodes, ready)
	}
	// min-ready then launches one node in place of the one handed out, at
	// any moment after the hand-out: once it is ready beside the other,
	// it is the only instance made since.
	h.until(10*time.Second, "a new node ready beside the one left", func() bool {
		fresh := 0
		n := h.countNodes(func(x *kv.Node) bool {
			if x.State != kv.NodeReady || x.AllocatedTo != "" {
				return false
			}
			if !slices.Contains(ready, x.ID) {
				fresh++
			}
			return true
		})
		return n == 2 && fresh == 1
	})
	if got := h.instancesEverCreated("cloud1"); got != before+1 {
		t.Errorf("serving from a ready node and keeping min-ready 2 created %d instances, want 1", got-before)
	}

	// reuse false launches a new node even though one is ready.
	f := false
	id2 := h.submit(events.RequestMessage{Labels: []string{"small"}, Reuse: &f})
	h.waitDone(10*time.Second, id2)
	r2, _ := h.request(id2)
	if r2.State != kv.RequestFulfilled || slices.Contains(ready, r2.Nodes[0]) {
		t.Fatalf("request with reuse false = %s %v; want a new node, not one of %v", r2.State, r2.Nodes, ready)
	}
}

func TestMultiLabelRequestsComeFromOnePool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: a
  - name: b
  - name: c
providers:
  - name: p1
    driver: fake
    cloud: shared
    pools:
      - name: left
        labels: [a, c]
  - name: p2
    driver: fake
    cloud: shared
    pools:
      - name: right
        labels: [a, b]
`)
	h.startLauncher("l1")
	ok := h.submit(events.RequestMessage{Labels: []string{"a", "b", "a"}})
	bad := h.submit(events.RequestMessage{Labels: []string{"b", "c"}})
	h.waitDone(10*time.Second, ok, bad)
	r, _ := h.request(ok)
	if r.State != kv.RequestFulfilled || kv.PoolRef(r.Provider, r.Pool) != "p2/right" {
		t.Fatalf("request [a b a] = %s from %s/%s, want fulfilled by p2/right", r.State, r.Provider, r.Pool)
	}
	for _, nid := range r.Nodes {
		if n, _ := h.node(nid); n.Provider != "p2" || n.Pool != "right" {
			t.Errorf("node %s from %s/%s, want every node from p2/right", nid, n.Provider, n.Pool)
		}
	}
	rb, _ := h.request(bad)
	if rb.State != kv.RequestFailed || !strings.Contains(rb.Reason, "declined by every live pool") {
		t.Fatalf("request [b c] = %s %q, want failed: declined by every live pool", rb.State, rb.Reason)
	}
	slices.Sort(rb.DeclinedBy)
	if !slices.Equal(rb.DeclinedBy, []string{"p1/left", "p2/right"}) {
		t.Errorf("declined_by = %v", rb.DeclinedBy)
	}
}

func TestInvalidMessagesGiveFailedRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	h.startLauncher("l1")
	cases := []struct {
		name    string
		message string
		id      string // expected record id; "" means the stream sequence
		reason  string
	}{
		{"not JSON", `{labels: small`, "", "bad JSON"},
		{"empty", ``, "", "empty"},
		{"not an object", `["small"]`, "", "expected a JSON object"},
		{"no labels", `{"id": "no-labels"}`, "no-labels", "labels: required"},
		{"empty labels", `{"id": "empty-labels", "labels": []}`, "empty-labels", "labels: required"},
		{"labels not strings", `{"labels": [1, 2]}`, "", "labels"},
		{"bad id", `{"id": "bad id!", "labels": ["small"]}`, "", `id "bad id!" is not valid`},
		{"unknown field", `{"id": "typo", "lables": ["small"]}`, "typo", `unknown field "lables"`},
		{"unknown label", `{"id": "unknown-label", "labels": ["small", "huge"]}`, "unknown-label", "unknown label(s) huge"},
		{"requestor_data not an object", `{"id": "rd", "labels": ["small"], "requestor_data": 5}`, "rd", "requestor_data"},
	}
	for i, c := range cases {
		h.publishRaw(c.message)
		if i == 4 {
			// A valid request among the bad ones is served as usual.
			h.publishRaw(`{"id": "good", "labels": ["small"]}`)
		}
	}
	seqID := func(i int) string {
		// Messages were published in order; the valid one came 6th.
		seq := i + 1
		if i >= 5 {
			seq++
		}
		return events.RequestID(uint64(seq))
	}
	var ids []string
	for i, c := range cases {
		id := c.id
		if id == "" {
			id = seqID(i)
		}
		ids = append(ids, id)
	}
	h.waitDone(10*time.Second, append(ids, "good")...)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _ := h.request(ids[i])
			if r.State != kv.RequestFailed || !strings.Contains(r.Reason, c.reason) {
				t.Errorf("record %s = %s %q; want failed with a reason containing %q", ids[i], r.State, r.Reason, c.reason)
			}
		})
	}
	if r, _ := h.request("good"); r.State != kv.RequestFulfilled {
		t.Errorf("the valid request is %s (%s), want fulfilled", r.State, r.Reason)
	}
}

func TestResubmissionWithMsgIDIsNoop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	h.startLauncher("l1")
	m := events.RequestMessage{ID: "once", Labels: []string{"small"}}
	for range 3 {
		h.submit(m)
	}
	h.waitDone(10*time.Second, "once")
	if got := h.countNodes(func(*kv.Node) bool { return true }); got != 1 {
		t.Errorf("%d nodes for one request submitted three times", got)
	}
}

func TestDeletingARequestFreesItsNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	l := h.startLauncher("l1")
	id := h.submit(events.RequestMessage{Labels: []string{"small", "big"}})
	h.waitDone(10*time.Second, id)
	r, _ := h.request(id)
	if err := h.client.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	freed := func(nodes *kv.Cache[kv.Node]) bool {
		for _, nid := range r.Nodes {
			if e, ok := nodes.Get(nid); !ok || e.Value.State != kv.NodeReady || e.Value.AllocatedTo != "" {
				return false
			}
		}
		return true
	}
	h.until(10*time.Second, "nodes freed", func() bool { return freed(h.nodes) })
	// The launcher offers a freed node once it has seen its own write
	// (a request arriving in between may get a new node, and the freed
	// one stays ready for the next): wait for that too.
	sub := l.Nodes().Subscribe()
	defer l.Nodes().Unsubscribe(sub)
	waitfor.Until(t, 10*time.Second, "the launcher to see its nodes freed", func() bool { return freed(l.Nodes()) }, waitfor.Changes(sub))
	// The next request for those labels gets the same nodes.
	id2 := h.submit(events.RequestMessage{Labels: []string{"big", "small"}})
	h.waitDone(10*time.Second, id2)
	r2, _ := h.request(id2)
	got := slices.Clone(r2.Nodes)
	want := slices.Clone(r.Nodes)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("second request got %v, want the freed nodes %v", r2.Nodes, r.Nodes)
	}
}

func TestMinReadyTopsUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: small
    min-ready: 3
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools:
      - name: main
        labels: [small]
`)
	h.startLauncher("l1")
	unallocatedReady := func() int {
		return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady && n.AllocatedTo == "" })
	}
	h.until(10*time.Second, "three ready nodes", func() bool { return unallocatedReady() == 3 })
	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"small", "small"}}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "topped up to three ready nodes", func() bool { return unallocatedReady() == 3 })
	for _, n := range nodes {
		if err := h.client.Return(t.Context(), n.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.until(10*time.Second, "returned nodes deleted, three ready left", func() bool {
		return h.nodes.Len() == 3 && unallocatedReady() == 3 && h.instanceCount("cloud1") == 3
	})
	// No min-ready requests are left behind once their nodes are ready.
	h.until(10*time.Second, "min-ready requests cleared", func() bool { return h.requests.Len() == 0 })
}

func TestLaunchFailureFailsTheRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: small
providers:
  - name: cloud1
    driver: fake
    failure-rate: 1
    launch-retries: 2
    pools:
      - name: main
        labels: [small]
`)
	l := h.startLauncher("l1")
	_, err := h.client.Request(t.Context(), events.RequestMessage{ID: "doomed", Labels: []string{"small"}}, "tester")
	if !errors.Is(err, client.ErrRequestFailed) || !strings.Contains(err.Error(), "after 2 attempt(s)") {
		t.Fatalf("request error = %v, want failed after 2 attempts", err)
	}
	// One failed launch, of a cloud error, graphable by provider and kind.
	if got := l.Metrics().Registry().Sum("nodepool_launch_failures_total", "provider=cloud1", "kind=other"); got != 1 {
		t.Errorf("nodepool_launch_failures_total{provider=cloud1,kind=other} = %v, want 1", got)
	}
	if got := l.Metrics().Registry().Sum("nodepool_launch_failures_total"); got != 1 {
		t.Errorf("nodepool_launch_failures_total = %v in all, want 1", got)
	}
	h.until(10*time.Second, "failed node and instances deleted", func() bool {
		return h.nodes.Len() == 0 && h.instanceCount("cloud1") == 0
	})
	if got := h.instancesEverCreated("cloud1"); got != 2 {
		t.Errorf("%d instances created, want one per attempt (2)", got)
	}
}

func TestClientRequestReturnsNodesInLabelOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, onePool)
	h.startLauncher("l1")
	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"big", "small", "big"}}, "me@here")
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, n := range nodes {
		labels = append(labels, n.Labels[0])
		if n.State != kv.NodeInUse || n.Holder != "me@here" {
			t.Errorf("node %s is %s held by %q", n.ID, n.State, n.Holder)
		}
	}
	if !slices.Equal(labels, []string{"big", "small", "big"}) {
		t.Errorf("labels in order %v", labels)
	}
	h.until(5*time.Second, "request deleted after taking", func() bool { return h.requests.Len() == 0 })
	data, _ := json.Marshal(nodes[0])
	for _, field := range []string{"allocated_to", "lease_until", "hold_expiration", "driver_data", "resources", "state_time"} {
		if !strings.Contains(string(data), fmt.Sprintf("%q:", field)) {
			t.Errorf("node JSON lacks %s: %s", field, data)
		}
	}
}
