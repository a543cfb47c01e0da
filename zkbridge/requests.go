package zkbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/kv"
)

// A request of Zuul's goes through these steps, each taken by whichever
// bridge process reconciles it first (the request lock and the records'
// versions make every step happen once):
//
//  1. requested in ZooKeeper: the bridge declines it at once (its pool ids
//     in declined_by) if none of its pools has every label; otherwise it
//     records a NATS request for it (zk=<id>), which the pools' schedulers
//     serve in priority order beside every other request. While it waits
//     there, the ZooKeeper request is not locked, so Zuul may still revise
//     its relative_priority (copied to the NATS request) and other
//     launchers of the ensemble may still take it (the NATS request is
//     then withdrawn).
//  2. claimed by a pool in NATS: the bridge locks the ZooKeeper request
//     (kazoo's lock), reads it again and marks it pending; the lock is held
//     until the request ends.
//  3. fulfilled in NATS: the bridge writes a znode per node (ready,
//     allocated to the request), records each znode's id in its node
//     record, then writes fulfilled and the nodes, in label order, in one
//     write, and unlocks. Failed in NATS: the bridge declines it.
//  4. deleted by Zuul (after it locked the nodes, or to cancel it): the
//     NATS request is deleted once every node Zuul locked is taken (in-use
//     in NATS); nodes nobody locked go back to the pool.

// reconcileRequest moves a ZooKeeper request and its NATS request along.
func (br *Bridge) reconcileRequest(ctx context.Context, zkID string) error {
	zr, known := br.tree.request(zkID)
	natsID := NATSRequestID(zkID)
	nr, haveNR := br.requests.Get(natsID)
	if !known || zr.gone {
		if l := br.heldLock(zkID); l != nil {
			br.release(zkID)
		}
		if !haveNR {
			br.requestDone(zkID)
			return nil
		}
		return br.requestGone(ctx, zkID, &nr)
	}
	if zr.err != nil {
		br.reportOnce(requestKey(zkID), zr.version, "a node request cannot be read; leaving it alone", "request", zkID, "err", zr.err)
		return nil
	}
	r := zr.rec
	ours := br.ourPoolIDs()
	switch r.State {
	case "requested":
		return br.requested(ctx, zkID, zr, nr, haveNR, ours)
	case "pending":
		if br.heldLock(zkID) != nil {
			return br.pending(ctx, zkID, nr, haveNR)
		}
		return br.pendingElsewhere(ctx, zkID, nr, haveNR)
	case "fulfilled", "failed":
		if br.heldLock(zkID) != nil {
			br.release(zkID)
		}
		if haveNR && !br.fulfilledHere(ctx, zkID, r, &nr) {
			return br.withdraw(ctx, zkID, "a request that ended elsewhere", &nr)
		}
	}
	return nil
}

// requested handles a request that waits for a launcher.
func (br *Bridge) requested(ctx context.Context, zkID string, zr zrequest, nr kv.Entry[kv.Request], haveNR bool, ours map[string]bool) error {
	r := zr.rec
	if l := br.heldLock(zkID); l != nil {
		// Locked by this process but not pending: the view is behind
		// this process's own write, or an earlier step was cut short.
		fresh, _, err := br.readRequest(zkID)
		if err == nil && fresh.State == "pending" {
			return br.pending(ctx, zkID, nr, haveNR)
		}
		br.release(zkID)
	}
	if allIn(ours, r.DeclinedBy) {
		if haveNR {
			return br.withdraw(ctx, zkID, "every pool of the installation declined it", &nr)
		}
		return nil
	}
	if len(r.NodeTypes) == 0 {
		return br.fulfilEmpty(ctx, zkID)
	}
	if why := br.cannotServe(r); why != "" {
		if haveNR && nr.Value.State != kv.RequestFailed {
			if err := br.withdraw(ctx, zkID, "no pool of the installation can serve it", &nr); err != nil {
				return err
			}
		}
		return br.decline(ctx, zkID, why)
	}
	if !haveNR {
		if br.yields(r, ours) {
			return nil
		}
		return br.record(ctx, zkID, zr)
	}
	switch nr.Value.State {
	case kv.RequestRequested:
		if br.yields(r, ours) {
			return br.withdraw(ctx, zkID, "another launcher of the ensemble is preferred", &nr)
		}
		if nr.Value.RelativePriority != r.RelativePriority {
			// Zuul revised its priority while it waits.
			_, err := br.requests.Modify(ctx, nr.Key, func(q *kv.Request) error {
				if q.State != kv.RequestRequested || q.RelativePriority == r.RelativePriority {
					return kv.ErrSkip
				}
				q.RelativePriority = r.RelativePriority
				return nil
			})
			if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
				return err
			}
		}
		return nil
	case kv.RequestPending, kv.RequestFulfilled:
		return br.claim(ctx, zkID, nr)
	case kv.RequestFailed:
		return br.declineFailed(ctx, zkID, &nr)
	}
	return nil
}

