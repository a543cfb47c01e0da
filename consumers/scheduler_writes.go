package consumers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// claim takes a waiting request for this pool (requested -> pending, with
// its plan) and then allocates or creates its nodes.
func (s *scheduler) claim(ctx context.Context, id string, plan []slot) {
	if !slices.ContainsFunc(plan, func(sl slot) bool { return !sl.reuse }) {
		s.serveFromReady(ctx, id, plan)
		return
	}
	now := s.l.clock.Now().UTC()
	e, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestRequested || slices.Contains(r.DeclinedBy, s.ref) {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestPending, now)
		r.Provider, r.Pool = s.prov.Name, s.pool.Name
		r.Reason = "" // notes of pools that declined it
		r.Nodes = make([]string, len(r.Labels))
		for _, sl := range plan {
			r.Nodes[sl.index] = sl.node
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			s.log.Warn("could not claim request", "request", id, "err", err)
		}
		return
	}
	s.assign(ctx, &e.Value, plan)
}

// serveFromReady serves a request whose every node is a ready one: the
// nodes are allocated first, then the request goes from requested straight
// to fulfilled in one write. If that write fails (the request changed or
// went), the nodes are given back; if the process dies in between, the next
// pass frees nodes allocated to a request that does not list them.
func (s *scheduler) serveFromReady(ctx context.Context, id string, plan []slot) {
	cached, found := s.l.requests.Get(id)
	if !found {
		return
	}
	r := &cached.Value
	var wg sync.WaitGroup
	ok := make([]bool, len(plan))
	for i, sl := range plan {
		wg.Go(func() { ok[i] = s.allocate(ctx, sl.node, r) })
	}
	wg.Wait()
	undo := func() {
		for i, sl := range plan {
			if ok[i] {
				s.freeNode(ctx, sl.node, id)
			}
		}
	}
	if slices.Contains(ok, false) {
		undo() // a node went meanwhile; the next pass plans again
		return
	}
	now := s.l.clock.Now().UTC()
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestRequested || slices.Contains(r.DeclinedBy, s.ref) {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFulfilled, now)
		r.Provider, r.Pool = s.prov.Name, s.pool.Name
		r.Reason = ""
		r.Nodes = planNodes(r, plan)
		return nil
	})
	if errors.Is(err, kv.ErrSkip) || errors.Is(err, kv.ErrNotFound) {
		undo() // nothing was written
		return
	}
	if err != nil {
		// The write may have landed all the same (its answer lost, or
		// late): the nodes are given back only once it cannot land any
		// more, or they would be handed to another request while this
		// one, fulfilled after all, lists them.
		if ctx.Err() != nil {
			return // left allocated: the next leader's pass settles them
		}
		s.log.Warn("could not fulfil request; settling whether the write landed", "request", id, "err", err)
		landed, err := settleRequest(ctx, s.l.b.Requests, s.l.requests, id, func(r *kv.Request) bool {
			return r.State == kv.RequestFulfilled && slices.Equal(r.Nodes, planNodes(r, plan))
		})
		switch {
		case err != nil:
			s.log.Warn("could not settle a request's fulfilment; its nodes stay allocated to it until a pass can", "request", id, "err", err)
		case landed:
			s.fulfilled(cached.Value.Created, id, plan...)
		default:
			undo()
		}
		return
	}
	s.fulfilled(cached.Value.Created, id, plan...)
}

// planNodes is the node list a fulfilment of r by plan writes.
func planNodes(r *kv.Request, plan []slot) []string {
	nodes := make([]string, len(r.Labels))
	for _, sl := range plan {
		if sl.index < len(nodes) {
			nodes[sl.index] = sl.node
		}
	}
	return nodes
}

