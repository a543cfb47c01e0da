package consumers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// A handler that panics (a bug, or input nobody validated well enough)
// fails the one record it was handling, with the reason, and the process
// goes on: one bad record never takes a launcher down, and never takes
// every launcher down one after the other.

// panicReason is the reason recorded on a record whose handler panicked.
func panicReason(p any) string {
	return fmt.Sprintf("internal error (a bug, please report it): %v", p)
}

// quarantine is how long a node whose machine panicked here is left to
// other processes (or to a later try) before this one claims it again.
const quarantine = time.Minute

// machinePanicked handles a create or delete machine that panicked: a
// create's node is failed with the reason (its request fails with it, and
// the node is deleted as any failed node, its instance with it); a delete
// is given up here and left to be tried afresh later, by this process
// after the quarantine or by another one.
func (lc *lifecycle) machinePanicked(e kv.Entry[kv.Node], p any) {
	lc.l.log.Error("machine panicked; failing its node", "node", e.Key, "state", e.Value.State, "panic", p, "stack", string(debug.Stack()))
	if e.Value.State != kv.NodeBuilding {
		// A failed create is deleted at once; a delete that panicked is
		// left alone here for a while.
		lc.mu.Lock()
		lc.panicked[e.Key] = lc.l.clock.Now()
		lc.mu.Unlock()
	}
	reason := panicReason(p)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(lc.ctx), 10*time.Second)
	defer cancel()
	_, err := lc.l.nodes.Modify(ctx, e.Key, func(n *kv.Node) error {
		if n.Launcher != lc.l.opts.ID || n.State != e.Value.State {
			return kv.ErrSkip
		}
		n.Reason = reason
		n.DriverData = nil // the next machine starts afresh
		if n.State == kv.NodeBuilding {
			n.SetState(kv.NodeFailed, lc.l.clock.Now().UTC())
		} else {
			n.Launcher = ""
		}
		return nil
	})
	if err != nil {
		lc.l.log.Warn("could not record the panic on the node", "node", e.Key, "err", err)
	}
}

// handlerPanicked handles a work message whose handling panicked: the
// node gets the reason (a launch is failed with it), this process leaves
// it alone for a while, and the message is acknowledged.
func (lc *lifecycle) handlerPanicked(key string, msg jetstream.Msg, p any) {
	lc.l.log.Error("handling a node change panicked; failing the node", "node", key, "panic", p, "stack", string(debug.Stack()))
	lc.mu.Lock()
	lc.panicked[key] = lc.l.clock.Now()
	lc.mu.Unlock()
	reason := panicReason(p)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(lc.ctx), 10*time.Second)
	defer cancel()
	_, err := lc.l.nodes.Modify(ctx, key, func(n *kv.Node) error {
		if n.Reason == reason {
			return kv.ErrSkip
		}
		n.Reason = reason
		if n.State == kv.NodeBuilding {
			n.SetState(kv.NodeFailed, lc.l.clock.Now().UTC())
		}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) {
		lc.l.log.Warn("could not record the panic on the node", "node", key, "err", err)
	}
	lc.ack(msg)
}

// quarantined reports whether a node's machine panicked here lately.
func (lc *lifecycle) quarantined(id string) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	at, ok := lc.panicked[id]
	if ok && lc.l.clock.Since(at) > quarantine {
		delete(lc.panicked, id)
		return false
	}
	return ok
}

// safeLoop runs a leader's loop (a pool's scheduler, cleanup, min-ready, a
// driver's manager) so that a panic in it is logged and the loop started
// again after a pause, while the lease is held, instead of killing the
// process.
func safeLoop(l *Launcher, what string, fn func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		for failures := 0; ctx.Err() == nil; failures++ {
			if !runGuarded(l, what, ctx, fn) {
				return // returned normally: the lease was lost or ctx ended
			}
			if !wait.Sleep(ctx, wait.Backoff(failures+3)) {
				return
			}
		}
	}
}

// runGuarded runs fn and reports whether it panicked.
func runGuarded(l *Launcher, what string, ctx context.Context, fn func(context.Context)) (panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			panicked = true
			l.log.Error("panic; starting again", "loop", what, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	fn(ctx)
	return false
}
