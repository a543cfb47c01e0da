package metastatic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/record"
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
//
// A record it cannot read (a backing request of ours whose requestor_data
// is not valid, a node held by us without a valid slot map) is dealt with
// on its own and never stops the others; a pass that panics all the same
// is logged and the next one runs at the next tick.
func (p *Provider) Manage(ctx context.Context, interval time.Duration) {
	if err := p.synced(ctx); err != nil {
		return
	}
	p.awaitIntake(ctx)
	nodesChanged, stopNodes := p.nodes.Changes()
	defer stopNodes()
	requestsChanged, stopRequests := p.requests.Changes()
	defer stopRequests()
	tick := p.clock.NewTicker(interval)
	defer tick.Stop()
	// One term of the manager at a time in a process (its lease): the
	// terms share what they filed.
	m := &manager{p: p, filed: p.filed, orphans: map[string]int{}, broken: map[string]uint64{}}
	for {
		if !m.safePass(ctx) {
			// No hot loop on a pass that fails: the next one waits for
			// the tick.
			select {
			case <-ctx.Done():
				return
			case <-tick.C():
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-nodesChanged:
		case <-requestsChanged:
		case <-tick.C():
		}
		// Let a burst of changes settle into one pass. The settling is
		// in real time, whatever the provider's clock: it spaces the
		// passes out, and decides nothing.
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
	}
}

// safePass runs a pass; it reports false if the pass panicked.
func (m *manager) safePass(ctx context.Context) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			m.p.log.Error("metastatic manager pass failed; trying again at the next tick", "panic", r, "stack", string(debug.Stack()))
			ok = false
		}
	}()
	m.pass(ctx)
	return true
}

// manager is one term of Manage.
type manager struct {
	p *Provider
	// filed are backing requests published by this process whose records
	// have not shown up yet: they count as open, so that a burst of
	// changes, or a new term of the manager, does not publish the same
	// request twice (the provider's map, shared by its terms).
	filed map[string]filed
	// orphans counts the passes that saw a ready carved node whose backing
	// node is gone (deleted by an operator, say).
	orphans map[string]int
	// broken are records whose handling panicked, by key, with the
	// revision that did: they are left alone until they change.
	broken map[string]uint64
}

// filed is a backing request this process published, or began to.
type filed struct {
	group string
	data  RequestData
	at    time.Time
	// msg is what was published; stored says that the stream
	// acknowledged it. A publish cut short (the term ended: its lease
	// was lost) may have been stored all the same: it counts as filed,
	// and the next pass publishes it again under the same id, which the
	// stream takes once (its Nats-Msg-Id) and the intake records once.
	msg    events.RequestMessage
	stored bool
}

// ourRequest is a backing request of ours with its requestor_data.
type ourRequest struct {
	record.Entry[record.Request]
	data RequestData
}