// pending handles a request this process holds locked: it fulfils or
// declines it once its NATS request ends.
func (br *Bridge) pending(ctx context.Context, zkID string, nr kv.Entry[kv.Request], haveNR bool) error {
	if !haveNR {
		// Its NATS request was deleted (an operator's request-delete):
		// the installation gives it up, once a fresh read confirms it.
		e, err := br.b.Requests.Get(ctx, NATSRequestID(zkID))
		switch {
		case err == nil:
			br.requests.Apply(e)
			return nil // there after all: its change comes
		case !errors.Is(err, kv.ErrNotFound):
			return err
		}
		return br.decline(ctx, zkID, "its NATS request was deleted")
	}
	switch nr.Value.State {
	case kv.RequestFulfilled:
		return br.fulfil(ctx, zkID, nr)
	case kv.RequestFailed:
		return br.declineFailed(ctx, zkID, &nr)
	}
	return nil
}

// pendingElsewhere handles a pending request this process does not hold:
// another bridge process does (nothing to do), nobody does (its holder
// died: the bridge takes it over if it is the installation's), or another
// launcher does (the NATS request, if any, is withdrawn).
func (br *Bridge) pendingElsewhere(ctx context.Context, zkID string, nr kv.Entry[kv.Request], haveNR bool) error {
	holder, locked, err := br.conn.Holder(RequestLocksPath + "/" + zkID)
	if err != nil {
		return err
	}
	switch {
	case locked && strings.HasPrefix(holder, LockIdentifierPrefix):
		// Another bridge process serves it, unless the contender is this
		// session's: a lock this process took and lost track of (an
		// answer lost with the connection). It is this process's to go
		// on with.
		l, err := br.conn.AdoptOrphan(RequestLocksPath + "/" + zkID)
		if err != nil || l == nil {
			return err
		}
		br.log.Info("a request lock of this session was found; serving the request under it", "request", zkID)
		br.hold(zkID, l)
		return br.pending(ctx, zkID, nr, haveNR)
	case locked:
		if haveNR {
			return br.withdraw(ctx, zkID, "another launcher locked it", &nr)
		}
		return nil
	case haveNR:
		return br.claim(ctx, zkID, nr)
	}
	// Pending, unlocked, and not the installation's: its launcher died.
	// Nodepool's launchers put such requests back after a while; so does
	// the sweep (on its second sighting).
	return nil
}

// record makes the NATS request that serves a ZooKeeper request.
func (br *Bridge) record(ctx context.Context, zkID string, zr zrequest) error {
	r := zr.rec
	now := br.now().UTC()
	created := time.UnixMilli(zr.ctime).UTC()
	if zr.ctime == 0 {
		created = now
	}
	rec := &kv.Request{
		ID: NATSRequestID(zkID), State: kv.RequestRequested, Labels: slices.Clone(r.NodeTypes),
		Nodes: []string{}, DeclinedBy: []string{}, Requestor: r.Requestor, Priority: priority(zkID),
		RelativePriority: r.RelativePriority, Reuse: r.Reuse, Tenant: r.TenantName, EventID: r.EventID,
		RequestorData: json.RawMessage("{}"), Created: created, StateTime: now,
	}
	if br.ourProvider(r.Provider) {
		rec.Provider = r.Provider
	}
	if d := bytes.TrimSpace(r.RequestorData); len(d) > 0 && d[0] == '{' {
		rec.RequestorData = slices.Clone(d)
	}
	_, err := br.requests.Create(ctx, rec.ID, rec)
	if errors.Is(err, nats.ErrMaxPayload) {
		rec.RequestorData = json.RawMessage("{}")
		_, err = br.requests.Create(ctx, rec.ID, rec)
	}
	switch {
	case err == nil:
		br.log.Debug("serving a Zuul request", "request", zkID, "labels", rec.Labels)
		return nil
	case errors.Is(err, kv.ErrExists):
		return nil // another bridge process made it: its change comes
	}
	return err
}

