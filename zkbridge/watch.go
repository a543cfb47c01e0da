package zkbridge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/internal/wait"
)

// The bridge follows the shared tree with ZooKeeper's one-shot watches
// (go-zookeeper has no persistent ones): a watch on the children of
// /nodepool/requests finds new requests, a data watch on each request
// follows it until it is deleted, and each node the bridge handed to Zuul
// is followed by a data watch and a watch on its lock's contenders. A
// watch is set again each time it fires; one lost with the session is
// set again on the next one, and the periodic sweep reads everything
// afresh, so a change missed for any reason is seen there.

// zrequest is the last state of a request znode the bridge has read.
type zrequest struct {
	rec     *Request // nil when it could not be parsed (err says why)
	err     error
	version int32
	ctime   int64 // ms since the epoch (ZooKeeper's clock)
	gone    bool  // deleted
}

// znode is the last state of a node znode the bridge follows.
type znode struct {
	rec        *Node
	err        error
	version    int32
	gone       bool
	contenders []Contender
	lockRead   bool   // contenders were read at least once
	natsID     string // the NATS node it was followed for
}

// tree is what the bridge has read of the shared tree.
type tree struct {
	mu       sync.Mutex
	requests map[string]*zrequest
	watching map[string]bool // requests with a data watch running
	nodes    map[string]*znode
	// byNATS names the znode followed for a NATS node.
	byNATS    map[string]string
	nodeWatch map[string]context.CancelFunc
}

func newTree() *tree {
	return &tree{requests: map[string]*zrequest{}, watching: map[string]bool{}, nodes: map[string]*znode{},
		byNATS: map[string]string{}, nodeWatch: map[string]context.CancelFunc{}}
}

func (t *tree) request(id string) (zrequest, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.requests[id]
	if !ok {
		return zrequest{}, false
	}
	return *r, true
}

func (t *tree) node(id string) (znode, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.nodes[id]
	if !ok {
		return znode{}, false
	}
	c := *n
	c.contenders = slices.Clone(n.contenders)
	return c, true
}

// requestIDs lists the requests known (deleted ones too).
func (t *tree) requestIDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.requests))
	for id := range t.requests {
		out = append(out, id)
	}
	return out
}

