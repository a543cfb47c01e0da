package consumers

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// requestLess orders requests: real ones before min-ready ones, then lower
// priority, lower relative priority, earlier submission.
func requestLess(a, b *kv.Request) int {
	am, bm := a.Requestor == MinReadyRequestor, b.Requestor == MinReadyRequestor
	switch {
	case am != bm:
		if am {
			return 1
		}
		return -1
	case a.Priority != b.Priority:
		return a.Priority - b.Priority
	case a.RelativePriority != b.RelativePriority:
		return a.RelativePriority - b.RelativePriority
	case !a.Created.Equal(b.Created):
		return a.Created.Compare(b.Created)
	}
	return strings.Compare(a.ID, b.ID)
}

// slot is one node of a request's plan.
type slot struct {
	index int
	label string
	node  string // id of the node (existing when reuse, new otherwise)
	reuse bool
	// again: the slot's node, planned earlier, is made again under the
	// same key, as its first write may have landed unseen (see plan).
	again bool
}

// againWindow bounds how long after a request was claimed a node of its
// plan that no record shows is made again under its own key rather than
// a new one: well within the 30 minutes cleanup keeps delete markers, so
// that a node that lived and was deleted is told from one whose creation
// is in doubt.
const againWindow = 10 * time.Minute

// headroom is what may be launched now, given the records and the jobs in
// flight.
func (t *term) headroom() *headroom {
	used := t.idx.used
	h := &headroom{
		pool:     poolLimits(t.pool).Less(used.poolUsed),
		provider: t.cloud.limits.Less(t.cloud.others).Less(used.provUsed),
		tenants:  map[string]kv.Resources{},
	}
	for _, tl := range t.snap.cfg.TenantResourceLimits {
		h.tenants[tl.TenantName] = tenantLimits(tl).Less(used.tenants[tl.TenantName])
	}
	for _, in := range t.jobs.newNodes {
		h.take(in.tenant, in.size)
	}
	return h
}

// pass looks at the pool's requests and nodes and starts the jobs they need.
func (t *term) pass(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	t.freeOrphaned(ctx)
	free := t.freeNodes()
	room := t.headroom()
	if t.registered {
		room.pool = kv.Resources{} // a registered pool never launches
	}
	t.recheckPending(ctx, free, room)
	q := &queue{t: t, free: free, room: room, live: t.l.livePools(),
		blockedLabels: map[string]string{}, blockedTenants: map[string]string{}}
	for _, r := range t.waitingRequests() {
		t.guarded(ctx, r.ID, func() { q.serve(ctx, r) })
	}
	if q.paused != t.paused {
		t.paused = q.paused
		t.l.setPaused(t.ref, q.paused)
	}
}

// freeOrphaned gives back to the pool nodes allocated to requests that are
// gone, failed, or no longer list them.
func (t *term) freeOrphaned(ctx context.Context) {
	ix, jobs := t.idx, t.jobs
	s := t.scheduler // jobs run beside the loop: they touch no term state
	for id := range ix.suspects {
		delete(ix.suspects, id)
		e, ok := ix.poolNodes[id]
		if !ok || jobs.busy[id] || jobs.reserved[id] {
			continue // a job in flight marks it again when done
		}
		n := &e.Value
		if n.AllocatedTo == "" || (n.State != kv.NodeReady && n.State != kv.NodeBuilding) {
			continue
		}
		if r, ok := ix.requests[n.AllocatedTo]; !ok || r.Value.State == kv.RequestFailed || !slices.Contains(r.Value.Nodes, id) {
			failed := ok && r.Value.State == kv.RequestFailed
			jobs.spawn(ctx, jobDone{keys: []string{id}}, func(ctx context.Context) { s.freeOrphan(ctx, id, n.AllocatedTo, failed) })
		}
	}
}

// freeNodes lists, per label, the ready unallocated nodes no job has
// reserved, oldest first.
func (t *term) freeNodes() map[string][]string {
	ix := t.idx
	free := map[string][]string{}
	for label, ids := range ix.free {
		for id := range ids {
			if !t.jobs.reserved[id] {
				free[label] = append(free[label], id)
			}
		}
		slices.SortFunc(free[label], func(a, b string) int {
			return ix.poolNodes[a].Value.StateTime.Compare(ix.poolNodes[b].Value.StateTime)
		})
	}
	return free
}