// claim locks a request the NATS pipeline claimed (or fulfilled) and marks
// it pending, or fulfils it at once.
func (br *Bridge) claim(ctx context.Context, zkID string, nr kv.Entry[kv.Request]) error {
	lock, err := br.lockRequest(zkID)
	if errors.Is(err, ErrLocked) {
		// Zuul revising its priority, or another launcher or bridge
		// process.
		return fmt.Errorf("%w: claiming the request: %w", errRetry, err)
	}
	if err != nil {
		return err
	}
	br.hold(zkID, lock)
	// Read again under the lock: what the cache had may be old.
	r, stat, err := br.readRequest(zkID)
	if err != nil {
		br.release(zkID)
		if errors.Is(err, zk.ErrNoNode) {
			return nil // deleted meanwhile: its deletion comes
		}
		return err
	}
	ours := br.ourPoolIDs()
	switch {
	case r.State == "pending":
		// Pending and unlocked, with a NATS request of the installation:
		// a bridge process that held it died. Carry on.
	case r.State != "requested" || allIn(ours, r.DeclinedBy):
		br.release(zkID)
		br.queue.add(requestKey(zkID))
		return nil
	}
	if nr.Value.State == kv.RequestFulfilled {
		return br.fulfil(ctx, zkID, nr)
	}
	if r.State == "pending" {
		return nil
	}
	r.State, r.StateTime = "pending", epoch(br.now())
	if _, err := br.writeRequest(zkID, r, stat); err != nil {
		br.release(zkID)
		if errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoNode) {
			return errRetry
		}
		return err
	}
	return nil
}

// lockRequest takes the lock of a Zuul request without waiting; a lock
// that another contender holds is ErrLocked, unless that contender is an
// orphan of this session (Conn.AdoptOrphan), which it adopts.
func (br *Bridge) lockRequest(zkID string) (*Lock, error) {
	dir := RequestLocksPath + "/" + zkID
	lock, err := br.conn.TryLock(dir, br.identifier)
	if !errors.Is(err, ErrLocked) {
		return lock, err
	}
	orphan, oerr := br.conn.AdoptOrphan(dir)
	if oerr != nil || orphan == nil {
		return nil, err
	}
	br.log.Info("a request lock of this session that nothing here held was found; the request goes on under it", "request", zkID)
	return orphan, nil
}

// writeRequest writes a request back at the version it was read at, and
// records the write in the bridge's view at once (a watch's report of an
// earlier version may come after it: it is then ignored).
func (br *Bridge) writeRequest(zkID string, r *Request, read *zk.Stat) (*zk.Stat, error) {
	data := r.Encode()
	stat, err := br.conn.Set(RequestsPath+"/"+zkID, data, read.Version)
	if err != nil {
		return nil, err
	}
	written, perr := ParseRequest(data)
	br.setRequest(zkID, &zrequest{rec: written, err: perr, version: stat.Version, ctime: stat.Ctime})
	return stat, nil
}

// readRequest reads a request znode afresh.
func (br *Bridge) readRequest(zkID string) (*Request, *zk.Stat, error) {
	data, stat, err := br.conn.Get(RequestsPath + "/" + zkID)
	if err != nil {
		return nil, nil, err
	}
	r, err := ParseRequest(data)
	if err != nil {
		return nil, nil, fmt.Errorf("request %s: %w", zkID, err)
	}
	return r, stat, nil
}