// watchRequests follows the children of /nodepool/requests and starts a
// data watch on each new one, until ctx ends.
func (b *Bridge) watchRequests(ctx context.Context, conn *Conn) {
	for failures := 0; ctx.Err() == nil; {
		if err := conn.Ensure(RequestsPath); err != nil {
			failures++
			b.log.Debug("cannot ensure the requests path", "err", err)
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		children, _, ch, err := conn.ChildrenW(RequestsPath)
		if err != nil {
			failures++
			b.log.Debug("cannot list requests", "err", err)
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		failures = 0
		b.sawRequests(ctx, conn, children)
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// sawRequests starts a data watch on each listed request not followed
// yet.
func (b *Bridge) sawRequests(ctx context.Context, conn *Conn, children []string) {
	for _, id := range children {
		if !ValidRequestID(id) {
			continue // not a request of Zuul's or Nodepool's form: not ours to serve
		}
		b.tree.mu.Lock()
		start := !b.tree.watching[id]
		if start {
			b.tree.watching[id] = true
		}
		b.tree.mu.Unlock()
		if start {
			b.wg.Go(func() { b.watchRequest(ctx, conn, id) })
		}
	}
}

// watchRequest follows one request znode until it is deleted or ctx ends.
func (b *Bridge) watchRequest(ctx context.Context, conn *Conn, id string) {
	defer func() {
		b.tree.mu.Lock()
		delete(b.tree.watching, id)
		b.tree.mu.Unlock()
	}()
	p := RequestsPath + "/" + id
	for failures := 0; ctx.Err() == nil; {
		data, stat, ch, err := conn.GetW(p)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			b.setRequest(id, &zrequest{gone: true})
			return
		case err != nil:
			failures++
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		failures = 0
		zr := &zrequest{version: stat.Version, ctime: stat.Ctime}
		zr.rec, zr.err = ParseRequest(data)
		b.setRequest(id, zr)
		select {
		case <-ctx.Done():
			return
		case ev := <-ch:
			if ev.Type == zk.EventNodeDeleted {
				b.setRequest(id, &zrequest{gone: true})
				return
			}
		}
	}
}

// setRequest records what was read of a request and queues it.
func (b *Bridge) setRequest(id string, zr *zrequest) {
	b.tree.mu.Lock()
	old := b.tree.requests[id]
	if old != nil && !zr.gone && !old.gone && zr.version < old.version {
		b.tree.mu.Unlock()
		return // an older read than one already seen
	}
	b.tree.requests[id] = zr
	b.tree.mu.Unlock()
	b.queue.add(requestKey(id))
}

// forgetRequest drops a deleted request once nothing remains to do for it.
func (b *Bridge) forgetRequest(id string) {
	b.tree.mu.Lock()
	defer b.tree.mu.Unlock()
	if r := b.tree.requests[id]; r != nil && r.gone {
		delete(b.tree.requests, id)
	}
}

// followNode starts following a node znode (its data and its lock's
// contenders), unless it is followed already.
func (b *Bridge) followNode(zkID, natsID string) {
	if !nodeIDRE.MatchString(zkID) {
		return
	}
	b.tree.mu.Lock()
	if _, ok := b.tree.nodeWatch[zkID]; ok || b.runCtx == nil {
		b.tree.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(b.runCtx)
	b.tree.nodeWatch[zkID] = cancel
	conn := b.conn
	b.tree.mu.Unlock()
	b.wg.Go(func() {
		defer func() {
			cancel()
			b.tree.mu.Lock()
			delete(b.tree.nodeWatch, zkID)
			b.tree.mu.Unlock()
		}()
		b.watchNode(ctx, conn, zkID, natsID)
	})
}

// watchNode follows a node znode and its lock until the znode is deleted
// or ctx ends.
func (b *Bridge) watchNode(ctx context.Context, conn *Conn, zkID, natsID string) {
	p := NodesPath + "/" + zkID
	lockDir := p + "/lock"
	var dataCh, lockCh <-chan zk.Event
	needData, needLock := true, true
	for failures := 0; ctx.Err() == nil; {
		if needData {
			data, stat, ch, err := conn.GetW(p)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				b.setNode(zkID, natsID, func(n *znode) { n.gone = true })
				return
			case err != nil:
				failures++
				wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
				continue
			}
			rec, perr := ParseNode(data)
			if perr == nil && rec.NATSID != "" {
				natsID = rec.NATSID
			}
			b.setNode(zkID, natsID, func(n *znode) {
				if stat.Version >= n.version || n.rec == nil {
					n.rec, n.err, n.version = rec, perr, stat.Version
				}
			})
			dataCh, needData = ch, false
		}
		if needLock {
			children, _, ch, err := conn.ChildrenW(lockDir)
			if errors.Is(err, zk.ErrNoNode) {
				// No lock was ever taken: watch for the directory.
				var exists bool
				exists, _, ch, err = conn.ExistsW(lockDir)
				if err == nil && exists {
					continue // made meanwhile: list it
				}
				children = nil
			}
			if err != nil {
				failures++
				wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
				continue
			}
			b.setNode(zkID, natsID, func(n *znode) { n.contenders, n.lockRead = contenders(children), true })
			lockCh, needLock = ch, false
		}
		failures = 0
		select {
		case <-ctx.Done():
			return
		case ev := <-dataCh:
			needData = true
			if ev.Type == zk.EventNodeDeleted {
				b.setNode(zkID, natsID, func(n *znode) { n.gone = true })
				return
			}
		case <-lockCh:
			needLock = true
		}
	}
}

// setNode changes what is known of a node znode and queues its NATS node.
func (b *Bridge) setNode(zkID, natsID string, fn func(*znode)) {
	b.tree.mu.Lock()
	n := b.tree.nodes[zkID]
	if n == nil {
		n = &znode{}
		b.tree.nodes[zkID] = n
	}
	fn(n)
	if natsID != "" {
		n.natsID = natsID
		b.tree.byNATS[natsID] = zkID
	}
	b.tree.mu.Unlock()
	if natsID != "" {
		b.queue.add(nodeKey(natsID))
	}
}

// forgetNode drops what is known of a node znode that is gone.
func (b *Bridge) forgetNode(zkID string) {
	b.tree.mu.Lock()
	defer b.tree.mu.Unlock()
	if n := b.tree.nodes[zkID]; n != nil && n.gone {
		delete(b.tree.nodes, zkID)
		if b.tree.byNATS[n.natsID] == zkID {
			delete(b.tree.byNATS, n.natsID)
		}
	}
}