// guard runs the handling of one record. A panic (a record no check
// caught, or a bug) is logged, and the record is left alone until it
// changes, so that one record never stops the others or loops.
func (m *manager) guard(kind, key string, rev uint64, fn func()) {
	bkey := kind + "/" + key
	if r, ok := m.broken[bkey]; ok && r == rev {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			m.broken[bkey] = rev
			m.p.log.Error("could not handle a record; leaving it alone until it changes", kind, key, "revision", rev, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	fn()
}

func (m *manager) pass(ctx context.Context) {
	p := m.p
	now := p.clock.Now().UTC()

	// Backing requests, as they are now (one view for the whole pass):
	// take what was fulfilled first, so that the slots it brings count
	// below; fail what is not valid.
	m.republish(ctx, now)
	requests := m.readRequests(ctx, now)
	untaken := m.adoptFulfilled(ctx, requests)

	backings := p.backings()
	m.releaseUnreadable(ctx)
	waiting, waitingIn := m.waitingNodes(allocatedNodes(backings))

	m.dropOrphans(ctx, backings)
	for _, r := range requests {
		if r.Value.State == record.RequestFailed {
			m.guard("request", r.Key, r.Revision, func() { m.clearFailed(ctx, r.Entry, waiting, now) })
		}
	}

	d := m.count(requests, untaken, backings, now)
	m.coverWaiting(ctx, waiting, d, now)
	m.releaseIdle(ctx, backings, waitingIn, now)
}

// readRequests returns the backing requests of ours that are valid, and
// fails (or, failed long enough, deletes) those that are not.
func (m *manager) readRequests(ctx context.Context, now time.Time) []ourRequest {
	p := m.p
	type refused struct {
		e   record.Entry[record.Request]
		why error
	}
	var requests []ourRequest
	var invalid []refused
	p.requests.Range(func(e *record.Entry[record.Request]) bool {
		d, ours, err := p.backingRequest(&e.Value)
		switch {
		case !ours:
		case err != nil:
			invalid = append(invalid, refused{*e, err})
		default:
			requests = append(requests, ourRequest{Entry: *e, data: d})
		}
		return true
	})
	for _, x := range invalid {
		m.guard("request", x.e.Key, x.e.Revision, func() { m.refuse(ctx, x.e, x.why, now) })
	}
	return requests
}

// adoptFulfilled takes the backing nodes of the fulfilled requests; it
// returns the fulfilled requests whose node is still to take.
func (m *manager) adoptFulfilled(ctx context.Context, requests []ourRequest) map[string]bool {
	untaken := map[string]bool{}
	for _, r := range requests {
		if r.Value.State != record.RequestFulfilled {
			continue
		}
		untaken[r.Key] = true
		m.guard("request", r.Key, r.Revision, func() {
			if m.adopt(ctx, r.Entry) {
				delete(untaken, r.Key)
			}
		})
	}
	return untaken
}

// waitingNodes are the carved nodes that wait for a slot (building, their
// machine found none), by id, and how many wait by backing label.
func (m *manager) waitingNodes(allocated map[string]bool) (map[string]*record.Node, map[string]int) {
	p := m.p
	waiting := map[string]*record.Node{}
	waitingIn := map[string]int{}
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		n := &e.Value
		if n.Provider != p.cfg.Name || n.State != record.NodeBuilding || allocated[e.Key] || len(n.Labels) == 0 {
			return true
		}
		if d, err := decodeCarved(n.DriverData); err == nil && d.Step == StepWaiting {
			nc := *n
			waiting[e.Key] = &nc
			waitingIn[p.backingLabel(n.Pool, n.Labels[0])]++
		}
		return true
	})
	return waiting, waitingIn
}

// demand is what a pass counts of the backing labels' slots.
type demand struct {
	// open are the backing requests not yet fulfilled, by backing label.
	open map[string][]ourRequest
	// room is the room for waiting nodes, by backing label: the free
	// slots of backing nodes and of fulfilled requests whose node is
	// still to take, which the nodes' machines take themselves, and the
	// slots of backing requests not yet fulfilled (their node booting),
	// which the nodes they list are waiting for.
	room map[string]int
	// covered are the nodes listed by a backing request not fulfilled,
	// or failed.
	covered map[string]bool
}

// count counts the room for waiting nodes that backing requests (those
// of the records, and those filed in this term whose records have not
// shown up yet) and backing nodes make.
func (m *manager) count(requests []ourRequest, untaken map[string]bool, backings []backing, now time.Time) demand {
	d := demand{open: map[string][]ourRequest{}, room: map[string]int{}, covered: map[string]bool{}}
	for _, r := range requests {
		delete(m.filed, r.Key)
		group := r.Value.Labels[0]
		switch r.Value.State {
		case record.RequestRequested, record.RequestPending:
			d.open[group] = append(d.open[group], r)
		case record.RequestFulfilled:
			if untaken[r.Key] {
				d.room[group] += r.data.Slots
			}
			continue
		}
		for _, id := range r.data.Nodes {
			d.covered[id] = true
		}
	}
	m.countFiled(d, now)
	for _, b := range backings {
		if !m.p.retired(&b, now) {
			d.room[b.group] += b.data.Slots - b.data.Used()
		}
	}
	return d
}

