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
			checkN1(t, ix, tc.free, tc.alloc, tc.used)
		})
	}
}

// checkN1 checks how the index holds node n1: free in the pool,
// allocated to r1, and the instances counted.
func checkN1(t *testing.T, ix *poolIndex, free, alloc bool, used int) {
	t.Helper()
	if got := ix.free["small"]["n1"]; got != free {
		t.Errorf("free: %v, want %v", got, free)
	}
	if got := ix.byRequest["r1"]["n1"]; got != alloc {
		t.Errorf("allocated to r1: %v, want %v", got, alloc)
	}
	if ix.used.poolUsed.Instances != used || ix.used.provUsed.Instances != used {
		t.Errorf("usage: pool %d, provider %d instances, want %d", ix.used.poolUsed.Instances, ix.used.provUsed.Instances, used)
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

// The audit every sync interval heals an index that missed a change: it
// ends as the caches hold the records, whatever it held, and forgets the
// revisions of deleted keys (a bucket made again starts from one).
func TestPoolIndexAuditHealsMissedChanges(t *testing.T) {
	node := func(rev uint64, alloc string) *kv.Entry[kv.Node] {
		return &kv.Entry[kv.Node]{Key: "n1", Revision: rev, Value: kv.Node{ID: "n1", State: kv.NodeReady, Labels: []string{"small"},
			Provider: "p", Pool: "main", AllocatedTo: alloc, Resources: kv.Resources{Instances: 1}}}
	}
	req := func(rev uint64) *kv.Entry[kv.Request] {
		return &kv.Entry[kv.Request]{Key: "r1", Revision: rev, Value: kv.Request{ID: "r1", State: kv.RequestPending, Provider: "p", Pool: "main"}}
	}
	created := func(e *kv.Entry[kv.Node]) kv.Change[kv.Node] {
		return kv.Change[kv.Node]{Key: e.Key, New: e, Revision: e.Revision}
	}
	deleted := func(rev uint64) kv.Change[kv.Node] { return kv.Change[kv.Node]{Key: "n1", Revision: rev} }
	for _, tc := range []struct {
		name    string
		seen    []kv.Change[kv.Node] // what the index was given (the cache's entry itself if nil and cached)
		cached  *kv.Entry[kv.Node]   // what the cache holds (nil: nothing)
		request *kv.Entry[kv.Request]
		healed  int
		free    bool // n1 is a free node of the pool
		alloc   bool // n1 is allocated to r1
		used    int  // instances counted
	}{
		{"in line", nil, node(5, ""), nil, 0, true, false, 1},
		{"a missed update", []kv.Change[kv.Node]{created(node(5, ""))}, node(6, "r1"), nil, 1, false, true, 1},
		{"a missed deletion", []kv.Change[kv.Node]{created(node(5, "r1"))}, nil, nil, 1, false, false, 0},
		{"a missed creation", []kv.Change[kv.Node]{}, node(5, ""), nil, 1, true, false, 1},
		{"the bucket made again", []kv.Change[kv.Node]{created(node(5, "")), deleted(7)}, node(2, ""), nil, 1, true, false, 1},
		{"a missed request", nil, node(5, "r1"), req(3), 1, false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newPoolIndex("p", "main")
			for _, ch := range tc.seen {
				ix.applyNode(ch)
			}
			if tc.seen == nil {
				ix.applyNode(created(tc.cached))
			}
			nodes := func(yield func(*kv.Entry[kv.Node]) bool) {
				if tc.cached != nil {
					yield(tc.cached)
				}
			}
			requests := func(yield func(*kv.Entry[kv.Request]) bool) {
				if tc.request != nil {
					yield(tc.request)
				}
			}
			healed := ix.audit(nodes, func(k string) bool { return tc.cached != nil && k == "n1" },
				requests, func(k string) bool { return tc.request != nil && k == "r1" })
			if healed != tc.healed {
				t.Errorf("healed %d records, want %d", healed, tc.healed)
			}
			checkN1(t, ix, tc.free, tc.alloc, tc.used)
			if (ix.nodes["n1"] != nil) != (tc.cached != nil) || (tc.cached != nil && ix.nodes["n1"] != tc.cached) {
				t.Errorf("the index holds %+v for n1, the cache %+v", ix.nodes["n1"], tc.cached)
			}
			if _, ok := ix.pending["r1"]; ok != (tc.request != nil) {
				t.Errorf("r1 pending in the index: %v, want %v", ok, tc.request != nil)
			}
			if len(ix.goneNodes) != 0 || len(ix.goneRequests) != 0 {
				t.Errorf("deletions still remembered: %v %v", ix.goneNodes, ix.goneRequests)
			}
			// What comes next is indexed: the revisions of the bucket
			// that was there before are forgotten.
			if tc.cached != nil {
				ix.applyNode(created(node(tc.cached.Revision+1, "")))
				if !ix.free["small"]["n1"] {
					t.Error("a change after the audit was not indexed")
				}
			}
		})
	}
}

// After the audit, the next pass looks at every pending request and every
// allocated node again.
func TestPoolIndexLookAgain(t *testing.T) {
	ix := newPoolIndex("p", "main")
	ix.applyRequest(kv.Change[kv.Request]{Key: "r1", Revision: 1, New: &kv.Entry[kv.Request]{Key: "r1", Revision: 1,
		Value: kv.Request{ID: "r1", State: kv.RequestPending, Provider: "p", Pool: "main"}}})
	ix.applyNode(kv.Change[kv.Node]{Key: "n1", Revision: 2, New: &kv.Entry[kv.Node]{Key: "n1", Revision: 2,
		Value: kv.Node{ID: "n1", State: kv.NodeReady, Labels: []string{"small"}, Provider: "p", Pool: "main", AllocatedTo: "r1"}}})
	clear(ix.dirty)
	clear(ix.suspects)
	ix.lookAgain()
	if !ix.dirty["r1"] || !ix.suspects["n1"] {
		t.Errorf("dirty %v, suspects %v: want r1 and n1", ix.dirty, ix.suspects)
	}
}
