package zkbridge

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/kv"
)

// The sweep reconciles everything afresh every sync interval: whatever a
// watch missed, a process that died between two writes, or a change made
// while no bridge ran. What may be left over by a process that died in
// the middle of a step (a znode made but not recorded in its node, a
// request left pending with nobody's lock) is acted on at its second
// sighting, a sync interval later, so that a step in flight in another
// process is never taken for a leftover.

func (br *Bridge) sweepLoop(ctx context.Context) {
	tick := time.NewTicker(br.opts.SyncInterval)
	defer tick.Stop()
	for {
		br.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// missedDeletions marks gone the requests the bridge has read that the
// listing no longer has and that are gone indeed (the listing may be
// older than a read): their watch missed the deletion, which would
// otherwise leave their NATS requests, and the nodes allocated to them,
// for as long as the process lives.
func (br *Bridge) missedDeletions(conn *Conn, children []string) {
	listed := make(map[string]bool, len(children))
	for _, id := range children {
		listed[id] = true
	}
	for _, id := range br.tree.requestIDs() {
		if zr, ok := br.tree.request(id); listed[id] || !ok || zr.gone {
			continue
		}
		if exists, _, err := conn.Exists(RequestsPath + "/" + id); err == nil && !exists {
			br.log.Info("a request's deletion was not seen by its watch; the sweep saw it", "request", id)
			br.setRequest(id, &zrequest{gone: true})
		}
	}
}

// sweep queues every request and node the bridge knows of, and looks for
// leftovers.
func (br *Bridge) sweep(ctx context.Context) {
	conn := br.conn
	if left := conn.Withdrawn(); left > 0 {
		br.log.Debug("lock contenders of failed attempts still to withdraw", "count", left)
	}
	seen := map[string]int{}
	if children, _, err := conn.Children(RequestsPath); err == nil {
		br.sawRequests(ctx, conn, children)
		for _, id := range children {
			if ValidRequestID(id) {
				br.queue.add(requestKey(id))
			}
		}
		br.pendingLeftovers(children, seen)
		br.missedDeletions(conn, children)
	}
	for _, id := range br.tree.requestIDs() {
		br.queue.add(requestKey(id))
	}
	mapped := map[string]string{} // znode -> NATS node
	br.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if zkID, ok := ZKRequestID(e.Key); ok {
			br.queue.add(requestKey(zkID))
		}
		return true
	})
	br.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if z := e.Value.ZooKeeperID; z != "" {
			mapped[z] = e.Key
			br.followNode(z, e.Key)
			br.queue.add(nodeKey(e.Key))
		}
		return true
	})
	if children, _, err := conn.Children(NodesPath); err == nil {
		present := setOf(children)
		br.foreignNodes.Range(func(k, _ any) bool {
			if !present[k.(string)] {
				br.foreignNodes.Delete(k)
			}
			return true
		})
		for _, z := range children {
			if _, ok := mapped[z]; ok || !nodeIDRE.MatchString(z) {
				continue
			}
			if br.foreign(z) {
				continue
			}
			seen["o:"+z]++
		}
	}
	br.mu.Lock()
	next := map[string]int{}
	var due []string
	for key, n := range seen {
		next[key] = br.sightings[key] + n
		if next[key] >= 2 {
			due = append(due, key)
		}
	}
	br.sightings = next
	br.mu.Unlock()
	for _, key := range due {
		br.queue.add(key)
	}
}

// foreign reports whether a node znode is another launcher's (its provider
// is not one of this file's); the answer is kept, since a node's provider
// never changes.
func (br *Bridge) foreign(zkNode string) bool {
	if v, ok := br.foreignNodes.Load(zkNode); ok {
		return v.(bool)
	}
	data, _, err := br.conn.Get(NodesPath + "/" + zkNode)
	if err != nil {
		return true // gone, or not readable now: look again next time
	}
	if len(data) == 0 {
		return false // an empty znode (a lock taken as it was deleted)
	}
	n, err := ParseNode(data)
	foreign := err != nil || !br.ourProvider(n.Provider)
	if foreign {
		br.foreignNodes.Store(zkNode, true)
	}
	return foreign
}

// pendingLeftovers counts pending requests nobody holds that are not the
// installation's: their launcher died. Nodepool's launchers put such
// requests back to requested; so does the bridge, on the second sighting.
func (br *Bridge) pendingLeftovers(children []string, seen map[string]int) {
	for _, id := range children {
		zr, ok := br.tree.request(id)
		if !ok || zr.rec == nil || zr.rec.State != "pending" || br.heldLock(id) != nil {
			continue
		}
		if _, mine := br.requests.Get(NATSRequestID(id)); mine {
			continue
		}
		all, err := br.conn.Contenders(RequestLocksPath + "/" + id)
		if err != nil || len(all) > 0 {
			continue
		}
		seen["p:"+id]++
	}
}

// reconcileOrphan looks at a znode of one of this file's providers that
// no node record names, seen twice: one made by a bridge process that
// died before recording it is adopted if its node still waits for it,
// and deleted otherwise; so is an empty one (a lock taken on a node as it
// was deleted makes it again, empty).
func (br *Bridge) reconcileOrphan(ctx context.Context, key string) error {
	zkNode := key
	data, _, err := br.conn.Get(NodesPath + "/" + zkNode)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(data) > 0 {
		n, err := ParseNode(data)
		if err != nil || !br.ourProvider(n.Provider) {
			return nil
		}
		// Read the node afresh: the cache may be behind (a watch that
		// restarts with its server), and a znode deleted on its word
		// would be one Zuul is about to lock.
		if n.NATSID != "" {
			e, err := br.b.Nodes.Get(ctx, n.NATSID)
			switch {
			case errors.Is(err, kv.ErrNotFound):
			case err != nil:
				return err
			case e.Value.ZooKeeperID == zkNode:
				br.nodes.Apply(e)
				br.followNode(zkNode, e.Key)
				return nil // recorded meanwhile
			case e.Value.ZooKeeperID == "" && e.Value.State == kv.NodeReady && e.Value.AllocatedTo == NATSRequestID(n.AllocatedTo):
				_, err := br.nodes.Modify(ctx, e.Key, func(v *kv.Node) error {
					if v.ZooKeeperID != "" || v.State != kv.NodeReady || v.AllocatedTo != NATSRequestID(n.AllocatedTo) {
						return kv.ErrSkip
					}
					v.ZooKeeperID = zkNode
					return nil
				})
				if err == nil {
					br.followNode(zkNode, e.Key)
					return nil
				}
				if !errors.Is(err, kv.ErrSkip) {
					return err
				}
				return errRetry // it changed: look again
			}
		}
	}
	br.log.Info("deleting a node znode no node record names", "node", zkNode)
	return br.deleteZnode(zkNode)
}

// resetPending puts a pending request nobody holds back to requested.
func (br *Bridge) resetPending(zkID string) error {
	lock, err := br.lockRequest(zkID)
	if err != nil {
		if errors.Is(err, ErrLocked) {
			return nil
		}
		return err
	}
	defer func() { _ = lock.Release() }()
	if _, mine := br.requests.Get(NATSRequestID(zkID)); mine {
		return nil
	}
	r, stat, err := br.readRequest(zkID)
	if err != nil || r.State != "pending" {
		return nil
	}
	r.State, r.StateTime = "requested", epoch(br.now())
	if _, err := br.writeRequest(zkID, r, stat); err != nil && !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	br.log.Info("request left pending by a launcher that went away; back to requested", "request", zkID)
	return nil
}