// recheckPending looks at the pending requests that something happened to.
func (t *term) recheckPending(ctx context.Context, free map[string][]string, room *headroom) {
	ix := t.idx
	for id := range ix.dirty {
		e, ok := ix.pending[id]
		if !ok {
			delete(ix.dirty, id)
			continue
		}
		if t.jobs.busy[id] {
			continue // looked at again when its job is done
		}
		r := e.Value
		done := true
		if t.guarded(ctx, id, func() { done = t.checkPending(ctx, &r, free, room) }) || done {
			delete(ix.dirty, id)
		}
	}
}

// waitingRequests lists the requests this pool may serve, in order of
// service.
func (t *term) waitingRequests() []*kv.Request {
	var waiting []*kv.Request
	now := t.l.clock.Now()
	for id, e := range t.idx.waiting {
		if t.jobs.busy[id] || slices.Contains(e.Value.DeclinedBy, t.ref) || requestExpired(&e.Value, now) {
			continue // an expired request is deleted by cleanup
		}
		r := e.Value
		waiting = append(waiting, &r)
	}
	slices.SortFunc(waiting, requestLess)
	return waiting
}

// queue serves a pass's waiting requests in order. A request that does not
// fit waits in its place: it keeps the ready nodes it would take, and
// requests behind it for one of its labels (or, when a tenant limit stops
// it, of its tenant) wait behind it. Requests for other labels pass it
// when they fit.
type queue struct {
	t    *term
	free map[string][]string
	room *headroom
	live map[string]kv.ComponentPool

	blockedLabels  map[string]string // label -> why the request it waits behind waits
	blockedTenants map[string]string // tenant -> why the request it waits behind waits
	paused         bool              // a request waits for quota
}

// serve declines a request, leaves it waiting, or starts the job that
// claims its nodes.
func (q *queue) serve(ctx context.Context, r *kv.Request) {
	t := q.t
	s := t.scheduler
	if why := t.cannotServe(r); why != "" {
		t.jobs.spawn(ctx, jobDone{keys: []string{r.ID}, subject: r.ID}, func(ctx context.Context) { s.decline(ctx, r.ID, why) })
		return
	}
	if !t.imagesReady(r) {
		return // waits for an upload of its diskimage; not a decline
	}
	if t.deferred(r, q.live) {
		return
	}
	plan, need := t.plan(r, q.free, nil)
	if why, behind := q.behind(r, need); behind {
		t.waiting(ctx, r, why, true)
		return
	}
	if ok, by := q.room.fits(r.Tenant, need); !ok {
		q.block(ctx, r, need, by)
		return
	}
	q.room.take(r.Tenant, need)
	t.jobs.newNodes[r.ID] = inflight{tenant: r.Tenant, size: need}
	d := jobDone{keys: []string{r.ID}, request: r.ID, subject: r.ID}
	for _, sl := range plan {
		if sl.reuse {
			d.reserved = append(d.reserved, sl.node)
		}
	}
	t.jobs.spawn(ctx, d, func(ctx context.Context) { s.claim(ctx, r.ID, plan) })
}

// behind tells whether a request that needs new nodes waits behind an
// earlier one of its tenant or of one of its labels, and why that one
// waits.
func (q *queue) behind(r *kv.Request, need kv.Resources) (string, bool) {
	if need.Instances <= 0 {
		return "", false
	}
	if why := q.blockedTenants[r.Tenant]; why != "" {
		return why, true
	}
	if lb := slices.IndexFunc(r.Labels, func(lb string) bool { return q.blockedLabels[lb] != "" }); lb >= 0 {
		return q.blockedLabels[r.Labels[lb]], true
	}
	return "", false
}

// block leaves a request that does not fit waiting for quota, and the
// requests behind it too.
func (q *queue) block(ctx context.Context, r *kv.Request, need kv.Resources, by string) {
	why := q.t.quotaWait(r, need, by)
	q.t.waiting(ctx, r, why, false)
	if strings.HasPrefix(by, "tenant ") {
		// Only this tenant's requests wait behind it.
		q.blockedTenants[r.Tenant] = why
		return
	}
	for _, lb := range r.Labels {
		q.blockedLabels[lb] = why
	}
	q.paused = true
}

