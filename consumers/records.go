package consumers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// unaccountable finds, on every sweep, the records the service cannot
// account for, and ends them, so that none pins quota or capacity:
//
//   - a node record that does not decode, or has a problem (kv.Node.Problem:
//     an unknown state, no provider, resources below zero), is failed with
//     the reason (its instance, if it names one, is deleted by a
//     launcher like any failed node's) or, when it names no
//     provider, or a provider not configured and no instance, deleted (an
//     instance it named is tagged with its provider, whose leak sweep
//     finds it);
//   - an init record of a provider whose driver registers no nodes (only
//     static does), or of a provider no longer configured, is deleted:
//     nothing owns it, and it names no instance;
//   - a request record that does not decode, or whose state is unknown, is
//     failed with the reason, where its requestor reads it; failed
//     requests age out (FailedRequestAge).
//
// A node failed here loses its allocation, so that its request plans
// another node in its place. Every write is revision-checked: a record
// changed meanwhile is looked at again on the next sweep.
func (c *cleanup) unaccountable(ctx context.Context) {
	now := c.l.clock.Now().UTC()
	for _, f := range c.unaccountableNodes(now) {
		c.endNodeRecord(ctx, f)
	}
	for _, f := range c.unaccountableRequests(now) {
		c.l.log.Warn("failing a request record nothing can act on", "request", f.key, "reason", f.req.Reason)
		if _, err := c.l.requests.Update(ctx, f.key, &f.req, f.rev); err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			c.l.log.Warn("could not fail a request record", "request", f.key, "err", err)
		}
	}
}

// nodeFix is what becomes of a node record nothing accounts for.
type nodeFix struct {
	key    string
	rev    uint64
	reason string
	node   *kv.Node // nil: delete the record
}

// requestFix is a request record nothing can act on, failed.
type requestFix struct {
	key string
	rev uint64
	req kv.Request
}

// unaccountableNodes lists the node records nothing accounts for.
func (c *cleanup) unaccountableNodes(now time.Time) []nodeFix {
	l := c.l
	cfg := l.config()
	var fixes []nodeFix
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if p := n.Problem(); p != "" {
			fixes = append(fixes, nodeFix{e.Key, e.Revision, "record is not valid: " + p, failedNode(e.Key, n, now)})
			return true
		}
		if n.State != kv.NodeInit {
			return true
		}
		prov, known := cfg.Provider(n.Provider)
		switch {
		case !known:
			fixes = append(fixes, nodeFix{key: e.Key, rev: e.Revision, reason: fmt.Sprintf("init record of provider %q, which is not configured", n.Provider)})
		case prov.Driver != "static":
			fixes = append(fixes, nodeFix{key: e.Key, rev: e.Revision, reason: fmt.Sprintf("init record of provider %q, whose %s driver registers no nodes: nothing owns it", n.Provider, prov.Driver)})
		}
		return true
	})
	for _, b := range l.nodes.BadRecords() {
		n := kv.SalvageNode(b.Key, b.Data)
		fixes = append(fixes, nodeFix{b.Key, b.Revision, "record did not parse: " + b.Err.Error(), failedNode(b.Key, n, now)})
	}
	return fixes
}

// endNodeRecord fails or deletes a node record nothing accounts for.
func (c *cleanup) endNodeRecord(ctx context.Context, f nodeFix) {
	l := c.l
	if f.node != nil {
		// A record naming no provider, or a provider not configured and
		// no instance, names nothing anyone could clean: it goes. (An
		// instance it named is tagged with its provider, and found as
		// leaked by that provider's sweep.)
		if _, known := l.config().Provider(f.node.Provider); f.node.Provider == "" || (!known && f.node.ExternalID == "") {
			f.node = nil
		}
	}
	var err error
	if f.node == nil {
		l.log.Warn("deleting a node record nothing accounts for", "node", f.key, "reason", f.reason)
		err = l.nodes.Delete(ctx, f.key, f.rev)
	} else {
		f.node.Reason = f.reason
		l.log.Warn("failing a node record nothing accounts for", "node", f.key, "provider", f.node.Provider, "external_id", f.node.ExternalID, "reason", f.reason)
		_, err = l.nodes.Update(ctx, f.key, f.node, f.rev)
	}
	if err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		l.log.Warn("could not end a node record", "node", f.key, "err", err)
	}
}

// unaccountableRequests lists the request records nothing can act on,
// failed with the reason.
func (c *cleanup) unaccountableRequests(now time.Time) []requestFix {
	l := c.l
	var fixes []requestFix
	l.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if p := e.Value.Problem(); p != "" {
			r := e.Value.Clone()
			r.State, r.StateTime, r.Reason = kv.RequestFailed, now, "record is not valid: "+p
			fixes = append(fixes, requestFix{e.Key, e.Revision, r})
		}
		return true
	})
	for _, b := range l.requests.BadRecords() {
		r := kv.SalvageRequest(b.Key, b.Data)
		r.State, r.Created, r.StateTime, r.Reason = kv.RequestFailed, now, now, "record did not parse: "+b.Err.Error()
		fixes = append(fixes, requestFix{b.Key, b.Revision, r})
	}
	return fixes
}

// failedNode is what a node record nothing accounts for becomes: failed,
// owned by nobody and allocated to nobody (its request plans another
// node), with what it names in the cloud kept so that a launcher's delete
// removes that.
func failedNode(key string, n *kv.Node, now time.Time) *kv.Node {
	out := n.Clone()
	out.ID = key
	out.State, out.StateTime = kv.NodeFailed, now
	out.Launcher, out.AllocatedTo, out.Holder, out.LeaseUntil = "", "", "", nil
	if out.Resources.Problem() != "" {
		out.Resources = kv.Resources{}
	}
	if out.Created.IsZero() {
		out.Created = now
	}
	return &out
}
