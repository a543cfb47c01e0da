package consumers

import (
	"testing"

	"github.com/nodepool-nats/nodepool/kv"
)

// The index never goes back to an older record than it has seen, and a
// deleted key does not come back with a late change of an older revision.
func TestPoolIndexIgnoresOlderChanges(t *testing.T) {
	node := func(rev uint64, state kv.NodeState, alloc string) kv.Change[kv.Node] {
		e := &kv.Entry[kv.Node]{Key: "n1", Revision: rev, Value: kv.Node{ID: "n1", State: state, Labels: []string{"small"},
			Provider: "p", Pool: "main", AllocatedTo: alloc, Resources: kv.Resources{Instances: 1}}}
		return kv.Change[kv.Node]{Key: "n1", New: e, Revision: rev}
	}
	gone := func(rev uint64) kv.Change[kv.Node] { return kv.Change[kv.Node]{Key: "n1", Revision: rev} }
	for _, tc := range []struct {
		name    string
		changes []kv.Change[kv.Node]
		free    bool // n1 is a free node of the pool
		alloc   bool // n1 is allocated to r1
		used    int  // instances counted
	}{
		{"newest wins", []kv.Change[kv.Node]{node(5, kv.NodeReady, ""), node(6, kv.NodeReady, "r1")}, false, true, 1},
		{"older change after newer", []kv.Change[kv.Node]{node(6, kv.NodeReady, "r1"), node(5, kv.NodeReady, "")}, false, true, 1},
		{"same revision twice", []kv.Change[kv.Node]{node(5, kv.NodeReady, ""), node(5, kv.NodeReady, "r1")}, true, false, 1},
		{"deleted, then an older put", []kv.Change[kv.Node]{node(5, kv.NodeReady, ""), gone(7), node(6, kv.NodeReady, "")}, false, false, 0},
		{"older deletion after a newer put", []kv.Change[kv.Node]{node(5, kv.NodeReady, ""), node(8, kv.NodeReady, ""), gone(6)}, true, false, 1},
		{"created again after deletion", []kv.Change[kv.Node]{node(5, kv.NodeReady, "r1"), gone(7), node(9, kv.NodeReady, "")}, true, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newPoolIndex("p", "main")
			for _, ch := range tc.changes {
				ix.applyNode(ch)
			}
			if got := ix.free["small"]["n1"]; got != tc.free {
				t.Errorf("free: %v, want %v", got, tc.free)
			}
			if got := ix.byRequest["r1"]["n1"]; got != tc.alloc {
				t.Errorf("allocated to r1: %v, want %v", got, tc.alloc)
			}
			if ix.used.poolUsed.Instances != tc.used || ix.used.provUsed.Instances != tc.used {
				t.Errorf("usage: pool %d, provider %d instances, want %d", ix.used.poolUsed.Instances, ix.used.provUsed.Instances, tc.used)
			}
		})
	}
}

func TestPoolIndexRequestsIgnoreOlderChanges(t *testing.T) {
	req := func(rev uint64, state kv.RequestState) kv.Change[kv.Request] {
		e := &kv.Entry[kv.Request]{Key: "r1", Revision: rev, Value: kv.Request{ID: "r1", State: state, Provider: "p", Pool: "main"}}
		return kv.Change[kv.Request]{Key: "r1", New: e, Revision: rev}
	}
	ix := newPoolIndex("p", "main")
	ix.applyRequest(req(3, kv.RequestPending))
	ix.applyRequest(req(2, kv.RequestRequested))
	if _, ok := ix.waiting["r1"]; ok {
		t.Error("an older requested record brought r1 back to waiting")
	}
	if _, ok := ix.pending["r1"]; !ok {
		t.Error("r1 is not pending any more")
	}
	ix.applyRequest(kv.Change[kv.Request]{Key: "r1", Revision: 4})
	ix.applyRequest(req(3, kv.RequestPending))
	if _, ok := ix.requests["r1"]; ok {
		t.Error("a deleted request came back with an older record")
	}
}
