package consumers

import (
	"context"
	"errors"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// deadNodeMargin is how long before a listing started a node must have
// been ready (or in use, or held) to be judged by it: room for the clocks
// of the process that wrote the node's state_time and of the cleanup's,
// and for a cloud whose listings lag what its creates and describes
// already show. A node that dies later is judged by the next listing.
const deadNodeMargin = 2 * time.Second

// Reasons of nodes whose instance is dead.
const (
	reasonGone = "instance gone from the cloud"
	reasonIs   = "instance is "
)

// deadNodes judges a provider's nodes by a listing of its instances that
// started at listed (less the driver's drivers.Liveness ListingAge): no
// extra cloud call. A node whose instance the listing lacks, or shows
// Down, is dead:
//
//   - a ready node is failed with the reason ("instance gone from the
//     cloud", "instance is SHUTOFF"), so the node lifecycle deletes what is
//     left of its instance and its record, and min-ready (or the next
//     request) replaces it. One allocated to a request that is not
//     fulfilled yet is freed of it in the same write, so the request's
//     pool gives the request another node (as for a node that vanished);
//     one whose request is already fulfilled keeps its allocation, and its
//     requestor's take is refused (the node is not ready) — request states
//     never go back;
//   - a node in use or held stays its holder's (as in Nodepool, which
//     never looked at them): what was seen goes in its instance_down, which
//     is cleared if the instance runs again. A metastatic provider reads it
//     on its backing nodes.
//
// Nodes ready, in use or held since after the listing started (less
// deadNodeMargin) are left for the next one: an instance that went
// ACTIVE a moment ago may not be in a listing that started before. Every
// write is revision-checked and looks at the node again, so an
// allocation, a take or a delete made meanwhile wins or loses cleanly.
func (c *cleanup) deadNodes(ctx context.Context, provider string, drv drivers.Provider, insts []drivers.Instance, listed time.Time) {
	lv, ok := drivers.As[drivers.Liveness](drv)
	if !ok {
		return // static hosts: nothing listed to judge them by
	}
	l := c.l
	before := listed.Add(-lv.ListingAge() - deadNodeMargin)
	byID := make(map[string]*drivers.Instance, len(insts))
	for i := range insts {
		byID[insts[i].ExternalID] = &insts[i]
	}
	type verdict struct {
		id, ext, why, status string
		state                kv.NodeState
	}
	var due []verdict
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if n.Provider != provider || n.ExternalID == "" || !n.StateTime.Before(before) {
			return true
		}
		inst := byID[n.ExternalID]
		why, judged := instanceDown(inst)
		status := "gone"
		if inst != nil {
			status = inst.Status
		}
		v := verdict{e.Key, n.ExternalID, why, status, n.State}
		switch {
		case !judged:
		case n.State == kv.NodeReady && why != "":
			due = append(due, v)
		case (n.State == kv.NodeInUse || n.State == kv.NodeHold) && n.InstanceDown != why:
			due = append(due, v)
		}
		return true
	})
	for _, v := range due {
		if v.state == kv.NodeReady {
			c.failDead(ctx, provider, v.id, v.ext, v.status, v.why, before)
		} else {
			c.tellDead(ctx, provider, v.id, v.ext, v.status, v.why, before)
		}
	}
}

// instanceDown says whether a node's instance, as a listing shows it (nil:
// not listed), is dead, and why ("" when it runs); judged is false when
// the listing cannot tell (the instance is changing, or in a state the
// driver does not know).
func instanceDown(inst *drivers.Instance) (why string, judged bool) {
	switch {
	case inst == nil:
		return reasonGone, true
	case inst.Run == drivers.Down:
		status := inst.Status
		if status == "" {
			status = "not running"
		}
		return reasonIs + status, true
	case inst.Run == drivers.Running:
		return "", true
	}
	return "", false
}

// failDead fails a ready node whose instance is dead. A request it was
// allocated to that is not fulfilled yet loses it, and its pool replaces
// it.
func (c *cleanup) failDead(ctx context.Context, provider, id, ext, status, why string, before time.Time) {
	l := c.l
	var request string
	var freed bool
	_, err := l.nodes.Modify(ctx, id, func(n *kv.Node) error {
		if n.State != kv.NodeReady || n.ExternalID != ext || !n.StateTime.Before(before) {
			return kv.ErrSkip
		}
		request, freed = n.AllocatedTo, false
		if n.AllocatedTo != "" {
			if r, ok := l.requests.Get(n.AllocatedTo); !ok || r.Value.State != kv.RequestFulfilled {
				n.AllocatedTo, freed = "", true
			}
		}
		n.SetState(kv.NodeFailed, l.clock.Now().UTC())
		n.Launcher, n.Reason = "", why
		return nil
	})
	switch {
	case err == nil:
		l.metrics.DeadInstance(provider, "failed")
		attrs := []any{"provider", provider, "node", id, "external_id", ext, "status", status, "why", why}
		switch {
		case freed:
			attrs = append(attrs, "request", request, "then", "the request gets another node")
		case request != "":
			attrs = append(attrs, "request", request, "then", "the request is fulfilled already; its requestor cannot take the node")
		default:
			attrs = append(attrs, "then", "replaced as min-ready or requests need")
		}
		l.log.Warn("a ready node's instance is gone or not running; the node failed", attrs...)
	case errors.Is(err, kv.ErrSkip), errors.Is(err, kv.ErrNotFound):
	case ctx.Err() == nil:
		l.log.Warn("could not fail a node whose instance is dead", "provider", provider, "node", id, "err", err)
	}
}

// tellDead sets (or, why empty, clears) the instance_down of a node in
// use or held.
func (c *cleanup) tellDead(ctx context.Context, provider, id, ext, status, why string, before time.Time) {
	l := c.l
	var state kv.NodeState
	_, err := l.nodes.Modify(ctx, id, func(n *kv.Node) error {
		if (n.State != kv.NodeInUse && n.State != kv.NodeHold) || n.ExternalID != ext || !n.StateTime.Before(before) || n.InstanceDown == why {
			return kv.ErrSkip
		}
		state = n.State
		n.InstanceDown = why
		return nil
	})
	switch {
	case err == nil && why == "":
		l.log.Info("the instance of a node in use or held runs again", "provider", provider, "node", id, "external_id", ext, "status", status, "state", state)
	case err == nil:
		l.metrics.DeadInstance(provider, "told")
		l.log.Warn("the instance of a node in use or held is gone or not running; its holder keeps it", "provider", provider, "node", id, "external_id", ext, "status", status, "state", state, "why", why)
	case errors.Is(err, kv.ErrSkip), errors.Is(err, kv.ErrNotFound):
	case ctx.Err() == nil:
		l.log.Warn("could not note that a node's instance is dead", "provider", provider, "node", id, "err", err)
	}
}
