package consumers_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

const slowBoot = `
labels:
  - name: small
  - name: big
providers:
  - name: cloud1
    driver: fake
    boot-delay: 1
    delete-delay: 0.2
    pools:
      - name: main
        max-servers: 30
        labels: [small, big]
`

// A launcher stopped while its launches are booting, and started again
// (with its old id, or as a new process), finishes every request without
// launching any node twice.
func TestRestartInTheMiddleOfLaunches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, secondID string }{
		{"same id", "l1"},
		{"new id", "l2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, slowBoot)
			l1 := h.startLauncher("l1")
			var ids []string
			for i := range 10 {
				labels := []string{"small"}
				if i%3 == 0 {
					labels = []string{"small", "big"}
				}
				ids = append(ids, h.submit(events.RequestMessage{Labels: labels}))
			}
			h.until(10*time.Second, "every node booting", func() bool {
				// Every instance made, none ready yet.
				return h.instanceCount("cloud1") == 14 && h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeBuilding }) == 14
			})
			l1.Stop()
			h.startLauncher(tc.secondID)
			h.waitDone(20*time.Second, ids...)
			for _, id := range ids {
				if r, _ := h.request(id); r.State != kv.RequestFulfilled {
					t.Errorf("request %s is %s (%s)", id, r.State, r.Reason)
				}
			}
			if got := h.instancesEverCreated("cloud1"); got != 14 {
				t.Errorf("%d instances created for 14 nodes", got)
			}
			h.checkConsistent("cloud1")
		})
	}
}

// Two launchers with their own connections share one server: both do
// work, every request is served, and no node is ever given to two
// requests.
func TestTwoLaunchersShareTheWork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels:
  - name: small
    min-ready: 3
  - name: big
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.1
    pools:
      - name: main
        max-servers: 25
        labels: [small, big]
      - name: spare
        max-servers: 10
        labels: [small]
`)
	l1 := h.startLauncher("l1")
	l2 := h.startLauncher("l2")

	const n = 80
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []string
	for i := range n {
		var labels []string
		for range 1 + rng.IntN(3) {
			labels = append(labels, []string{"small", "big"}[rng.IntN(2)])
		}
		prio := 100
		if i%4 == 0 {
			prio = 50
		}
		ids = append(ids, h.submit(events.RequestMessage{Labels: labels, Priority: &prio}))
	}
	// A requestor takes each request's nodes as soon as it is fulfilled and
	// gives them back a moment later.
	owner := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			r, err := h.client.Wait(t.Context(), id)
			if err != nil {
				t.Errorf("request %s: %v", id, err)
				return
			}
			for _, nid := range r.Value.Nodes {
				mu.Lock()
				if prev, dup := owner[nid]; dup {
					t.Errorf("node %s given to %s and %s", nid, prev, id)
				}
				owner[nid] = id
				mu.Unlock()
				if _, err := h.client.Take(t.Context(), nid, id, "tester", nil); err != nil {
					t.Errorf("taking node %s of %s: %v", nid, id, err)
				}
			}
			if err := h.client.DeleteRequest(t.Context(), id); err != nil {
				t.Errorf("deleting %s: %v", id, err)
			}
			for _, nid := range r.Value.Nodes {
				if err := h.client.Return(t.Context(), nid); err != nil {
					t.Errorf("returning %s: %v", nid, err)
				}
			}
		})
	}
	wg.Wait()
	h.until(20*time.Second, "only min-ready nodes left", func() bool {
		return h.nodes.Len() == 3 && h.instanceCount("cloud1") == 3
	})
	for _, l := range []*launcher{l1, l2} {
		if l.Metrics().Registry().Sum("nodepool_launch_duration_seconds", "result=ready") == 0 {
			t.Errorf("a launcher launched nothing: the work was not shared")
		}
	}
	if len(owner) < n {
		t.Errorf("only %d distinct nodes for %d requests", len(owner), n)
	}
	h.checkConsistent("cloud1")
}

// A burst of requests, each for new nodes: exactly one node and one
// instance per label asked for, none launched twice or left over.
func TestBurstLaunchesEachNodeOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}, {name: big}]
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    pools: [{name: main, labels: [small, big]}]
`)
	h.startLauncher("l1")
	var ids []string
	nodes := 0
	for i := range 300 {
		labels := []string{"small"}
		if i%4 == 0 {
			labels = []string{"big", "small", "big"}
		}
		nodes += len(labels)
		ids = append(ids, h.submit(events.RequestMessage{Labels: labels}))
	}
	h.waitDone(60*time.Second, ids...)
	seen := map[string]string{}
	for _, id := range ids {
		r, _ := h.request(id)
		if r.State != kv.RequestFulfilled {
			t.Fatalf("request %s is %s: %s", id, r.State, r.Reason)
		}
		for _, n := range r.Nodes {
			if prev, dup := seen[n]; dup {
				t.Errorf("node %s given to %s and %s", n, prev, id)
			}
			seen[n] = id
		}
	}
	h.until(10*time.Second, "every node recorded", func() bool { return h.nodes.Len() >= nodes })
	if got := h.nodes.Len(); got != nodes {
		t.Errorf("%d node records for %d nodes asked for", got, nodes)
	}
	if got := h.instancesEverCreated("cloud1"); got != nodes {
		t.Errorf("%d instances created for %d nodes asked for", got, nodes)
	}
}

// TestStopWhileStarting stops launchers right after starting them, so
// that the stop lands somewhere in their start: a shutdown asked for while
// the launcher still opens its consumers is a clean stop (Run returns nil;
// the harness fails the test otherwise).
func TestStopWhileStarting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, apiConfig)
	for i := range 20 {
		h.startLauncher(fmt.Sprintf("l%d", i)).Stop()
	}
}