// guarded runs the planning of one request: a panic fails that request,
// with the reason, and the pass goes on with the others. It reports
// whether fn panicked.
func (t *term) guarded(ctx context.Context, id string, fn func()) (panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			panicked = true
			t.log.Error("planning a request panicked; failing it", "request", id, "panic", p, "stack", string(debug.Stack()))
			s, reason := t.scheduler, panicReason(p)
			t.jobs.spawn(ctx, jobDone{keys: []string{id}}, func(ctx context.Context) { s.failBroken(ctx, id, reason) })
		}
	}()
	fn()
	return false
}

// plan picks, for each label of r (or the given slots only), a ready node
// of this pool or a new one; free loses the nodes picked. need is what the
// new nodes cost.
func (t *term) plan(r *kv.Request, free map[string][]string, only []int) ([]slot, kv.Resources) {
	var plan []slot
	var need kv.Resources
	for i, label := range r.Labels {
		if only != nil && !slices.Contains(only, i) {
			continue
		}
		if only != nil && t.inDoubt(r, i) {
			// A create whose answer was lost (a stream between leaders)
			// may land after all, even after another term planned anew:
			// a node under a new key beside it would take the pool past
			// max-servers. Under the same key, only one of them can.
			plan = append(plan, slot{index: i, label: label, node: r.Nodes[i], again: true})
			need = need.Add(t.sizes[label])
			continue
		}
		if (r.Reuse || t.registered) && len(free[label]) > 0 {
			id := free[label][0]
			plan = append(plan, slot{index: i, label: label, node: id, reuse: true})
			t.takeFree(free, label, id)
			continue
		}
		plan = append(plan, slot{index: i, label: label, node: newNodeID()})
		need = need.Add(t.sizes[label])
	}
	return plan, need
}

// inDoubt tells whether the node a pending request's plan names for slot i
// may still be on its way: no record of it was seen by this term, alive or
// deleted, and the plan is recent.
func (t *term) inDoubt(r *kv.Request, i int) bool {
	if i >= len(r.Nodes) || !isNodeID(r.Nodes[i]) || t.l.clock.Now().Sub(r.StateTime) >= againWindow {
		return false
	}
	id := r.Nodes[i]
	_, seen := t.idx.nodes[id]
	return !seen && t.idx.goneNodes[id] == 0
}

// takeFree removes a node picked for a label from the free lists of every
// label it has.
func (t *term) takeFree(free map[string][]string, label, id string) {
	labels := []string{label}
	if e, ok := t.idx.poolNodes[id]; ok {
		labels = append(labels, e.Value.Labels...)
	}
	for _, l := range labels {
		free[l] = slices.DeleteFunc(free[l], func(x string) bool { return x == id })
	}
}

// nodeIDAlphabet and nodeIDLen make the node ids the scheduler gives.
const (
	nodeIDAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	nodeIDLen      = 13
)

// isNodeID tells whether id is one newNodeID could have given.
func isNodeID(id string) bool {
	return len(id) == nodeIDLen && strings.Trim(id, nodeIDAlphabet) == ""
}

