package metastatic

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// filedTimeout is how long a backing request published by this process
// counts as open before its record shows up.
const filedTimeout = 30 * time.Second

// settle is how long a pass waits for a burst of record changes to end.
const settle = 20 * time.Millisecond

// failedRequestKeep is how long a failed backing request is kept for the
// carved nodes waiting for it to read why, at most.
const failedRequestKeep = 10 * time.Minute

// Manage runs the backing nodes of the provider in the one process holding
// its lease: it requests backing nodes for carved nodes that wait for a
// slot, takes the backing nodes of fulfilled requests (giving their first
// slots to the nodes that waited for them), and gives back backing nodes
// that stayed empty for grace-time, or that are past max-age and empty.
func (p *Provider) Manage(ctx context.Context, interval time.Duration) {
	if err := p.synced(ctx); err != nil {
		return
	}
	nodeSub := p.nodes.Subscribe()
	defer p.nodes.Unsubscribe(nodeSub)
	reqSub := p.requests.Subscribe()
	defer p.requests.Unsubscribe(reqSub)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	m := &manager{p: p, filed: map[string]filed{}, orphans: map[string]int{}}
	for {
		nodeSub.Drain()
		reqSub.Drain()
		m.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-nodeSub.C():
		case <-reqSub.C():
		case <-tick.C:
		}
		// Let a burst of changes settle into one pass.
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
	}
}

// manager is one term of Manage.
type manager struct {
	p *Provider
	// filed are backing requests published in this term whose records
	// have not shown up yet: they count as open, so that a burst of
	// changes does not publish the same request twice.
	filed map[string]filed
	// orphans counts the passes that saw a ready carved node whose backing
	// node is gone (deleted by an operator, say).
	orphans map[string]int
}

type filed struct {
	data RequestData
	at   time.Time
}

// poolLabel is a metastatic pool's label.
type poolLabel struct{ pool, label string }

// openRequest is a backing request not yet fulfilled.
type openRequest struct {
	id   string
	data RequestData
}

func (m *manager) pass(ctx context.Context) {
	p := m.p
	now := time.Now().UTC()
	backings := p.backings()
	allocated := map[string]bool{}
	for _, b := range backings {
		for _, id := range b.data.Allocations {
			if id != "" {
				allocated[id] = true
			}
		}
	}

	// Waiting carved nodes: building, their machine found no slot.
	waiting := map[string]*kv.Node{}
	p.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if n.Provider != p.cfg.Name || n.State != kv.NodeBuilding || allocated[e.Key] || len(n.Labels) == 0 {
			return true
		}
		if d, ok := decodeJSON[CarvedData](n.DriverData); ok && d.Step == StepWaiting {
			nc := *n
			waiting[e.Key] = &nc
		}
		return true
	})

	m.dropOrphans(ctx, backings)

	// Backing requests: take what was fulfilled, clear away what failed,
	// count what is still open.
	open := map[poolLabel][]openRequest{}
	covered := map[string]bool{}
	var fulfilled, failed []kv.Entry[kv.Request]
	p.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := &e.Value
		if r.Requestor != p.me {
			return true
		}
		d, ok := decodeJSON[RequestData](r.RequestorData)
		if !ok || d.Provider != p.cfg.Name {
			return true
		}
		delete(m.filed, e.Key)
		for _, id := range d.Nodes {
			covered[id] = true
		}
		switch r.State {
		case kv.RequestFulfilled:
			fulfilled = append(fulfilled, *e)
		case kv.RequestFailed:
			failed = append(failed, *e)
		default:
			pl := poolLabel{d.Pool, d.Label}
			open[pl] = append(open[pl], openRequest{id: e.Key, data: d})
		}
		return true
	})
	for _, e := range fulfilled {
		m.adopt(ctx, e, allocated)
	}
	for _, e := range failed {
		m.clearFailed(ctx, e, waiting, now)
	}
	filedRoom := map[poolLabel]int{}
	for id, f := range m.filed {
		if now.Sub(f.at) > filedTimeout {
			delete(m.filed, id)
			continue
		}
		for _, nid := range f.data.Nodes {
			covered[nid] = true
		}
		filedRoom[poolLabel{f.data.Pool, f.data.Label}] += f.data.Slots - len(f.data.Nodes)
	}

	// Carved nodes that no request covers get free slots, room in open
	// requests, or new backing requests.
	uncovered := map[poolLabel][]*kv.Node{}
	for id, n := range waiting {
		if !covered[id] {
			pl := poolLabel{n.Pool, n.Labels[0]}
			uncovered[pl] = append(uncovered[pl], n)
		}
	}
	freeSlots := map[poolLabel]int{}
	for _, b := range backings {
		if !p.retired(&b, now) {
			freeSlots[poolLabel{b.data.Pool, b.data.Label}] += b.data.Slots - b.data.Used()
		}
	}
	for pl, nodes := range uncovered {
		slices.SortFunc(nodes, func(a, b *kv.Node) int {
			return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
		})
		// The machines take free slots themselves; and the room of
		// requests published but not recorded yet will be filled next
		// pass.
		skip := min(len(nodes), freeSlots[pl]+max(filedRoom[pl], 0))
		m.cover(ctx, pl, nodes[skip:], open[pl], now)
	}

	// Give back backing nodes that are no longer needed.
	for _, b := range backings {
		if b.data.Used() > 0 {
			continue
		}
		pl := poolLabel{b.data.Pool, b.data.Label}
		lc, known := p.label(pl.pool, pl.label)
		retired := p.retired(&b, now)
		idleSince := b.data.Taken
		if b.data.IdleSince != nil {
			idleSince = *b.data.IdleSince
		}
		switch {
		case !known, retired:
		case len(uncovered[pl]) > 0:
			continue // a waiting node is about to take a slot
		case now.Sub(idleSince) < lc.GraceTime.D(), now.Sub(b.Value.Created) < lc.MinRetentionTime.D():
			continue
		}
		m.release(ctx, b.Key, now)
	}
}