// settleRequest makes sure that no write of request id sent before it can
// land any more, and reports whether one did: whether the request, read
// afresh from the server, is as listed says. A write whose answer never
// came (a timeout, a lost connection) may land later on a loaded cluster;
// giving back the nodes of a fulfilment in that doubt handed them to a
// second request while the first, fulfilled after all, listed them
// (TestClusterNodesLeaderKilled under load). Writing the request again,
// unchanged, at the revision it is read at closes the door: a write sent
// earlier was made at that revision or an older one, and is refused from
// then on. A request that is gone takes no write either.
func settleRequest(ctx context.Context, store *kv.Store[kv.Request], cache *kv.Cache[kv.Request], id string, listed func(*kv.Request) bool) (bool, error) {
	var err error
	for n := range settleTries {
		if n > 0 && !wait.Sleep(ctx, wait.Backoff(n-1)) {
			return false, ctx.Err()
		}
		var e kv.Entry[kv.Request]
		e, err = store.Get(ctx, id)
		if errors.Is(err, kv.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			continue
		}
		cache.Apply(e)
		if listed(&e.Value) {
			return true, nil
		}
		if _, err = cache.Update(ctx, id, &e.Value, e.Revision); err == nil {
			return false, nil
		}
	}
	return false, fmt.Errorf("settling request %s: %w", id, err)
}

// settleTries bounds the reads and writes of settleRequest.
const settleTries = 5

// replan replaces the nodes of some slots of a pending request.
func (s *scheduler) replan(ctx context.Context, id string, old []string, plan []slot) {
	if !s.settleDoubts(ctx, plan) {
		return
	}
	e, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name || !slices.Equal(r.Nodes, old) {
			return kv.ErrSkip
		}
		if len(r.Nodes) != len(r.Labels) {
			r.Nodes = make([]string, len(r.Labels))
		}
		changed := false
		for _, sl := range plan {
			changed = changed || r.Nodes[sl.index] != sl.node
			r.Nodes[sl.index] = sl.node
		}
		if !changed {
			return errUnchanged // nodes made again under their keys
		}
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return
	}
	s.assign(ctx, &e.Value, plan)
}

// errUnchanged: a write that would change nothing was not sent.
var errUnchanged = errors.New("nothing to change")

// settleDoubts looks afresh at the nodes a plan makes again under their
// own keys: one that is there after all needs nothing (the term's view is
// behind; false), and one that lived and was deleted gets a new key, as
// its key named it to the cloud already.
func (s *scheduler) settleDoubts(ctx context.Context, plan []slot) bool {
	for i := range plan {
		if !plan[i].again {
			continue
		}
		deleted, _, _, err := s.l.b.Nodes.LastDeletion(ctx, plan[i].node)
		switch {
		case err == nil && deleted:
			plan[i].node, plan[i].again = newNodeID(), false
		case errors.Is(err, kv.ErrNotFound):
			s.log.Info("making a node again under its key: its first write may have landed unseen", "node", plan[i].node)
		case err == nil:
			return false
		default:
			s.log.Debug("could not read a node whose creation is in doubt", "node", plan[i].node, "err", err)
			return false
		}
	}
	return true
}

// assign allocates the reused nodes and creates the new ones of a plan, all
// at once; if every node of the request is then ready, it is fulfilled.
func (s *scheduler) assign(ctx context.Context, r *kv.Request, plan []slot) {
	l := s.l
	var wg sync.WaitGroup
	ok := make([]bool, len(plan))
	for i, sl := range plan {
		wg.Go(func() {
			if sl.reuse {
				ok[i] = s.allocate(ctx, sl.node, r)
			} else {
				ok[i] = s.create(ctx, sl, r)
			}
		})
	}
	wg.Wait()
	for i, sl := range plan {
		if !ok[i] || !sl.reuse {
			return // the next pass replans what failed; launches take time
		}
	}
	for _, id := range r.Nodes {
		e, found := l.nodes.Get(id)
		if !found || e.Value.State != kv.NodeReady || e.Value.AllocatedTo != r.ID {
			return
		}
	}
	s.fulfil(ctx, r.ID, r.Nodes)
}