// fulfil writes the nodes of a request the NATS pipeline fulfilled, and
// then the request, fulfilled, with them in label order; then unlocks.
func (br *Bridge) fulfil(ctx context.Context, zkID string, nr kv.Entry[kv.Request]) error {
	if br.heldLock(zkID) == nil {
		return fmt.Errorf("%w: fulfilling: the request lock is not held (now)", errRetry)
	}
	natsNodes := nr.Value.Nodes
	if len(natsNodes) != len(nr.Value.Labels) {
		return fmt.Errorf("NATS request %s lists %d nodes for %d labels", nr.Key, len(natsNodes), len(nr.Value.Labels))
	}
	zkNodes, err := br.handNodes(ctx, zkID, nr.Key, natsNodes)
	if err != nil {
		return err
	}
	lock := br.heldLock(zkID)
	if lock == nil {
		// The session went meanwhile: another process may hold it.
		return fmt.Errorf("%w: fulfilling: the request lock was lost", errRetry)
	}
	r, stat, err := br.readRequest(zkID)
	if err != nil {
		br.release(zkID)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		return err
	}
	if r.State != "requested" && r.State != "pending" {
		br.release(zkID)
		return nil
	}
	r.State, r.StateTime, r.Nodes = "fulfilled", epoch(br.now()), zkNodes
	if _, err := br.writeRequest(zkID, r, stat); err != nil {
		br.release(zkID)
		if errors.Is(err, zk.ErrBadVersion) {
			return errRetry
		}
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		return err
	}
	br.release(zkID)
	br.log.Info("Zuul request fulfilled", "request", zkID, "nodes", zkNodes, "provider", nr.Value.Provider, "pool", nr.Value.Pool)
	return nil
}

// fulfilEmpty fulfils a request for no node at all (older Zuuls wrote
// them), as a Nodepool launcher does.
func (br *Bridge) fulfilEmpty(ctx context.Context, zkID string) error {
	lock, err := br.lockRequest(zkID)
	if errors.Is(err, ErrLocked) {
		return errRetry
	}
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release() }()
	r, stat, err := br.readRequest(zkID)
	if err != nil || r.State != "requested" || len(r.NodeTypes) > 0 {
		return nil
	}
	r.State, r.StateTime, r.Nodes = "fulfilled", epoch(br.now()), []string{}
	_, err = br.writeRequest(zkID, r, stat)
	return err
}

// declineFailed declines a request its NATS request failed for, and
// deletes the NATS request.
func (br *Bridge) declineFailed(ctx context.Context, zkID string, nr *kv.Entry[kv.Request]) error {
	if err := br.decline(ctx, zkID, nr.Value.Reason); err != nil {
		return err
	}
	return br.withdraw(ctx, zkID, "it failed", nr)
}

// decline adds this installation's pool ids to a request's declined_by:
// it fails when every registered pool declined it, and otherwise goes
// back to requested for the other launchers, as Nodepool's launchers
// decline.
func (br *Bridge) decline(ctx context.Context, zkID, why string) error {
	if br.heldLock(zkID) == nil {
		lock, err := br.lockRequest(zkID)
		if errors.Is(err, ErrLocked) {
			return errRetry
		}
		if err != nil {
			return err
		}
		br.hold(zkID, lock)
	}
	defer br.release(zkID)
	r, stat, err := br.readRequest(zkID)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	if r.State != "requested" && r.State != "pending" {
		return nil
	}
	ours := br.ourPools()
	for _, p := range ours {
		if !slices.Contains(r.DeclinedBy, p.id) {
			r.DeclinedBy = append(r.DeclinedBy, p.id)
		}
	}
	registered := br.pools.ids()
	for _, p := range ours {
		if !slices.Contains(registered, p.id) {
			registered = append(registered, p.id)
		}
	}
	r.State = "requested"
	if allIn(setOf(registered), r.DeclinedBy) {
		r.State = "failed"
	}
	r.StateTime = epoch(br.now())
	if _, err := br.writeRequest(zkID, r, stat); err != nil {
		if errors.Is(err, zk.ErrBadVersion) {
			return errRetry
		}
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		return err
	}
	br.log.Info("Zuul request declined", "request", zkID, "labels", r.NodeTypes, "why", why, "state", r.State)
	return nil
}