// countFiled counts the backing requests filed in this term whose records
// have not shown up yet, and forgets those filed too long ago.
func (m *manager) countFiled(d demand, now time.Time) {
	for id, f := range m.filed {
		if now.Sub(f.at) > filedTimeout {
			delete(m.filed, id)
			continue
		}
		for _, nid := range f.data.Nodes {
			d.covered[nid] = true
		}
		// Its room is filled once its record shows up.
		d.room[f.group] += f.data.Slots - len(f.data.Nodes)
	}
}

// coverWaiting gives the waiting nodes that no request covers free slots,
// room in open requests, or new backing requests.
func (m *manager) coverWaiting(ctx context.Context, waiting map[string]*record.Node, d demand, now time.Time) {
	uncovered := map[string][]*record.Node{}
	for id, n := range waiting {
		if d.covered[id] {
			continue
		}
		if group := m.p.backingLabel(n.Pool, n.Labels[0]); group != "" {
			uncovered[group] = append(uncovered[group], n)
		}
	}
	for group, nodes := range uncovered {
		slices.SortFunc(nodes, func(a, b *record.Node) int {
			return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
		})
		skip := min(len(nodes), max(d.room[group], 0))
		m.cover(ctx, group, nodes[skip:], d.open[group], now)
	}
}

// releaseIdle gives back the backing nodes that are no longer needed.
func (m *manager) releaseIdle(ctx context.Context, backings []backing, waitingIn map[string]int, now time.Time) {
	for _, b := range backings {
		if b.data.Used() == 0 && m.p.unneeded(&b, waitingIn, now) {
			m.release(ctx, b.Key, now)
		}
	}
}

// unneeded reports whether an empty backing node is to be given back: it
// is retired, or its backing label is no longer configured; or no carved
// node waits to take a slot of it and it stayed empty for grace-time and
// was kept for min-retention-time.
func (p *Provider) unneeded(b *backing, waitingIn map[string]int, now time.Time) bool {
	lc, known := p.settings(b.group)
	retired := p.retired(b, now)
	idleSince := b.data.Taken
	if b.data.IdleSince != nil {
		idleSince = *b.data.IdleSince
	}
	switch {
	case !known, retired:
		return true
	case waitingIn[b.group] > 0:
		return false // a waiting node is about to take a slot
	case now.Sub(idleSince) < lc.GraceTime.D(), now.Sub(b.Value.Created) < lc.MinRetentionTime.D():
		return false
	}
	return true
}

// allocatedNodes is the set of carved nodes that have a slot.
func allocatedNodes(backings []backing) map[string]bool {
	out := map[string]bool{}
	for _, b := range backings {
		for _, id := range b.data.Allocations {
			if id != "" {
				out[id] = true
			}
		}
	}
	return out
}

// refuse fails a backing request of ours whose requestor_data is not valid
// (made by hand, corrupt, or from a newer version), saying why, so that
// its node, if any, goes back to its pool; it is deleted after a while.
func (m *manager) refuse(ctx context.Context, e record.Entry[record.Request], why error, now time.Time) {
	p := m.p
	if e.Value.State == record.RequestFailed {
		if now.Sub(e.Value.StateTime) >= failedRequestKeep {
			m.deleteRequest(ctx, e)
		}
		return
	}
	reason := fmt.Sprintf("not a backing request metastatic provider %s can use: %v", p.cfg.Name, why)
	_, err := p.requests.Modify(ctx, e.Key, func(r *record.Request) error {
		if _, ours, err := p.backingRequest(r); !ours || err == nil || r.State == record.RequestFailed {
			return record.ErrSkip
		}
		r.SetState(record.RequestFailed, now)
		r.Reason = reason
		return nil
	})
	switch {
	case err == nil:
		p.log.Warn("failed a backing request that is not valid", "request", e.Key, "reason", reason)
	case !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil:
		p.log.Warn("could not fail a backing request that is not valid", "request", e.Key, "err", err)
	}
}