// newNodeID returns a fresh random node id (13 characters of [0-9a-z]).
func newNodeID() string {
	const alphabet = nodeIDAlphabet
	var b [nodeIDLen]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// cannotServe says why this pool could never serve r ("" if it could):
// a label it does not provide, or more than its whole quota, its
// provider's whole quota or the tenant's limits.
func (t *term) cannotServe(r *kv.Request) string {
	if t.pool.Disabled() {
		return fmt.Sprintf("the pool is disabled (max-servers: %d)", t.pool.MaxServers)
	}
	var all kv.Resources
	for _, label := range r.Labels {
		if !t.labels[label] {
			return fmt.Sprintf("label %s is not in this pool", label)
		}
		if mr, off := t.disabled[label]; off {
			return fmt.Sprintf("label %s is disabled (min-ready: %d)", label, mr)
		}
		all = all.Add(t.sizes[label])
	}
	if why, over := exceeds(all, poolLimits(t.pool)); over {
		return "needs more than the pool's whole quota (" + why + ")"
	}
	if t.registered {
		if why := t.registeredShort(r.Labels); why != "" {
			return why
		}
	}
	if why, over := exceeds(all, t.cloud.limits); over {
		return "needs more than the provider's whole quota (" + why + ")"
	}
	if tl, ok := t.snap.cfg.TenantLimit(r.Tenant); ok {
		if why, over := exceeds(all, tenantLimits(tl)); over {
			return "needs more than tenant " + r.Tenant + " may ever hold (" + why + ")"
		}
	}
	return ""
}

// registeredShort says why a pool of registered hosts (static) could never
// serve these labels at once: more nodes of a label, or more nodes in all,
// than its hosts' max-parallel-jobs add up to. "" if it could.
func (s *scheduler) registeredShort(labels []string) string {
	if len(s.pool.Nodes) == 0 {
		return ""
	}
	slots, total := map[string]int{}, 0
	for _, h := range s.pool.Nodes {
		total += h.MaxParallelJobs
		for _, l := range h.Labels {
			slots[l] += h.MaxParallelJobs
		}
	}
	want := map[string]int{}
	for _, l := range labels {
		want[l]++
	}
	for l, n := range want {
		if n > slots[l] {
			return fmt.Sprintf("needs %d nodes of %s; the pool's hosts give %d", n, l, slots[l])
		}
	}
	if len(labels) > total {
		return fmt.Sprintf("needs %d nodes; the pool's hosts give %d in all", len(labels), total)
	}
	return ""
}

// deferred reports whether r should be left to another live pool: the
// provider it names, or a pool of better (lower) priority that provides all
// its labels and has not declined it.
func (s *scheduler) deferred(r *kv.Request, live map[string]kv.ComponentPool) bool {
	if r.Provider != "" && r.Provider != s.prov.Name {
		for _, p := range live {
			if p.Provider == r.Provider {
				return true
			}
		}
	}
	for ref, p := range live {
		// A better pool that is paused (at quota) does not hold a request
		// up: it goes to the next pool that has room.
		if ref == s.ref || p.Priority >= s.pool.Priority || p.Paused || slices.Contains(r.DeclinedBy, ref) {
			continue
		}
		if r.Provider != "" && p.Provider != r.Provider {
			continue
		}
		if providesAll(p.Labels, r.Labels) {
			return true
		}
	}
	return false
}

func providesAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// checkPending moves a request this pool claimed along: fulfil it when all
// its nodes are ready, fail it when one failed, replace nodes that vanished.
// It reports false when the request must be looked at again even if
// nothing about it changes (a node to replace waits for quota).
func (t *term) checkPending(ctx context.Context, r *kv.Request, free map[string][]string, room *headroom) bool {
	s := t.scheduler // jobs run beside the loop: they touch no term state
	if why := t.unserved(r); why != "" {
		// A reload took one of its labels out of the pool: another pool
		// serves it (drain.go).
		t.jobs.spawn(ctx, jobDone{keys: []string{r.ID}, subject: r.ID}, func(ctx context.Context) { s.putBack(ctx, r.ID, why) })
		return true
	}
	if len(r.Nodes) != len(r.Labels) {
		// A plan that does not match the labels: plan every slot again.
		r.Nodes = make([]string, len(r.Labels))
	}
	missing, ready, failed := t.pendingNodes(r)
	if failed != "" {
		t.jobs.spawn(ctx, jobDone{keys: []string{r.ID}, subject: r.ID}, func(ctx context.Context) { s.fail(ctx, r.ID, failed) })
		return true
	}
	if len(missing) > 0 {
		plan, need := t.plan(r, free, missing)
		if ok, _ := room.fits(r.Tenant, need); !ok {
			return false
		}
		room.take(r.Tenant, need)
		t.jobs.newNodes[r.ID] = inflight{tenant: r.Tenant, size: need}
		d := jobDone{keys: []string{r.ID}, request: r.ID, subject: r.ID}
		for _, sl := range plan {
			if sl.reuse {
				d.reserved = append(d.reserved, sl.node)
			}
		}
		old := slices.Clone(r.Nodes)
		t.jobs.spawn(ctx, d, func(ctx context.Context) { s.replan(ctx, r.ID, old, plan) })
		return true
	}
	if ready {
		nodes := slices.Clone(r.Nodes)
		t.jobs.spawn(ctx, jobDone{keys: []string{r.ID}, subject: r.ID}, func(ctx context.Context) { s.fulfil(ctx, r.ID, nodes) })
	}
	return true
}

// pendingNodes looks at the nodes of a pending request's plan: the slots
// whose node is missing (gone, or no longer allocated to it), whether
// every node is ready, and why the request fails when one of its nodes
// failed.
func (t *term) pendingNodes(r *kv.Request) (missing []int, ready bool, failed string) {
	ready = true
	for i, id := range r.Nodes {
		e, ok := t.idx.poolNodes[id]
		if !ok || e.Value.AllocatedTo != r.ID {
			missing = append(missing, i)
			continue
		}
		n := &e.Value
		switch {
		case n.State == kv.NodeReady || n.State == kv.NodeInUse:
		case n.State == kv.NodeFailed || (n.Reason != "" && (n.State == kv.NodeDeleting || n.State == kv.NodeUsed)):
			return nil, false, cmp.Or(n.Reason, fmt.Sprintf("node %s failed", id))
		case n.State == kv.NodeBuilding || n.State == kv.NodeInit:
			ready = false
		default:
			missing = append(missing, i)
		}
	}
	return missing, ready, ""
}

// quotaWait says what a request that does not fit waits for: the limit
// that stops it, in this pool, with what is in use (nodes and launches
// in flight) and the limit.
func (t *term) quotaWait(r *kv.Request, need kv.Resources, blockedBy string) string {
	used := t.idx.used
	var inflight kv.Resources
	for _, in := range t.jobs.newNodes {
		inflight = inflight.Add(in.size)
	}
	if t.registered {
		return fmt.Sprintf("for a free node of %s", strings.Join(r.Labels, ", "))
	}
	switch {
	case strings.HasPrefix(blockedBy, "provider quota"):
		limits := t.cloud.limits.Sub(t.cloud.others)
		return fmt.Sprintf("for provider %s's quota: %s", t.prov.Name, inUse(used.provUsed.Add(inflight), limits, need, "the cloud's quota"))
	case strings.HasPrefix(blockedBy, "tenant "):
		tl, _ := t.snap.cfg.TenantLimit(r.Tenant)
		return fmt.Sprintf("for tenant %s's limits: %s", r.Tenant, inUse(used.tenants[r.Tenant], tenantLimits(tl), need, "tenant-resource-limits"))
	}
	return fmt.Sprintf("for its quota: %s", inUse(used.poolUsed.Add(inflight), poolLimits(t.pool), need, "max-servers, max-cores, max-ram"))
}

// inUse describes, for each dimension in which need does not fit, what is
// in use and the limit.
func inUse(used, limit, need kv.Resources, what string) string {
	var parts []string
	add := func(name string, u, l, n int) {
		if l != drivers.Unlimited && u+n > l {
			parts = append(parts, fmt.Sprintf("%d of %d %s in use, needs %d more", u, max(l, 0), name, n))
		}
	}
	add("servers", used.Instances, limit.Instances, need.Instances)
	add("cores", used.Cores, limit.Cores, need.Cores)
	add("MB of RAM", used.RAM, limit.RAM, need.RAM)
	if len(parts) == 0 {
		return "at " + what
	}
	return strings.Join(parts, "; ") + " (" + what + ")"
}

// waiting records on a request why it waits in this pool (its reason),
// unless it says so already: the notes of pools that declined it give way
// to it. behind: it waits behind an earlier request that does not fit.
func (t *term) waiting(ctx context.Context, r *kv.Request, why string, behind bool) {
	if behind {
		why = "behind earlier requests, " + why
	}
	why = waitNote(t.ref) + why
	if r.Reason == why || !mayNoteWait(r.Reason, t.ref) {
		return
	}
	// The note's job has a key of its own: the request stays in the
	// passes while it is written, so that it keeps its place (requests
	// behind it for its labels go on waiting behind it).
	id, key := r.ID, "note:"+r.ID
	if t.jobs.busy[key] {
		return // the note is being written; the next pass looks again
	}
	t.log.Debug("request waits", "request", id, "why", why)
	s := t.scheduler // jobs run beside the loop: they touch no term state
	t.jobs.spawn(ctx, jobDone{keys: []string{key}}, func(ctx context.Context) { s.noteWait(ctx, id, why) })
}

// waitNote begins the reason of a request that waits in a pool.
func waitNote(ref string) string { return "waiting in pool " + ref + ": " }

// mayNoteWait reports whether a pool may write why a request waits in it
// over the request's reason: not over another pool's note that it waits
// there (two pools that both wait would write in turns for ever).
func mayNoteWait(reason, ref string) bool {
	return !strings.HasPrefix(reason, "waiting in pool ") || strings.HasPrefix(reason, waitNote(ref))
}