// withdraw deletes the NATS request of a ZooKeeper request that another
// launcher took, that ended elsewhere, or that this installation gave up.
// Nodes allocated to it and not taken go back to the pool.
func (br *Bridge) withdraw(ctx context.Context, zkID, why string, nr *kv.Entry[kv.Request]) error {
	err := br.requests.Delete(ctx, nr.Key, nr.Revision)
	switch {
	case err == nil:
		br.log.Debug("NATS request withdrawn", "request", zkID, "why", why)
		return nil
	case errors.Is(err, kv.ErrConflict):
		return errRetry // it changed: look again
	case errors.Is(err, kv.ErrNotFound):
		return nil
	}
	return err
}

// requestGone deletes the NATS request of a ZooKeeper request that was
// deleted (Zuul took its nodes, or cancelled it; a Zuul before 4.9 that
// lost its session). Nodes of it that Zuul locked stay allocated until
// Zuul uses them (they are taken in NATS then) or unlocks them; the others
// go back to the pool with the NATS request.
func (br *Bridge) requestGone(ctx context.Context, zkID string, nr *kv.Entry[kv.Request]) error {
	// Confirm: a deletion read from a watch is final, but a request never
	// seen by this process may just not be read yet.
	exists, _, err := br.conn.Exists(RequestsPath + "/" + zkID)
	if err != nil {
		return err
	}
	if exists {
		br.sawRequests(br.runContext(), br.conn, []string{zkID})
		return nil
	}
	for _, id := range nr.Value.Nodes {
		locked, err := br.lockedNode(ctx, nr.Key, id)
		if err != nil {
			return err
		}
		if locked {
			return nil // Zuul holds it: its next change brings the request back here
		}
	}
	if err := br.withdraw(ctx, zkID, "its ZooKeeper request was deleted", nr); err != nil {
		return err
	}
	br.requestDone(zkID)
	return nil
}

// requestDone forgets a deleted request and removes its lock directory,
// which outlives it (nobody locks a deleted request; a directory in use
// is not empty and stays).
func (br *Bridge) requestDone(zkID string) {
	zr, known := br.tree.request(zkID)
	if !known || !zr.gone {
		return
	}
	if err := br.conn.Delete(RequestLocksPath+"/"+zkID, -1); err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrNotEmpty) {
		br.log.Debug("could not remove a request's lock directory", "request", zkID, "err", err)
	}
	br.forgetRequest(zkID)
}

// fulfilledHere reports whether a request fulfilled (or failed) in
// ZooKeeper is the installation's doing: fulfilled with nodes of its
// providers. Confirmed by reading the znodes, since the caches may lag.
func (br *Bridge) fulfilledHere(ctx context.Context, zkID string, r *Request, nr *kv.Entry[kv.Request]) bool {
	if r.State != "fulfilled" || nr.Value.State != kv.RequestFulfilled || len(r.Nodes) == 0 {
		return r.State == "fulfilled" && len(r.Nodes) == 0 && len(r.NodeTypes) == 0
	}
	data, _, err := br.conn.Get(NodesPath + "/" + r.Nodes[0])
	if err != nil {
		return !errors.Is(err, zk.ErrNoNode) // when not sure, do not withdraw
	}
	n, err := ParseNode(data)
	if err != nil {
		return true
	}
	return br.ourProvider(n.Provider)
}

