package consumers

import "github.com/nodepool-nats/nodepool/kv"

// poolIndex holds the records one term of a pool's scheduler has seen,
// kept from the change queues of the caches (entries are immutable
// snapshots, so the pointers are safe to hold and need no locking in the
// loop), with indexes over them kept as they change, so that a pass looks
// only at what may need work, not at every node.
type poolIndex struct {
	provider, pool string

	requests  map[string]*kv.Entry[kv.Request] // every request
	waiting   map[string]*kv.Entry[kv.Request] // requests in requested state
	pending   map[string]*kv.Entry[kv.Request] // requests pending in this pool
	poolNodes map[string]*kv.Entry[kv.Node]    // nodes of this pool

	free      map[string]map[string]bool // label -> ready, unallocated nodes
	byRequest map[string]map[string]bool // request -> nodes allocated to it
	used      *usage                     // what nodes hold, kept up to date

	// Work marks: what the next pass looks at.
	suspects map[string]bool // allocated nodes whose request may be gone
	dirty    map[string]bool // pending requests to look at again
}

func newPoolIndex(provider, pool string) *poolIndex {
	return &poolIndex{
		provider: provider, pool: pool,
		requests: map[string]*kv.Entry[kv.Request]{}, waiting: map[string]*kv.Entry[kv.Request]{},
		pending: map[string]*kv.Entry[kv.Request]{}, poolNodes: map[string]*kv.Entry[kv.Node]{},
		free: map[string]map[string]bool{}, byRequest: map[string]map[string]bool{},
		used:     newUsage(provider, pool),
		suspects: map[string]bool{}, dirty: map[string]bool{},
	}
}

// applyRequest indexes a change of a request.
func (ix *poolIndex) applyRequest(ch kv.Change[kv.Request]) {
	// Nodes allocated to a request that changed or went may need freeing.
	for id := range ix.byRequest[ch.Key] {
		ix.suspects[id] = true
	}
	delete(ix.waiting, ch.Key)
	delete(ix.pending, ch.Key)
	if ch.New == nil {
		delete(ix.requests, ch.Key)
		return
	}
	ix.requests[ch.Key] = ch.New
	r := &ch.New.Value
	switch {
	case r.State == kv.RequestRequested:
		ix.waiting[ch.Key] = ch.New
	case r.State == kv.RequestPending && r.Provider == ix.provider && r.Pool == ix.pool:
		ix.pending[ch.Key] = ch.New
		ix.dirty[ch.Key] = true
	}
}

// applyNode indexes a change of a node.
func (ix *poolIndex) applyNode(ch kv.Change[kv.Node]) {
	ix.used.apply(ch)
	inPool := func(e *kv.Entry[kv.Node]) bool {
		return e != nil && e.Value.Provider == ix.provider && e.Value.Pool == ix.pool
	}
	if inPool(ch.Old) {
		n := &ch.Old.Value
		for _, label := range n.Labels {
			delete(ix.free[label], ch.Key)
		}
		if n.AllocatedTo != "" {
			delete(ix.byRequest[n.AllocatedTo], ch.Key)
			if len(ix.byRequest[n.AllocatedTo]) == 0 {
				delete(ix.byRequest, n.AllocatedTo)
			}
			ix.dirty[n.AllocatedTo] = true
		}
	}
	if !inPool(ch.New) {
		delete(ix.poolNodes, ch.Key)
		return
	}
	ix.poolNodes[ch.Key] = ch.New
	n := &ch.New.Value
	switch {
	case n.AllocatedTo != "":
		if ix.byRequest[n.AllocatedTo] == nil {
			ix.byRequest[n.AllocatedTo] = map[string]bool{}
		}
		ix.byRequest[n.AllocatedTo][ch.Key] = true
		ix.suspects[ch.Key] = true
		ix.dirty[n.AllocatedTo] = true
	case n.State == kv.NodeReady:
		// A node with several labels (a static host) is free for each.
		for _, label := range n.Labels {
			if ix.free[label] == nil {
				ix.free[label] = map[string]bool{}
			}
			ix.free[label][ch.Key] = true
		}
	}
}

// markAll marks everything for a look, as a safety net under the indexes.
func (ix *poolIndex) markAll() {
	for id := range ix.pending {
		ix.dirty[id] = true
	}
	for _, nodes := range ix.byRequest {
		for id := range nodes {
			ix.suspects[id] = true
		}
	}
}