// allocate gives a ready, unallocated node to a request.
func (s *scheduler) allocate(ctx context.Context, nodeID string, r *kv.Request) bool {
	_, err := s.l.nodes.Modify(ctx, nodeID, func(n *kv.Node) error {
		if n.State != kv.NodeReady || n.AllocatedTo != "" {
			return kv.ErrSkip
		}
		n.AllocatedTo, n.Requestor, n.Tenant = r.ID, r.Requestor, r.Tenant
		return nil
	})
	if err != nil {
		return false
	}
	s.l.metrics.Allocated(s.prov.Name, s.pool.Name)
	return true
}

// create writes the record of a new node for a request; the node lifecycle
// group launches it.
func (s *scheduler) create(ctx context.Context, sl slot, r *kv.Request) bool {
	now := s.l.clock.Now().UTC()
	size, err := s.drv.QuotaForLabel(s.pool.Name, sl.label)
	if err != nil {
		size = kv.Resources{Instances: 1}
	}
	// A new node goes to the availability zone of a node its request
	// reuses, as Nodepool keeps the nodes of a request in one zone (the
	// driver chooses when there is none).
	az := ""
	for _, id := range r.Nodes {
		if e, ok := s.l.nodes.Get(id); ok && id != sl.node && e.Value.AZ != "" && e.Value.Provider == s.prov.Name {
			az = e.Value.AZ
			break
		}
	}
	n := &kv.Node{
		ID: sl.node, State: kv.NodeBuilding, Labels: []string{sl.label}, AZ: az,
		Provider: s.prov.Name, Pool: s.pool.Name, Cloud: s.prov.Cloud,
		AllocatedTo: r.ID, Requestor: r.Requestor, Tenant: r.Tenant,
		HostKeys: []string{}, Attributes: maps.Clone(map[string]string(s.pool.NodeAttributes)), Resources: size,
		Created: now, StateTime: now, Attempt: 1,
	}
	if sl.again {
		// Not over a key deleted lately: that node lived, and its slot
		// gets a new one on the next pass.
		_, err = s.l.nodes.CreateNew(ctx, n.ID, n)
		return err == nil
	}
	_, err = s.l.nodes.Create(ctx, n.ID, n)
	if err != nil && !errors.Is(err, kv.ErrExists) {
		if ctx.Err() == nil {
			s.log.Warn("could not create node", "node", n.ID, "request", r.ID, "err", err)
		}
		return false
	}
	return true
}

// fulfil marks a pending request fulfilled with its nodes.
func (s *scheduler) fulfil(ctx context.Context, id string, nodes []string) {
	e, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name || !slices.Equal(r.Nodes, nodes) {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFulfilled, s.l.clock.Now().UTC())
		r.Reason = ""
		return nil
	})
	if err == nil {
		s.fulfilled(e.Value.Created, id)
	}
}

// fulfilled counts and logs a request fulfilled by this pool. created is
// the request's, its message's time on the NATS server: real time.
func (s *scheduler) fulfilled(created time.Time, id string, plan ...slot) {
	s.l.metrics.Request(s.prov.Name, s.pool.Name, metrics.RequestFulfilled, time.Since(created))
	nodes := make([]string, 0, len(plan))
	for _, sl := range plan {
		nodes = append(nodes, sl.node)
	}
	if len(plan) == 0 {
		if e, ok := s.l.requests.Get(id); ok {
			nodes = e.Value.Nodes
		}
	}
	s.l.log.Info("request fulfilled", "request", id, "provider", s.prov.Name, "pool", s.pool.Name, "nodes", nodes)
}

// fail marks a pending request of this pool failed.
func (s *scheduler) fail(ctx context.Context, id, reason string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFailed, s.l.clock.Now().UTC())
		r.Reason = reason
		return nil
	})
	if err == nil {
		s.l.metrics.Request(s.prov.Name, s.pool.Name, metrics.RequestFailed, 0)
	}
}

// noteWait records why a waiting request waits in this pool.
func (s *scheduler) noteWait(ctx context.Context, id, why string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestRequested || slices.Contains(r.DeclinedBy, s.ref) || r.Reason == why || !mayNoteWait(r.Reason, s.ref) {
			return kv.ErrSkip
		}
		r.Reason = why
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.log.Debug("could not note why a request waits", "request", id, "err", err)
	}
}