// cannotServe says why none of the installation's pools can serve a
// request ("" if one can): every label must come from one pool.
func (br *Bridge) cannotServe(r *Request) string {
	pools := br.ourPools()
	if len(pools) == 0 {
		return "no pool of this installation takes requests"
	}
	for _, p := range pools {
		if providesAll(p.labels, r.NodeTypes) {
			return ""
		}
	}
	var missing []string
	for _, l := range r.NodeTypes {
		if !slices.ContainsFunc(pools, func(p ourPool) bool { return slices.Contains(p.labels, l) }) && !slices.Contains(missing, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return "no pool provides label(s) " + strings.Join(missing, ", ")
	}
	return "no one pool provides every label of [" + strings.Join(r.NodeTypes, " ") + "]"
}

// yields reports whether the installation leaves a request to other
// launchers of the ensemble, as Nodepool's pools yield: to a live pool of
// the provider the request names, and to a live pool of better (lower)
// priority that is not paused, provides every label and has not declined
// it.
func (br *Bridge) yields(r *Request, ours map[string]bool) bool {
	others := br.pools.others(ours)
	if len(others) == 0 {
		return false
	}
	if r.Provider != "" && !br.ourProvider(r.Provider) {
		for _, pc := range others {
			if pc.ProviderName == r.Provider && !slices.Contains(r.DeclinedBy, pc.ID) && providesAll(pc.SupportedLabels, r.NodeTypes) {
				return true
			}
		}
	}
	best := -1
	for _, p := range br.ourPools() {
		if providesAll(p.labels, r.NodeTypes) && (best < 0 || p.priority < best) {
			best = p.priority
		}
	}
	for _, pc := range others {
		if pc.Paused || pc.Priority >= best || slices.Contains(r.DeclinedBy, pc.ID) || !providesAll(pc.SupportedLabels, r.NodeTypes) {
			continue
		}
		if r.Provider != "" && br.ourProvider(r.Provider) {
			continue // it names one of ours
		}
		return true
	}
	return false
}

// ourProvider reports whether a provider is one of this file's.
func (br *Bridge) ourProvider(name string) bool {
	if name == "" {
		return false
	}
	_, ok := br.config().Provider(name)
	return ok
}

// lockedNode reports whether a node of a NATS request is still ready,
// allocated to it, with a znode that somebody (Zuul) locked: it must not
// go back to the pool with its request. A node the view lacks, or shows
// ready and allocated to the request without its znode's id, is read again
// from the bucket: a view behind the bridge's own writes would let a node
// Zuul locked go back to the pool and its znode be deleted under Zuul.
// (A node the view shows taken or elsewhere needs no read.)
func (br *Bridge) lockedNode(ctx context.Context, natsReq, id string) (bool, error) {
	allocated := func(n *kv.Node) bool {
		return n.AllocatedTo == natsReq && n.State == kv.NodeReady && n.ZooKeeperID != ""
	}
	e, ok := br.nodes.Get(id)
	behind := !ok || (e.Value.AllocatedTo == natsReq && e.Value.State == kv.NodeReady && e.Value.ZooKeeperID == "")
	if !behind && !allocated(&e.Value) {
		return false, nil
	}
	if behind {
		fresh, err := br.b.Nodes.Get(ctx, id)
		switch {
		case errors.Is(err, kv.ErrNotFound), errors.Is(err, kv.ErrBadRecord):
			return false, nil
		case err != nil:
			return false, err
		}
		if !allocated(&fresh.Value) {
			return false, nil
		}
		e = fresh
	}
	locked, err := br.lockedByOthers(e.Value.ZooKeeperID)
	if err == nil && !locked {
		br.log.Debug("a node of a deleted request is not locked; it goes back to the pool", "node", id, "znode", e.Value.ZooKeeperID, "request", natsReq)
	}
	return locked, err
}

// lockedByOthers reports whether anyone holds or waits for a node's lock
// (its lock directory has a contender), read afresh.
func (br *Bridge) lockedByOthers(zkNodeID string) (bool, error) {
	all, err := br.conn.Contenders(NodesPath + "/" + zkNodeID + "/lock")
	if err != nil {
		return false, err
	}
	return len(all) > 0, nil
}

func (br *Bridge) runContext() context.Context {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.runCtx
}

func providesAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// allIn reports whether every key of set is in list (false for an empty
// set).
func allIn(set map[string]bool, list []string) bool {
	if len(set) == 0 {
		return false
	}
	for k := range set {
		if !slices.Contains(list, k) {
			return false
		}
	}
	return true
}

func setOf(list []string) map[string]bool {
	out := make(map[string]bool, len(list))
	for _, s := range list {
		out[s] = true
	}
	return out
}
