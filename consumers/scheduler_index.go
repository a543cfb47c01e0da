package consumers

import "github.com/nodepool-nats/nodepool/kv"

// poolIndex holds the records one term of a pool's scheduler has seen,
// kept from the change queues of the caches (entries are immutable
// snapshots, so the pointers are safe to hold and need no locking in the
// loop), with indexes over them kept as they change, so that a pass looks
// only at what may need work, not at every node.
//
// A change is applied only if it is newer than what the index holds for
// its key (revisions compared), so the index never goes back to an older
// record than it has seen, whatever order changes arrive in. The term
// audits its index against the caches every sync interval (audit), so a
// change missed for any reason heals.
type poolIndex struct {
	provider, pool string

	requests map[string]*kv.Entry[kv.Request] // every request
	nodes    map[string]*kv.Entry[kv.Node]    // every node (usage counts the provider's and tenants')
	// gone* remember the revision at which keys were seen deleted, so a
	// late change of an older revision cannot bring them back.
	goneRequests map[string]uint64
	goneNodes    map[string]uint64

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
		requests: map[string]*kv.Entry[kv.Request]{}, nodes: map[string]*kv.Entry[kv.Node]{},
		goneRequests: map[string]uint64{}, goneNodes: map[string]uint64{},
		waiting: map[string]*kv.Entry[kv.Request]{}, pending: map[string]*kv.Entry[kv.Request]{},
		poolNodes: map[string]*kv.Entry[kv.Node]{},
		free:      map[string]map[string]bool{}, byRequest: map[string]map[string]bool{},
		used:     newUsage(provider, pool),
		suspects: map[string]bool{}, dirty: map[string]bool{},
	}
}

// newer reports whether a change of a key is newer than what the index
// holds for it (old, or the revision it was seen deleted at).
func newer[T any](old *kv.Entry[T], gone map[string]uint64, ch kv.Change[T]) bool {
	if ch.New == nil {
		// A deletion removes what it saw or anything older.
		return old != nil && ch.Revision >= old.Revision
	}
	if old != nil && ch.New.Revision <= old.Revision {
		return false
	}
	return ch.New.Revision > gone[ch.Key]
}

// applyRequest indexes a change of a request.
func (ix *poolIndex) applyRequest(ch kv.Change[kv.Request]) {
	old := ix.requests[ch.Key]
	if !newer(old, ix.goneRequests, ch) {
		if ch.New == nil {
			ix.goneRequests[ch.Key] = max(ix.goneRequests[ch.Key], ch.Revision)
		}
		return
	}
	// Nodes allocated to a request that changed or went may need freeing.
	for id := range ix.byRequest[ch.Key] {
		ix.suspects[id] = true
	}
	delete(ix.waiting, ch.Key)
	delete(ix.pending, ch.Key)
	if ch.New == nil {
		delete(ix.requests, ch.Key)
		ix.goneRequests[ch.Key] = ch.Revision
		return
	}
	delete(ix.goneRequests, ch.Key)
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
	old := ix.nodes[ch.Key]
	if !newer(old, ix.goneNodes, ch) {
		if ch.New == nil {
			ix.goneNodes[ch.Key] = max(ix.goneNodes[ch.Key], ch.Revision)
		}
		return
	}
	// What the index held is the old record, whatever the change says.
	ix.used.apply(kv.Change[kv.Node]{Key: ch.Key, Old: old, New: ch.New, Revision: ch.Revision})
	if ch.New == nil {
		delete(ix.nodes, ch.Key)
		ix.goneNodes[ch.Key] = ch.Revision
	} else {
		delete(ix.goneNodes, ch.Key)
		ix.nodes[ch.Key] = ch.New
	}
	inPool := func(e *kv.Entry[kv.Node]) bool {
		return e != nil && e.Value.Provider == ix.provider && e.Value.Pool == ix.pool
	}
	if inPool(old) {
		n := &old.Value
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

// audit brings the index in line with the records the caches hold (each
// of nodes and requests yields every record, has tells whether the cache
// holds a key): a record the index holds at another revision than the
// cache, or lacks, is indexed again as the cache holds it; one the cache
// no longer holds is dropped; and the revisions remembered for deleted
// keys are forgotten (a bucket made again starts its revisions from
// one). It returns how many records it indexed again or dropped. The
// caches' entries are never changed in place and the index holds the
// same pointers, so a record in line costs one lookup: building the index
// again, which this replaces, made a change of every record and used 0.7
// s of CPU every 5 s with 100,000 nodes. Changes queued meanwhile are
// applied after, and only if newer.
func (ix *poolIndex) audit(
	nodes func(func(*kv.Entry[kv.Node]) bool), hasNode func(string) bool,
	requests func(func(*kv.Entry[kv.Request]) bool), hasRequest func(string) bool,
) (healed int) {
	seen := 0
	nodes(func(e *kv.Entry[kv.Node]) bool {
		seen++
		if ix.nodes[e.Key] != e {
			ix.reindexNode(e.Key, e)
			healed++
		}
		return true
	})
	if len(ix.nodes) > seen {
		for key := range ix.nodes {
			if !hasNode(key) {
				ix.reindexNode(key, nil)
				healed++
			}
		}
	}
	seen = 0
	requests(func(e *kv.Entry[kv.Request]) bool {
		seen++
		if ix.requests[e.Key] != e {
			ix.reindexRequest(e.Key, e)
			healed++
		}
		return true
	})
	if len(ix.requests) > seen {
		for key := range ix.requests {
			if !hasRequest(key) {
				ix.reindexRequest(key, nil)
				healed++
			}
		}
	}
	clear(ix.goneNodes)
	clear(ix.goneRequests)
	return healed
}

// reindexNode drops what the index holds for a node and indexes e (nil:
// nothing) in its place, whatever their revisions.
func (ix *poolIndex) reindexNode(key string, e *kv.Entry[kv.Node]) {
	if old := ix.nodes[key]; old != nil {
		ix.applyNode(kv.Change[kv.Node]{Key: key, Old: old, Revision: old.Revision})
	}
	delete(ix.goneNodes, key)
	if e != nil {
		ix.applyNode(kv.Change[kv.Node]{Key: key, New: e, Revision: e.Revision})
	}
}

// reindexRequest is reindexNode for a request.
func (ix *poolIndex) reindexRequest(key string, e *kv.Entry[kv.Request]) {
	if old := ix.requests[key]; old != nil {
		ix.applyRequest(kv.Change[kv.Request]{Key: key, Old: old, Revision: old.Revision})
	}
	delete(ix.goneRequests, key)
	if e != nil {
		ix.applyRequest(kv.Change[kv.Request]{Key: key, New: e, Revision: e.Revision})
	}
}

// lookAgain has the next pass look at every pending request of the pool
// and every node allocated to a request, as if each had just changed.
func (ix *poolIndex) lookAgain() {
	for key := range ix.pending {
		ix.dirty[key] = true
	}
	for _, nodes := range ix.byRequest {
		for id := range nodes {
			ix.suspects[id] = true
		}
	}
}