// dropOrphans deletes ready carved nodes whose backing node is no longer
// ours (an operator deleted it): they would be handed out with a machine
// that is gone. A node seen so in two passes in a row goes; one allocated
// to a request is then replaced by that request's pool.
func (m *manager) dropOrphans(ctx context.Context, backings []backing) {
	p := m.p
	ours := map[string]bool{}
	for _, b := range backings {
		ours[b.Key] = true
	}
	seen := map[string]bool{}
	p.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if n.Provider != p.cfg.Name || n.State != kv.NodeReady {
			return true
		}
		if d, ok := decodeJSON[CarvedData](n.DriverData); ok && d.BackingNode != "" && !ours[d.BackingNode] {
			seen[e.Key] = true
		}
		return true
	})
	for id := range m.orphans {
		if !seen[id] {
			delete(m.orphans, id)
		}
	}
	for id := range seen {
		m.orphans[id]++
		if m.orphans[id] < 2 {
			continue
		}
		_, err := p.nodes.Modify(ctx, id, func(n *kv.Node) error {
			d, ok := decodeJSON[CarvedData](n.DriverData)
			if n.State != kv.NodeReady || !ok || ours[d.BackingNode] {
				return kv.ErrSkip
			}
			p.log.Info("deleting a carved node whose backing node is gone", "node", id, "backing_node", d.BackingNode)
			n.SetState(kv.NodeDeleting, time.Now().UTC())
			n.Launcher = ""
			n.Comment = "backing node " + d.BackingNode + " is gone"
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			p.log.Warn("could not delete orphaned carved node", "node", id, "err", err)
		}
		delete(m.orphans, id)
	}
}

// cover puts carved nodes that wait for a slot into open backing requests
// with room, and files new backing requests for the rest.
func (m *manager) cover(ctx context.Context, pl poolLabel, nodes []*kv.Node, open []openRequest, now time.Time) {
	p := m.p
	if len(nodes) == 0 {
		return
	}
	lc, ok := p.label(pl.pool, pl.label)
	if !ok {
		return
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	stillWaiting := func(id string) bool {
		ce, ok := p.nodes.Get(id)
		return ok && ce.Value.State == kv.NodeBuilding
	}
	for _, r := range open {
		if len(ids) == 0 {
			return
		}
		live := 0
		for _, id := range r.data.Nodes {
			if stillWaiting(id) {
				live++
			}
		}
		if live >= r.data.Slots {
			continue
		}
		var added []string
		_, err := p.requests.Modify(ctx, r.id, func(req *kv.Request) error {
			if req.State != kv.RequestRequested && req.State != kv.RequestPending {
				return kv.ErrSkip
			}
			d, ok := decodeJSON[RequestData](req.RequestorData)
			if !ok {
				return kv.ErrSkip
			}
			// Nodes that stopped waiting (failed, deleted) leave room.
			d.Nodes = slices.DeleteFunc(d.Nodes, func(id string) bool { return !stillWaiting(id) })
			room := d.Slots - len(d.Nodes)
			if room <= 0 {
				return kv.ErrSkip
			}
			added = nil
			for _, id := range ids {
				if len(added) == room {
					break
				}
				if !slices.Contains(d.Nodes, id) {
					added = append(added, id)
				}
			}
			d.Nodes = append(d.Nodes, added...)
			req.RequestorData = encodeJSON(d)
			return nil
		})
		if err != nil {
			continue
		}
		ids = slices.DeleteFunc(ids, func(id string) bool { return slices.Contains(added, id) })
	}
	for len(ids) > 0 {
		n := min(len(ids), lc.MaxParallelJobs)
		chunk := ids[:n]
		ids = ids[n:]
		id := newRequestID()
		d := RequestData{Provider: p.cfg.Name, Pool: pl.pool, Label: pl.label, Slots: lc.MaxParallelJobs, Nodes: slices.Clone(chunk)}
		msg := events.RequestMessage{ID: id, Labels: []string{lc.BackingLabel}, Requestor: p.me, RequestorData: encodeJSON(d)}
		if _, err := events.PublishRequest(ctx, p.js, msg); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("could not request a backing node", "label", lc.BackingLabel, "err", err)
			}
			return
		}
		m.filed[id] = filed{data: d, at: now}
		p.log.Info("requested a backing node", "request", id, "backing_label", lc.BackingLabel, "pool", pl.pool, "label", pl.label, "waiting", chunk)
	}
}