// releaseUnreadable gives back nodes held by this provider whose user_data
// is not a valid slot map (corrupt, or written by hand), once no carved
// node names them as its backing node: nothing could ever free them
// otherwise.
func (m *manager) releaseUnreadable(ctx context.Context) {
	p := m.p
	unreadable := map[string]error{}
	named := map[string]bool{}
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		n := &e.Value
		if _, held, err := p.held(n); held && err != nil {
			unreadable[e.Key] = err
		}
		if n.Provider == p.cfg.Name {
			if d, err := decodeCarved(n.DriverData); err == nil && d.BackingNode != "" {
				named[d.BackingNode] = true
			}
		}
		return true
	})
	for id, why := range unreadable {
		if named[id] {
			continue
		}
		now := p.clock.Now().UTC()
		_, err := p.nodes.Modify(ctx, id, func(n *record.Node) error {
			if _, held, err := p.held(n); !held || err == nil {
				return record.ErrSkip
			}
			n.SetState(record.NodeUsed, now)
			return nil
		})
		switch {
		case err == nil:
			p.log.Warn("gave back a node held by this provider without a valid slot map", "backing_node", id, "reason", why)
		case !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil:
			p.log.Warn("could not give back a node without a valid slot map", "backing_node", id, "err", err)
		}
	}
}

// dropOrphans deletes ready carved nodes whose backing node is no longer
// ours (an operator deleted it): they would be handed out with a machine
// that is gone. A node seen so in two passes in a row goes; one allocated
// to a request is then replaced by that request's pool.
func (m *manager) dropOrphans(ctx context.Context, backings []backing) {
	ours := map[string]bool{}
	for _, b := range backings {
		ours[b.Key] = true
	}
	seen := m.orphaned(ours)
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
		m.deleteOrphan(ctx, id, ours)
		delete(m.orphans, id)
	}
}

// orphaned is the set of ready carved nodes whose backing node is not
// one of ours.
func (m *manager) orphaned(ours map[string]bool) map[string]bool {
	p := m.p
	seen := map[string]bool{}
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		n := &e.Value
		if n.Provider != p.cfg.Name || n.State != record.NodeReady {
			return true
		}
		if d, err := decodeCarved(n.DriverData); err == nil && d.BackingNode != "" && !ours[d.BackingNode] {
			seen[e.Key] = true
		}
		return true
	})
	return seen
}

// deleteOrphan deletes a ready carved node whose backing node is still not
// one of ours.
func (m *manager) deleteOrphan(ctx context.Context, id string, ours map[string]bool) {
	p := m.p
	_, err := p.nodes.Modify(ctx, id, func(n *record.Node) error {
		d, err := decodeCarved(n.DriverData)
		if n.State != record.NodeReady || err != nil || ours[d.BackingNode] {
			return record.ErrSkip
		}
		p.log.Info("deleting a carved node whose backing node is gone", "node", id, "backing_node", d.BackingNode)
		n.SetState(record.NodeDeleting, p.clock.Now().UTC())
		n.Launcher = ""
		n.Comment = "backing node " + d.BackingNode + " is gone"
		return nil
	})
	if err != nil && !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil {
		p.log.Warn("could not delete orphaned carved node", "node", id, "err", err)
	}
}

// errNotOpen: a backing request is no longer waiting for its node.
var errNotOpen = errors.New("backing request no longer open")

