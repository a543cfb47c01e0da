package zkbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/kv"
)

// A node handed to Zuul has two records: its NATS record (the truth about
// the machine: the launchers own it) and its znode (what Zuul sees and
// writes). Zuul owns the znode's state in-use, used and hold, hold_job,
// comment, hold_expiration and user_data, and its lock is the lease:
//
//   - in-use, used or hold written by Zuul: the NATS node is taken
//     (ready -> in-use, holder "zuul:<requestor>"), then follows: used once
//     Zuul unlocked it, hold with Zuul's hold fields (hold_expiration, a
//     duration from the hold, becomes a time);
//   - in-use (or taken and still ready) with nobody holding its lock: Zuul
//     lost it (its executor or session died): used, and so deleted;
//   - the NATS node freed (its request went before Zuul locked it) or gone
//     (deleted): the znode is deleted, under the bridge's own lock, once
//     nobody else holds it.

// HolderPrefix begins the holder of a NATS node taken for Zuul.
const HolderPrefix = "zuul:"

// handNodes makes sure each NATS node of a fulfilled request has a znode,
// ready and allocated to the ZooKeeper request, and returns the znodes'
// ids in order. Nodes that need one get it in one transaction; each
// znode's id is then recorded in its node record (revision-checked: a node
// that was freed meanwhile is not given to Zuul).
func (br *Bridge) handNodes(ctx context.Context, zkID, natsReq string, ids []string) ([]string, error) {
	out := make([]string, len(ids))
	nodes := make([]kv.Node, len(ids))
	var create []int
	for i, id := range ids {
		e, ok := br.nodes.Get(id)
		if !ok || e.Value.AllocatedTo != natsReq || e.Value.State != kv.NodeReady {
			// The cache may be behind the request's record: read afresh.
			fresh, err := br.b.Nodes.Get(ctx, id)
			if err != nil && !errors.Is(err, kv.ErrNotFound) {
				return nil, err
			}
			e, ok = fresh, err == nil
		}
		if !ok || e.Value.AllocatedTo != natsReq || e.Value.State != kv.NodeReady {
			// The pipeline fulfilled the request with a node that is no
			// longer ready for it (deleted meanwhile): serve it afresh.
			return nil, br.restart(ctx, zkID, natsReq, id)
		}
		nodes[i] = e.Value
		if z := e.Value.ZooKeeperID; z != "" {
			if br.znodeServes(z, zkID, id) {
				out[i] = z
				continue
			}
		}
		create = append(create, i)
	}
	if len(create) == 0 {
		return out, nil
	}
	now := br.now()
	datas := make([][]byte, len(create))
	for j, i := range create {
		datas[j] = NodeRecord(&nodes[i], zkID, PoolID(nodes[i].Provider, nodes[i].Pool), now)
	}
	paths, err := br.conn.CreateSequentials(NodesPath+"/", datas)
	if err != nil {
		return nil, fmt.Errorf("creating node znodes: %w", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(create))
	for j, i := range create {
		zkNode := path.Base(paths[j])
		wg.Go(func() {
			_, err := br.nodes.Modify(ctx, ids[i], func(n *kv.Node) error {
				if n.AllocatedTo != natsReq || n.State != kv.NodeReady {
					return kv.ErrSkip
				}
				n.ZooKeeperID = zkNode
				return nil
			})
			if err != nil {
				errs[j] = err
				_ = br.conn.DeleteTree(NodesPath + "/" + zkNode)
				return
			}
			out[i] = zkNode
			br.followNode(zkNode, ids[i])
		})
	}
	wg.Wait()
	for j, err := range errs {
		if errors.Is(err, kv.ErrSkip) || errors.Is(err, kv.ErrNotFound) {
			return nil, fmt.Errorf("%w: handing nodes: node %s changed meanwhile", errRetry, ids[create[j]])
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// znodeServes reports whether a znode exists, allocated to a request, for
// a NATS node (read afresh).
func (br *Bridge) znodeServes(zkNode, zkRequest, natsID string) bool {
	data, _, err := br.conn.Get(NodesPath + "/" + zkNode)
	if err != nil {
		return false
	}
	n, err := ParseNode(data)
	return err == nil && n.AllocatedTo == zkRequest && (n.NATSID == "" || n.NATSID == natsID)
}

// restart serves a request afresh: its NATS request, fulfilled with a node
// that is gone, is deleted and made again.
func (br *Bridge) restart(ctx context.Context, zkID, natsReq, node string) error {
	br.log.Info("a node of a fulfilled request is no longer ready for it; serving the request afresh", "request", zkID, "node", node)
	if e, ok := br.requests.Get(natsReq); ok {
		if err := br.withdraw(ctx, zkID, "a node of it is no longer ready for it", &e); err != nil {
			return err
		}
	}
	zr, ok := br.tree.request(zkID)
	if !ok || zr.rec == nil {
		return fmt.Errorf("%w: serving afresh: the request is not in the view", errRetry)
	}
	if err := br.record(ctx, zkID, zr); err != nil {
		return err
	}
	return fmt.Errorf("%w: served afresh", errRetry)
}

// reconcileNode follows a NATS node handed to Zuul, and its znode.
func (br *Bridge) reconcileNode(ctx context.Context, natsID string) error {
	e, ok := br.nodes.Get(natsID)
	if !ok {
		return br.nodeGone(ctx, natsID)
	}
	n := &e.Value
	zkNode := n.ZooKeeperID
	if zkNode == "" {
		return nil
	}
	zn, known := br.tree.node(zkNode)
	if !known || (!zn.gone && (!zn.lockRead || (zn.rec == nil && zn.err == nil))) {
		br.followNode(zkNode, natsID)
		return nil // its watch brings it back here once read
	}
	if zn.gone {
		return br.znodeGone(ctx, e, zkNode)
	}
	if zn.err != nil {
		br.reportOnce(nodeKey(natsID), zn.version, "a node znode cannot be read; leaving it alone", "node", zkNode, "err", zn.err)
		return nil
	}
	z := zn.rec
	locked := len(zn.contenders) > 0
	zkRequest, _ := ZKRequestID(n.AllocatedTo)
	switch n.State {
	case kv.NodeReady:
		if zkRequest == "" || z.AllocatedTo != zkRequest {
			// Freed (its request went before Zuul locked it) or
			// allocated anew: the znode is of the earlier allocation.
			return br.dropZnode(ctx, e, zkNode, zn)
		}
		switch z.State {
		case "in-use", "used", "hold":
			return br.take(ctx, e, z)
		}
	case kv.NodeInUse, kv.NodeHold:
		if !strings.HasPrefix(n.Holder, HolderPrefix) {
			return nil // not taken for Zuul (an operator's hold): not the bridge's
		}
		switch {
		case z.State == "hold":
			return br.mirrorHold(ctx, e, z)
		case z.State == "in-use" && n.State == kv.NodeInUse && locked:
			return br.mirrorUserData(ctx, e, z)
		case !locked && z.State != "hold":
			// Returned (used and unlocked), or lost: its executor or
			// its session went without returning it.
			return br.giveBack(ctx, e, z.State)
		}
	default:
		// Used, deleting, failed: the launchers delete it; its znode
		// goes with its record.
	}
	return nil
}

// take takes a NATS node Zuul started using: ready -> in-use, with Zuul's
// user_data; the next change moves it on (used, hold).
func (br *Bridge) take(ctx context.Context, e kv.Entry[kv.Node], z *Node) error {
	_, err := br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if n.State != kv.NodeReady || n.AllocatedTo != e.Value.AllocatedTo || n.ZooKeeperID != e.Value.ZooKeeperID {
			return kv.ErrSkip
		}
		n.SetState(kv.NodeInUse, br.now().UTC())
		n.Holder = HolderPrefix + n.Requestor
		if len(z.UserData) > 0 {
			n.UserData = json.RawMessage(z.UserData)
		}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	if zkID, ok := ZKRequestID(e.Value.AllocatedTo); ok {
		br.queue.add(requestKey(zkID)) // its request may be done with now
	}
	return nil
}

// mirrorUserData copies Zuul's user_data of an in-use node.
func (br *Bridge) mirrorUserData(ctx context.Context, e kv.Entry[kv.Node], z *Node) error {
	if len(z.UserData) == 0 || string(z.UserData) == string(e.Value.UserData) {
		return nil
	}
	_, err := br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if n.State != kv.NodeInUse || n.ZooKeeperID != e.Value.ZooKeeperID {
			return kv.ErrSkip
		}
		n.UserData = json.RawMessage(z.UserData)
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	return nil
}

// mirrorHold puts a node Zuul holds on hold, with Zuul's hold fields: its
// hold_expiration (seconds from the hold) becomes the time it ends.
func (br *Bridge) mirrorHold(ctx context.Context, e kv.Entry[kv.Node], z *Node) error {
	var until *time.Time
	if z.HoldExpiration != nil && *z.HoldExpiration > 0 {
		from := fromEpoch(z.StateTime)
		if from.IsZero() {
			from = br.now().UTC()
		}
		t := from.Add(time.Duration(*z.HoldExpiration * float64(time.Second))).UTC()
		until = &t
	}
	same := func(n *kv.Node) bool {
		return n.State == kv.NodeHold && n.HoldJob == z.HoldJob && n.Comment == z.Comment &&
			((n.HoldExpiration == nil) == (until == nil)) && (until == nil || n.HoldExpiration.Equal(*until))
	}
	if same(&e.Value) {
		return nil
	}
	_, err := br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if (n.State != kv.NodeInUse && n.State != kv.NodeHold) || n.ZooKeeperID != e.Value.ZooKeeperID || same(n) {
			return kv.ErrSkip
		}
		n.SetState(kv.NodeHold, br.now().UTC())
		n.HoldJob, n.Comment, n.HoldExpiration = z.HoldJob, z.Comment, until
		if len(z.UserData) > 0 {
			n.UserData = json.RawMessage(z.UserData)
		}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	br.log.Info("node held by Zuul", "node", e.Value.ZooKeeperID, "hold_job", z.HoldJob, "until", until)
	return nil
}

// giveBack marks a node Zuul is done with used: the launchers delete it.
func (br *Bridge) giveBack(ctx context.Context, e kv.Entry[kv.Node], zuulState string) error {
	// Confirm that nobody holds it, reading the lock afresh, and then
	// what Zuul wrote before it unlocked: Zuul holds a node by writing
	// hold and then unlocking, and the unlock may be seen before the
	// write.
	locked, err := br.lockedByOthers(e.Value.ZooKeeperID)
	if err != nil || locked {
		return err
	}
	data, _, err := br.conn.Get(NodesPath + "/" + e.Value.ZooKeeperID)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil // its watch brings the deletion
	case err != nil:
		return err
	}
	if fresh, err := ParseNode(data); err == nil {
		if fresh.State == "hold" {
			return br.mirrorHold(ctx, e, fresh)
		}
		zuulState = fresh.State
	}
	_, err = br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if (n.State != kv.NodeInUse && n.State != kv.NodeHold) || n.ZooKeeperID != e.Value.ZooKeeperID {
			return kv.ErrSkip
		}
		n.SetState(kv.NodeUsed, br.now().UTC())
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	if zuulState != "used" {
		br.log.Info("node unlocked by Zuul without being returned; deleting it", "node", e.Value.ZooKeeperID, "state", zuulState)
	}
	return nil
}

// znodeGone handles a NATS node whose znode is gone: a node Zuul had is
// lost to it (used); otherwise the stale id is forgotten.
func (br *Bridge) znodeGone(ctx context.Context, e kv.Entry[kv.Node], zkNode string) error {
	exists, _, err := br.conn.Exists(NodesPath + "/" + zkNode)
	if err != nil {
		return err
	}
	if exists {
		br.tree.mu.Lock()
		delete(br.tree.nodes, zkNode)
		br.tree.mu.Unlock()
		br.followNode(zkNode, e.Key)
		return nil
	}
	_, err = br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if n.ZooKeeperID != zkNode {
			return kv.ErrSkip
		}
		if (n.State == kv.NodeInUse || n.State == kv.NodeHold) && strings.HasPrefix(n.Holder, HolderPrefix) {
			n.SetState(kv.NodeUsed, br.now().UTC())
		}
		n.ZooKeeperID = ""
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	br.forgetNode(zkNode)
	return nil
}

// dropZnode deletes the znode of a node that is no longer Zuul's (freed,
// or allocated anew), then forgets its id in the node record.
func (br *Bridge) dropZnode(ctx context.Context, e kv.Entry[kv.Node], zkNode string, zn znode) error {
	if err := br.deleteZnode(zkNode); err != nil {
		return err
	}
	_, err := br.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if n.ZooKeeperID != zkNode {
			return kv.ErrSkip
		}
		n.ZooKeeperID = ""
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		return err
	}
	return nil
}

// nodeGone deletes the znode of a NATS node that was deleted, once a
// fresh read confirms it is gone (the cache may be behind).
func (br *Bridge) nodeGone(ctx context.Context, natsID string) error {
	zkNode := br.znodeOf(natsID)
	if zkNode == "" {
		return nil
	}
	e, err := br.b.Nodes.Get(ctx, natsID)
	switch {
	case err == nil:
		br.nodes.Apply(e)
		return nil // there after all: its change comes
	case !errors.Is(err, kv.ErrNotFound):
		return err
	}
	if err := br.deleteZnode(zkNode); err != nil {
		return err
	}
	if exists, _, err := br.conn.Exists(NodesPath + "/" + zkNode); err == nil && !exists {
		br.tree.mu.Lock()
		if n := br.tree.nodes[zkNode]; n != nil {
			n.gone = true
		}
		br.tree.mu.Unlock()
		br.forgetNode(zkNode)
	}
	return nil
}

// znodeOf finds the znode the bridge followed for a NATS node.
func (br *Bridge) znodeOf(natsID string) string {
	br.tree.mu.Lock()
	defer br.tree.mu.Unlock()
	return br.tree.byNATS[natsID]
}

// deleteZnode deletes a node znode and its lock directory, once nobody
// else holds its lock (the bridge takes the lock first, as Nodepool's
// launchers do: Zuul never finds a node it locked deleted under it).
func (br *Bridge) deleteZnode(zkNode string) error {
	p := NodesPath + "/" + zkNode
	lock, err := br.conn.TryLockNode(zkNode, br.identifier)
	if errors.Is(err, ErrLocked) {
		return nil // its holder unlocks it; the lock's watch brings it back
	}
	if err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		return err
	}
	if err := br.conn.DeleteTree(p); err != nil {
		_ = lock.Release()
		if errors.Is(err, zk.ErrNotEmpty) {
			return errRetry
		}
		return err
	}
	lock.forget() // its contender went with the znode
	br.log.Debug("node znode deleted", "node", zkNode)
	return nil
}
