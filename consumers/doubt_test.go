package consumers_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// smallPoolOfOne is a fake provider c with one pool p of max-servers 1,
// serving label small.
const smallPoolOfOne = `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, max-servers: 1, labels: [small]}]
`

// A node whose create got no answer (its stream between leaders) may land
// later, even after a new leader of the pool planned the request again: the
// request's node is made again under its own key, so that the late write and
// the new one are one node and the pool never goes past max-servers. A key
// that held a node which was deleted gets a new one (the old key named an
// instance to the cloud already). Found by TestChaos: 11 nodes in a pool of
// max-servers 10 after a server kill.
func TestNodeInDoubtIsMadeUnderItsKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		deleted bool // the plan's node lived and was deleted
	}{
		{name: "never seen"},
		{name: "deleted", deleted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, smallPoolOfOne)
			ctx := t.Context()
			now := time.Now().UTC()
			const planned = "doubt0node001"
			if tc.deleted {
				n := &kv.Node{ID: planned, State: kv.NodeUsed, Labels: []string{"small"}, Provider: "c", Pool: "p", Created: now, StateTime: now}
				rev, err := h.b.Nodes.Create(ctx, planned, n)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.b.Nodes.Delete(ctx, planned, rev); err != nil {
					t.Fatal(err)
				}
			}
			r := &kv.Request{ID: "doubt", State: kv.RequestPending, Labels: []string{"small"}, Nodes: []string{planned},
				Provider: "c", Pool: "p", Priority: 100, Requestor: "tester", RequestorData: json.RawMessage("{}"), Created: now, StateTime: now}
			if _, err := h.b.Requests.Create(ctx, r.ID, r); err != nil {
				t.Fatal(err)
			}
			h.startLauncher("l1")
			h.waitDone(20*time.Second, r.ID)
			got, _ := h.request(r.ID)
			if got.State != kv.RequestFulfilled || len(got.Nodes) != 1 {
				t.Fatalf("request = %s %v", got.State, got.Nodes)
			}
			if tc.deleted {
				if got.Nodes[0] == planned {
					t.Fatalf("the key of a deleted node was used again")
				}
				return
			}
			if got.Nodes[0] != planned {
				t.Fatalf("request fulfilled with node %s, not the planned %s made again", got.Nodes[0], planned)
			}
			// The first write, landing now, finds its key taken.
			late := &kv.Node{ID: planned, State: kv.NodeBuilding, Labels: []string{"small"}, Provider: "c", Pool: "p",
				AllocatedTo: r.ID, Created: now, StateTime: now, Attempt: 1}
			if _, err := h.b.Nodes.Create(ctx, planned, late); !errors.Is(err, kv.ErrExists) {
				t.Fatalf("late create: %v, want ErrExists", err)
			}
			if n := h.countNodes(func(n *kv.Node) bool { return n.Pool == "p" }); n != 1 {
				t.Fatalf("%d nodes in a pool of max-servers 1", n)
			}
		})
	}
}