// cover puts carved nodes that wait for a slot on a backing node of a
// backing label into open backing requests with room, and files new
// backing requests for the rest.
func (m *manager) cover(ctx context.Context, group string, nodes []*record.Node, open []ourRequest, now time.Time) {
	if len(nodes) == 0 {
		return
	}
	lc, ok := m.p.settings(group)
	if !ok {
		return
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	ids, ok = m.joinOpen(ctx, ids, open)
	if !ok {
		return
	}
	m.fileRequests(ctx, group, ids, slotsOf(lc), now)
}

// stillWaiting reports whether a carved node still waits for its slot.
func (m *manager) stillWaiting(id string) bool { return m.p.waiting(id) }

// joinOpen puts carved nodes into open backing requests with room, and
// returns those left. It reports false when a request was fulfilled (or
// went) since the pass looked: its slots may be the room these nodes
// need, and the change brings another pass, which counts again.
func (m *manager) joinOpen(ctx context.Context, ids []string, open []ourRequest) ([]string, bool) {
	for _, r := range open {
		if len(ids) == 0 {
			break
		}
		if m.full(r) {
			continue
		}
		added, err := m.join(ctx, r.Key, ids)
		switch {
		case errors.Is(err, errNotOpen), errors.Is(err, record.ErrNotFound):
			return nil, false
		case err != nil:
			continue
		}
		ids = slices.DeleteFunc(ids, func(id string) bool { return slices.Contains(added, id) })
	}
	return ids, true
}

// full reports whether as many carved nodes as an open backing request
// has slots still wait for it.
func (m *manager) full(r ourRequest) bool {
	live := 0
	for _, id := range r.data.Nodes {
		if m.stillWaiting(id) {
			live++
		}
	}
	return live >= r.data.Slots
}

// join adds carved nodes to an open backing request, as many as it has
// room for, and returns those it added.
func (m *manager) join(ctx context.Context, key string, ids []string) ([]string, error) {
	p := m.p
	var added []string
	_, err := p.requests.Modify(ctx, key, func(req *record.Request) error {
		if req.State != record.RequestRequested && req.State != record.RequestPending {
			return errNotOpen
		}
		d, ours, err := p.backingRequest(req)
		if !ours || err != nil {
			return record.ErrSkip
		}
		// Nodes that stopped waiting (failed, deleted) leave room.
		d.Nodes = slices.DeleteFunc(d.Nodes, func(id string) bool { return !m.stillWaiting(id) })
		room := d.Slots - len(d.Nodes)
		if room <= 0 {
			return record.ErrSkip
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
	return added, err
}

// fileRequests files backing requests of slots slots each for carved
// nodes, until they are all covered or one cannot be filed.
func (m *manager) fileRequests(ctx context.Context, group string, ids []string, slots int, now time.Time) {
	for len(ids) > 0 {
		n := min(len(ids), slots)
		chunk := ids[:n]
		ids = ids[n:]
		if !m.fileRequest(ctx, group, chunk, slots, now) {
			return
		}
	}
}

// fileRequest files a backing request for carved nodes, named after the
// first one's pool and label; it reports false when it could not.
func (m *manager) fileRequest(ctx context.Context, group string, chunk []string, slots int, now time.Time) bool {
	p := m.p
	first, _ := p.nodes.Get(chunk[0])
	label := ""
	if len(first.Value.Labels) > 0 {
		label = first.Value.Labels[0]
	}
	id := newRequestID()
	d := RequestData{Provider: p.cfg.Name, Pool: first.Value.Pool, Label: label, Slots: slots, Nodes: slices.Clone(chunk)}
	msg := events.RequestMessage{ID: id, Labels: []string{group}, Requestor: p.me, RequestorData: encodeJSON(d)}
	// Counted as filed before it is published: a publish that the end of
	// the term cuts short may be stored (see filed.stored).
	m.filed[id] = filed{group: group, data: d, at: now, msg: msg}
	if _, err := events.PublishRequest(ctx, p.js, msg); err != nil {
		if ctx.Err() == nil {
			delete(m.filed, id)
			p.log.Warn("could not request a backing node", "label", group, "err", err)
		}
		return false
	}
	m.stored(id)
	p.log.Info("requested a backing node", "request", id, "backing_label", group, "waiting", chunk)
	return true
}

// stored marks a filed request as acknowledged by the stream.
func (m *manager) stored(id string) {
	if f, ok := m.filed[id]; ok {
		f.stored = true
		m.filed[id] = f
	}
}

// republish publishes again, under their ids, the filed requests whose
// publish an earlier term's end cut short: the stream takes a message
// stored already as a duplicate, and stores one that was not. Each counts
// as filed from now. One cut short more than filedTimeout ago is forgotten
// instead: published again after the stream's duplicate window (two
// minutes), it would be a new request if its record came and went
// meanwhile.
func (m *manager) republish(ctx context.Context, now time.Time) {
	for id, f := range m.filed {
		if f.stored {
			continue
		}
		if now.Sub(f.at) > filedTimeout {
			delete(m.filed, id)
			continue
		}
		if _, err := events.PublishRequest(ctx, m.p.js, f.msg); err != nil {
			return // the term is over too; the next one tries again
		}
		f.stored, f.at = true, now
		m.filed[id] = f
		m.p.log.Info("published again a backing request whose publish was cut short", "request", id)
	}
}

// adopt takes the backing node of a fulfilled backing request, as any
// requestor takes its nodes (ready to in-use, with a holder), recording an
// empty slot map in the same update; then the request is deleted. The
// carved nodes waiting for it take its slots themselves: a slot is only
// ever given by the machine of its carved node, so that no node can get
// two. It reports false when the node is still to take (a passing
// trouble with the records).
func (m *manager) adopt(ctx context.Context, e record.Entry[record.Request]) bool {
	p := m.p
	r := &e.Value
	d, _, err := p.backingRequest(r)
	if err != nil || len(r.Nodes) != 1 {
		m.deleteRequest(ctx, e)
		return true
	}
	group := r.Labels[0]
	nodeID := r.Nodes[0]
	now := p.clock.Now().UTC()
	bd := BackingData{Owner: p.me, Pool: d.Pool, Label: d.Label, Slots: d.Slots, Allocations: make([]string, d.Slots), Request: r.ID, Taken: now, IdleSince: &now,
		Reserved: slices.Clone(d.Nodes[:min(len(d.Nodes), d.Slots)])}
	cur, err := p.nodes.Modify(ctx, nodeID, func(n *record.Node) error {
		if n.State != record.NodeReady || n.AllocatedTo != r.ID || len(n.Labels) != 1 || n.Labels[0] != group {
			return record.ErrSkip
		}
		n.SetState(record.NodeInUse, now)
		n.Holder = p.me
		n.LeaseUntil = nil
		n.UserData = encodeJSON(bd)
		return nil
	})
	switch {
	case err == nil:
		p.log.Info("took a backing node", "backing_node", nodeID, "request", r.ID, "backing_label", group, "slots", d.Slots, "waiting", d.Nodes)
	case errors.Is(err, record.ErrSkip):
		if bdata, ours := p.owned(&cur.Value); !ours || bdata.Request != r.ID {
			// Not ready for us and not ours: something else happened
			// to it (an operator's delete); the request is of no use.
			p.log.Warn("backing node of a fulfilled request is not there to take", "backing_node", nodeID, "request", r.ID, "state", cur.Value.State)
		}
	case errors.Is(err, record.ErrNotFound):
		p.log.Warn("backing node of a fulfilled request is gone", "backing_node", nodeID, "request", r.ID)
	default:
		return false // try again next pass
	}
	m.deleteRequest(ctx, e)
	return true
}

// clearFailed deletes a failed backing request once no carved node waits
// for it any more (they fail with its reason), or after a while.
func (m *manager) clearFailed(ctx context.Context, e record.Entry[record.Request], waiting map[string]*record.Node, now time.Time) {
	d, _, _ := m.p.backingRequest(&e.Value)
	if now.Sub(e.Value.StateTime) < failedRequestKeep && slices.ContainsFunc(d.Nodes, func(id string) bool { return waiting[id] != nil }) {
		return
	}
	m.deleteRequest(ctx, e)
}

func (m *manager) deleteRequest(ctx context.Context, e record.Entry[record.Request]) {
	err := m.p.requests.Delete(ctx, e.Key, e.Revision)
	if err != nil && !errors.Is(err, record.ErrConflict) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil {
		m.p.log.Warn("could not delete backing request", "request", e.Key, "err", err)
	}
}

// release gives an empty backing node back (used); its provider deletes it.
// The revision check makes sure no slot was taken meanwhile.
func (m *manager) release(ctx context.Context, id string, now time.Time) {
	p := m.p
	_, err := p.nodes.Modify(ctx, id, func(n *record.Node) error {
		d, ok := p.owned(n)
		if !ok || d.Used() > 0 {
			return record.ErrSkip
		}
		d.Released = &now
		n.UserData = encodeJSON(d)
		n.SetState(record.NodeUsed, now)
		return nil
	})
	switch {
	case err == nil:
		p.log.Info("gave back a backing node", "backing_node", id)
	case !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil:
		p.log.Warn("could not give back a backing node", "backing_node", id, "err", err)
	}
}