// decline records that this pool cannot serve a request, and why (in the
// reason, which says why every pool declined when the last one fails it).
func (s *scheduler) decline(ctx context.Context, id, why string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestRequested || slices.Contains(r.DeclinedBy, s.ref) {
			return kv.ErrSkip
		}
		r.DeclinedBy = append(r.DeclinedBy, s.ref)
		note := s.ref + ": " + why
		if r.Reason == "" || strings.HasPrefix(r.Reason, "waiting in pool ") {
			r.Reason = note
		} else {
			r.Reason += "; " + note
		}
		failIfAllDeclined(r, s.l.livePools(), s.l.clock.Now().UTC())
		return nil
	})
	if err == nil {
		s.l.metrics.Request(s.prov.Name, s.pool.Name, metrics.RequestDeclined, 0)
	}
}

// failIfAllDeclined fails a waiting request that every live pool declined.
func failIfAllDeclined(r *kv.Request, live map[string]kv.ComponentPool, now time.Time) bool {
	if r.State != kv.RequestRequested || len(live) == 0 {
		return false
	}
	for ref := range live {
		if !slices.Contains(r.DeclinedBy, ref) {
			return false
		}
	}
	r.SetState(kv.RequestFailed, now)
	why := r.Reason
	if why == "" {
		why = strings.Join(r.DeclinedBy, ", ")
	}
	r.Reason = fmt.Sprintf("no pool can serve labels [%s]: declined by every live pool (%s)", strings.Join(r.Labels, " "), why)
	return true
}

// freeNode takes a node back from a request that is gone, failed, or no
// longer lists it; it becomes an unallocated node of the pool.
func (s *scheduler) freeNode(ctx context.Context, nodeID, request string) {
	_, err := s.l.nodes.Modify(ctx, nodeID, func(n *kv.Node) error {
		if n.AllocatedTo != request || (n.State != kv.NodeReady && n.State != kv.NodeBuilding) {
			return kv.ErrSkip
		}
		n.AllocatedTo, n.Requestor, n.Tenant = "", "", ""
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.log.Warn("could not free node", "node", nodeID, "err", err)
	}
}

// freeOrphan frees a node allocated to a request that did not list it
// when the pass looked (or is gone, or failed), once no write of that
// request sent earlier can make it list the node (settleRequest): a
// fulfilment whose answer was lost may land after the pass looked. A
// failed request stays failed whatever comes late.
func (s *scheduler) freeOrphan(ctx context.Context, nodeID, request string, failed bool) {
	if !failed {
		listed, err := settleRequest(ctx, s.l.b.Requests, s.l.requests, request, func(r *kv.Request) bool {
			return r.State != kv.RequestFailed && slices.Contains(r.Nodes, nodeID)
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Debug("could not settle the request of an allocated node; freeing it later", "node", nodeID, "request", request, "err", err)
			}
			return
		}
		if listed {
			return
		}
	}
	s.freeNode(ctx, nodeID, request)
}

// failBroken fails a request that could not be handled (its handling
// panicked), whatever its state short of done, with the reason.
func (s *scheduler) failBroken(ctx context.Context, id, reason string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.Done() {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFailed, s.l.clock.Now().UTC())
		r.Reason = reason
		return nil
	})
	if err == nil {
		s.l.metrics.Request(s.prov.Name, s.pool.Name, metrics.RequestFailed, 0)
	} else if !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.log.Warn("could not fail request", "request", id, "err", err)
	}
}

// jobPanicked fails the request of a job that panicked.
func (s *scheduler) jobPanicked(ctx context.Context, d jobDone, p any) {
	s.log.Error("scheduler job panicked", "request", d.subject, "keys", d.keys, "panic", p, "stack", string(debug.Stack()))
	if d.subject != "" {
		s.failBroken(ctx, d.subject, panicReason(p))
	}
}