// adopt takes the backing node of a fulfilled backing request, as any
// requestor takes its nodes (ready to in-use, with a holder), recording its
// slot map, with the first slots given to the carved nodes that waited for
// it; then the request is deleted.
func (m *manager) adopt(ctx context.Context, e kv.Entry[kv.Request], allocated map[string]bool) {
	p := m.p
	r := &e.Value
	d, _ := decodeJSON[RequestData](r.RequestorData)
	if len(r.Nodes) != 1 {
		m.deleteRequest(ctx, e)
		return
	}
	nodeID := r.Nodes[0]
	now := time.Now().UTC()
	slots := make([]string, d.Slots)
	k := 0
	for _, id := range d.Nodes {
		ce, ok := p.nodes.Get(id)
		if k < len(slots) && ok && !allocated[id] && ce.Value.Provider == p.cfg.Name && ce.Value.State == kv.NodeBuilding &&
			ce.Value.Pool == d.Pool && len(ce.Value.Labels) > 0 && ce.Value.Labels[0] == d.Label {
			slots[k] = id
			k++
		}
	}
	bd := BackingData{Owner: p.me, Pool: d.Pool, Label: d.Label, Slots: d.Slots, Allocations: slots, Request: r.ID, Taken: now}
	if k == 0 {
		bd.IdleSince = &now
	}
	cur, err := p.nodes.Modify(ctx, nodeID, func(n *kv.Node) error {
		if n.State != kv.NodeReady || n.AllocatedTo != r.ID {
			return kv.ErrSkip
		}
		n.SetState(kv.NodeInUse, now)
		n.Holder = p.me
		n.LeaseUntil = nil
		n.UserData = encodeJSON(bd)
		return nil
	})
	switch {
	case err == nil:
		p.log.Info("took a backing node", "backing_node", nodeID, "request", r.ID, "pool", d.Pool, "label", d.Label, "slots", d.Slots, "allocated", slots[:k])
	case errors.Is(err, kv.ErrSkip):
		if bdata, ours := p.owned(&cur.Value); !ours || bdata.Request != r.ID {
			// Not ready for us and not ours: something else happened
			// to it (an operator's delete); the request is of no use.
			p.log.Warn("backing node of a fulfilled request is not there to take", "backing_node", nodeID, "request", r.ID, "state", cur.Value.State)
		}
	case errors.Is(err, kv.ErrNotFound):
		p.log.Warn("backing node of a fulfilled request is gone", "backing_node", nodeID, "request", r.ID)
	default:
		return // try again next pass
	}
	m.deleteRequest(ctx, e)
}

// clearFailed deletes a failed backing request once no carved node waits
// for it any more (they fail with its reason), or after a while.
func (m *manager) clearFailed(ctx context.Context, e kv.Entry[kv.Request], waiting map[string]*kv.Node, now time.Time) {
	d, _ := decodeJSON[RequestData](e.Value.RequestorData)
	if now.Sub(e.Value.StateTime) < failedRequestKeep && slices.ContainsFunc(d.Nodes, func(id string) bool { return waiting[id] != nil }) {
		return
	}
	m.deleteRequest(ctx, e)
}

func (m *manager) deleteRequest(ctx context.Context, e kv.Entry[kv.Request]) {
	err := m.p.b.Requests.Delete(ctx, e.Key, e.Revision)
	if err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		m.p.log.Warn("could not delete backing request", "request", e.Key, "err", err)
	}
}

// release gives an empty backing node back (used); its provider deletes it.
// The revision check makes sure no slot was taken meanwhile.
func (m *manager) release(ctx context.Context, id string, now time.Time) {
	p := m.p
	_, err := p.nodes.Modify(ctx, id, func(n *kv.Node) error {
		d, ok := p.owned(n)
		if !ok || d.Used() > 0 {
			return kv.ErrSkip
		}
		d.Released = &now
		n.UserData = encodeJSON(d)
		n.SetState(kv.NodeUsed, now)
		return nil
	})
	switch {
	case err == nil:
		p.log.Info("gave back a backing node", "backing_node", id)
	case !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil:
		p.log.Warn("could not give back a backing node", "backing_node", id, "err", err)
	}
}
