package consumers

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// deleteInstance runs a delete machine to completion, retrying with
// backoff. It reports false if ctx ended first. progress, if set, records
// the machine's state after each step.
func (lc *lifecycle) deleteInstance(ctx context.Context, drv drivers.Provider, externalID string, progress func(drivers.StateMachine) error) bool {
	if externalID == "" {
		return true
	}
	sm, err := drv.Delete(externalID, nil)
	if err != nil {
		lc.l.log.Error("cannot start the delete machine", "external_id", externalID, "err", err)
		return false
	}
	return lc.advanceDelete(ctx, sm, func() bool { return !lc.l.fenced() }, progress)
}

// advanceDelete runs a delete machine to completion. may is asked before
// every step (every cloud call): false stops the machine.
func (lc *lifecycle) advanceDelete(ctx context.Context, sm drivers.StateMachine, may func() bool, progress func(drivers.StateMachine) error) bool {
	var saved []byte
	for failures := 0; ctx.Err() == nil; {
		if !may() {
			return false
		}
		step, err := sm.Advance(ctx)
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, drivers.ErrNotFound) {
			return true // gone already
		}
		if errors.Is(err, drivers.ErrFatal) {
			// Retrying cannot help: give up here; an instance that is still
			// there and tagged as ours is tried again by the leak sweep.
			lc.l.log.Error("delete cannot succeed; giving up", "external_id", sm.ExternalID(), "err", err)
			return true
		}
		if err != nil {
			lc.l.log.Warn("delete step failed; retrying", "external_id", sm.ExternalID(), "err", err)
			if !wait.Sleep(ctx, wait.Backoff(failures)) {
				return false
			}
			failures++
			continue
		}
		failures = 0
		if step.Done {
			return true
		}
		if st := sm.State(); progress != nil && !bytes.Equal(st, saved) {
			if err := progress(sm); err != nil {
				return false
			}
			saved = st
		}
		if !wait.Sleep(ctx, min(step.Wait, 2*time.Second)) {
			return false
		}
	}
	return false
}

// runDelete deletes a node's instance and then its record.
func (lc *lifecycle) runDelete(ctx context.Context, e kv.Entry[kv.Node], u providerUse) {
	n := e.Value
	deleteIt, ok := lc.ownsInstance(ctx, u.drv, e.Key, &n)
	if !ok {
		return
	}
	if deleteIt && !lc.deleteNodeInstance(ctx, u.drv, e.Key, &n) {
		return
	}
	lc.deleteRecord(ctx, e.Key, &n)
}

// deleteNodeInstance runs the delete machine of the instance a node
// names. It reports whether the record may go now (false: ctx ended or
// the node is no longer this process's to drive).
func (lc *lifecycle) deleteNodeInstance(ctx context.Context, drv drivers.Provider, id string, n *kv.Node) bool {
	l := lc.l
	sm, err := drv.Delete(n.ExternalID, n.DriverData)
	if err != nil {
		l.log.Warn("cannot resume the delete machine; starting it afresh", "node", id, "err", err)
		sm, err = drv.Delete(n.ExternalID, nil)
	}
	if err != nil {
		// Not an instance the driver can ever delete (an external id
		// written from outside, say): nothing of ours is there; the
		// record goes, and an instance tagged with the node, if any, is
		// deleted by the leak sweep.
		l.log.Error("cannot start the delete machine; deleting the record without it", "node", id, "external_id", n.ExternalID, "err", err)
		return true
	}
	may := func() bool { return lc.mayDrive(id, kv.NodeDeleting) }
	return lc.advanceDelete(ctx, sm, may, func(sm drivers.StateMachine) error {
		_, err := lc.update(ctx, id, kv.NodeDeleting, func(x *kv.Node) { x.DriverData = sm.State() })
		return err
	})
}

// deleteRecord deletes the record of a node whose instance is gone, as
// long as it is still this process's to delete.
func (lc *lifecycle) deleteRecord(ctx context.Context, id string, n *kv.Node) {
	l := lc.l
	for conflicts := 0; ctx.Err() == nil; {
		cur, ok := lc.currentNode(ctx, id)
		if !ok {
			return
		}
		if cur == nil {
			if !wait.Sleep(ctx, time.Second) {
				return
			}
			continue
		}
		if cur.Value.State != kv.NodeDeleting || cur.Value.Launcher != l.opts.ID {
			return
		}
		err := l.b.Nodes.Delete(ctx, id, cur.Revision)
		switch {
		case err == nil || errors.Is(err, kv.ErrNotFound):
			label := createRequest(&cur.Value).Label
			l.metrics.NodeDeleted(n.Provider, label)
			l.log.Info("node deleted", "node", id, "provider", n.Provider, "pool", n.Pool, "label", label, "external_id", n.ExternalID)
			return
		case errors.Is(err, kv.ErrConflict):
			// Written meanwhile: look again (the record decides whether it
			// is still this process's to delete), a little later each time.
			conflicts++
			if !wait.Sleep(ctx, wait.Conflict(conflicts)) {
				return
			}
			if fresh, gerr := l.b.Nodes.Get(ctx, id); gerr == nil {
				l.nodes.Apply(fresh)
			}
		default:
			l.log.Warn("could not delete node record; retrying", "node", id, "err", err)
			if !wait.Sleep(ctx, time.Second) {
				return
			}
		}
	}
}

// currentNode is a node's record from the cache, or from the server when
// the cache has none. ok is false when the node is gone; a nil entry with
// ok means the server did not answer.
func (lc *lifecycle) currentNode(ctx context.Context, id string) (*kv.Entry[kv.Node], bool) {
	if cur, ok := lc.l.nodes.Get(id); ok {
		return &cur, true
	}
	fresh, err := lc.l.b.Nodes.Get(ctx, id)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil, false
	case err != nil:
		return nil, true
	}
	return &fresh, true
}

// ownsInstance tells whether the instance the node record names is to be
// deleted with the node. The record is written by requestors too, so its
// external_id is not trusted to name an instance of the node's: a driver
// that can tell (drivers.Owner) is asked whether the instance was made for
// this node, and one made for another node, or not by this provider, is
// left alone (the record goes; an instance the node did have is then a
// leak, and the leak sweep deletes it). An instance the driver does not
// find goes to the delete machine, which knows gone from not yet listed.
// ok is false if ctx ended or this process may no longer drive
// the node.
func (lc *lifecycle) ownsInstance(ctx context.Context, drv drivers.Provider, id string, n *kv.Node) (deleteIt, ok bool) {
	if n.ExternalID == "" {
		return false, true
	}
	o, can := drivers.As[drivers.Owner](drv)
	if !can {
		return true, true
	}
	for failures := 0; ctx.Err() == nil; failures++ {
		if !lc.mayDrive(id, kv.NodeDeleting) {
			return false, false
		}
		owned, err := o.Owns(ctx, n.ExternalID, id)
		switch {
		case errors.Is(err, drivers.ErrNotFound):
			// Gone, or too new to be listed yet (a cloud's listings may
			// lag its creates): the delete machine tells.
			return true, true
		case err == nil && !owned:
			lc.l.log.Error("the node's external_id names an instance that was not made for this node; deleting the record and leaving that instance alone",
				"node", id, "provider", n.Provider, "external_id", n.ExternalID)
			return false, true
		case err == nil:
			return true, true
		}
		lc.l.log.Warn("could not tell whether the node's instance is its own; asking again", "node", id, "external_id", n.ExternalID, "err", err)
		if !wait.Sleep(ctx, wait.Backoff(failures)) {
			break
		}
	}
	return false, false
}
