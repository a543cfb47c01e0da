package consumers

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// scheduler serves the requests of one provider pool. It runs in the one
// process that holds the pool's lease, so decisions (order, quota, which
// ready node goes to which request) are made in one place; every decision
// is then committed with revision-checked updates, so even two schedulers
// that both believe they lead can never give one node to two requests.
// The scheduler is level-triggered: each pass looks at the records as they
// are, so a new leader simply carries on from them.
type scheduler struct {
	l      *Launcher
	prov   *config.Provider
	pool   *config.Pool
	ref    string
	labels map[string]bool
	log    *slog.Logger
	// registered: the pool's nodes are registered by its driver (static),
	// never created here; every request is served from them.
	registered bool

	// sizes is what one node of each label costs against quota; unsized
	// are the labels whose size the driver could not tell yet.
	sizes   map[string]kv.Resources
	unsized map[string]bool

	// State of one term as leader.
	// The records as this scheduler has seen them, kept from the change
	// queues of the caches (entries are immutable snapshots, so the
	// pointers are safe to hold and need no locking in the loop).
	requests  map[string]*kv.Entry[kv.Request] // every request
	waiting   map[string]*kv.Entry[kv.Request] // requests in requested state
	pending   map[string]*kv.Entry[kv.Request] // requests pending in this pool
	poolNodes map[string]*kv.Entry[kv.Node]    // nodes of this pool

	// Indexes over the pool's nodes, kept as they change, so that a pass
	// looks only at what may need work, not at every node.
	free      map[string]map[string]bool // label -> ready, unallocated nodes
	byRequest map[string]map[string]bool // request -> nodes allocated to it
	suspects  map[string]bool            // allocated nodes whose request may be gone
	dirty     map[string]bool            // pending requests to look at again
	used      *usage                     // what nodes hold, kept up to date
	busy      map[string]bool            // requests and nodes with a job in flight
	reserved  map[string]bool            // ready nodes promised to a request by a job in flight
	newNodes  map[string]inflight
	cloud     cloudQuota
	paused    bool
	jobs      sync.WaitGroup
	jobSem    chan struct{}
	doneMu    sync.Mutex
	done      []jobDone
	doneC     chan struct{}
}

// inflight is what a job in flight is creating for a request.
type inflight struct {
	tenant string
	size   kv.Resources
}

// cloudQuota is the provider's quota as the cloud last reported it, and
// what instances that are not this provider's hold.
type cloudQuota struct {
	limits kv.Resources
	others kv.Resources
}

// jobDone is what a finished job hands back to the loop.
type jobDone struct {
	keys     []string // busy keys to clear
	reserved []string
	request  string // newNodes entry to clear
}

func newScheduler(l *Launcher, prov *config.Provider, pool *config.Pool) *scheduler {
	s := &scheduler{l: l, prov: prov, pool: pool, ref: kv.PoolRef(prov.Name, pool.Name), labels: map[string]bool{}, sizes: map[string]kv.Resources{}}
	for _, pl := range pool.Labels {
		s.labels[pl.Name] = true
	}
	s.readSizes()
	_, s.registered = drivers.As[drivers.Registrar](l.opts.Providers[prov.Name])
	s.log = l.log.With("pool", s.ref)
	return s
}

// run serves the pool until ctx ends (the lease was lost or the process
// stops).
func (s *scheduler) run(ctx context.Context) {
	s.log.Info("leading pool")
	defer s.log.Info("no longer leading pool")
	s.requests, s.waiting, s.pending = map[string]*kv.Entry[kv.Request]{}, map[string]*kv.Entry[kv.Request]{}, map[string]*kv.Entry[kv.Request]{}
	s.poolNodes = map[string]*kv.Entry[kv.Node]{}
	s.free, s.byRequest = map[string]map[string]bool{}, map[string]map[string]bool{}
	s.suspects, s.dirty = map[string]bool{}, map[string]bool{}
	s.used = newUsage(s.prov.Name, s.pool.Name)
	s.busy, s.reserved, s.newNodes = map[string]bool{}, map[string]bool{}, map[string]inflight{}
	s.jobSem = make(chan struct{}, 256)
	s.done, s.doneC = nil, make(chan struct{}, 1)
	s.paused = false
	defer s.l.setPaused(s.ref, false)

	// The cloud's view of quota is read before the first decision, then
	// now and then, not on every pass.
	s.cloud = cloudQuota{limits: unlimited}
	if q, err := s.readCloudQuota(ctx); err == nil {
		s.cloud = q
	} else if ctx.Err() == nil {
		s.log.Warn("could not read the cloud's quota; going on without it", "err", err)
	}
	quotaC := make(chan cloudQuota, 1)
	go s.watchCloudQuota(ctx, quotaC)

	reqSub := s.l.requests.Subscribe()
	defer s.l.requests.Unsubscribe(reqSub)
	nodeSub := s.l.nodes.Subscribe()
	defer s.l.nodes.Unsubscribe(nodeSub)
	compSub := s.l.components.Subscribe()
	defer s.l.components.Unsubscribe(compSub)
	imgWatch := s.l.images.watch()
	defer imgWatch.stop()
	defer s.jobs.Wait()

	tick := time.NewTicker(s.l.opts.SyncInterval)
	defer tick.Stop()
	for {
		// Jobs apply their writes to the caches before they report done:
		// collecting them first, then draining the change queues, means
		// the pass sees every write of every job it no longer counts as in
		// flight.
		s.collectDone()
		for _, ch := range reqSub.Drain() {
			s.indexRequest(ch)
		}
		for _, ch := range nodeSub.Drain() {
			s.indexNode(ch)
		}
		compSub.Drain()
		imgWatch.drain()
		start := time.Now()
		s.pass(ctx)
		s.l.metrics.SchedulerPasses.Add(1)
		s.l.metrics.SchedulerPassNanos.Add(int64(time.Since(start)))
		select {
		case <-ctx.Done():
			return
		case <-reqSub.C():
		case <-nodeSub.C():
		case <-compSub.C():
		case <-imgWatch.C():
		case <-s.doneC:
		case <-tick.C:
			s.sweep()
		case q := <-quotaC:
			s.cloud = q
		}
	}
}

func (s *scheduler) indexRequest(ch kv.Change[kv.Request]) {
	// Nodes allocated to a request that changed or went may need freeing.
	for id := range s.byRequest[ch.Key] {
		s.suspects[id] = true
	}
	delete(s.waiting, ch.Key)
	delete(s.pending, ch.Key)
	if ch.New == nil {
		delete(s.requests, ch.Key)
		return
	}
	s.requests[ch.Key] = ch.New
	r := &ch.New.Value
	switch {
	case r.State == kv.RequestRequested:
		s.waiting[ch.Key] = ch.New
	case r.State == kv.RequestPending && r.Provider == s.prov.Name && r.Pool == s.pool.Name:
		s.pending[ch.Key] = ch.New
		s.dirty[ch.Key] = true
	}
}

// readCloudQuota reads the provider's quota and what instances that are
// not this provider's hold.
func (s *scheduler) readCloudQuota(ctx context.Context) (cloudQuota, error) {
	if s.pool.IgnoreProviderQuota {
		// Only the pool's own limits count (ignore-provider-quota).
		return cloudQuota{limits: unlimited}, nil
	}
	drv := s.l.opts.Providers[s.prov.Name]
	limits, err := drv.QuotaLimits(ctx)
	if err != nil {
		return cloudQuota{}, fmt.Errorf("reading quota: %w", err)
	}
	insts, err := drv.ListInstances(ctx)
	if err != nil {
		return cloudQuota{}, fmt.Errorf("listing instances: %w", err)
	}
	var others kv.Resources
	for _, inst := range insts {
		if inst.Tags[drivers.TagProvider] != s.prov.Name {
			r := inst.Resources
			r.Instances = max(r.Instances, 1)
			others = others.Add(r)
		}
	}
	return cloudQuota{limits: limits, others: others}, nil
}

// watchCloudQuota reads the cloud's quota every sync interval.
func (s *scheduler) watchCloudQuota(ctx context.Context, out chan<- cloudQuota) {
	for wait.Sleep(ctx, s.l.opts.SyncInterval) {
		q, err := s.readCloudQuota(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("could not read the cloud's quota", "err", err)
			}
			continue
		}
		select {
		case out <- q:
		case <-ctx.Done():
			return
		}
	}
}

func (s *scheduler) indexNode(ch kv.Change[kv.Node]) {
	s.used.apply(ch)
	inPool := func(e *kv.Entry[kv.Node]) bool {
		return e != nil && e.Value.Provider == s.prov.Name && e.Value.Pool == s.pool.Name
	}
	if inPool(ch.Old) {
		n := &ch.Old.Value
		for _, label := range n.Labels {
			delete(s.free[label], ch.Key)
		}
		if n.AllocatedTo != "" {
			delete(s.byRequest[n.AllocatedTo], ch.Key)
			if len(s.byRequest[n.AllocatedTo]) == 0 {
				delete(s.byRequest, n.AllocatedTo)
			}
			s.dirty[n.AllocatedTo] = true
		}
	}
	if !inPool(ch.New) {
		delete(s.poolNodes, ch.Key)
		return
	}
	s.poolNodes[ch.Key] = ch.New
	n := &ch.New.Value
	switch {
	case n.AllocatedTo != "":
		if s.byRequest[n.AllocatedTo] == nil {
			s.byRequest[n.AllocatedTo] = map[string]bool{}
		}
		s.byRequest[n.AllocatedTo][ch.Key] = true
		s.suspects[ch.Key] = true
		s.dirty[n.AllocatedTo] = true
	case n.State == kv.NodeReady:
		// A node with several labels (a static host) is free for each.
		for _, label := range n.Labels {
			if s.free[label] == nil {
				s.free[label] = map[string]bool{}
			}
			s.free[label][ch.Key] = true
		}
	}
}

// readSizes asks the driver what a node of each label costs, for the
// labels it could not tell yet (a cloud driver learns its flavors from the
// cloud; until then a node counts as one instance).
func (s *scheduler) readSizes() {
	if s.unsized == nil {
		s.unsized = map[string]bool{}
		for l := range s.labels {
			s.unsized[l] = true
		}
	}
	for label := range s.unsized {
		size, err := s.l.opts.Providers[s.prov.Name].QuotaForLabel(s.pool.Name, label)
		if err == nil {
			delete(s.unsized, label)
		}
		if err != nil || size.Instances == 0 {
			size.Instances = 1
		}
		s.sizes[label] = size
	}
}

// sweep marks everything for a look, as a safety net under the indexes.
func (s *scheduler) sweep() {
	if len(s.unsized) > 0 {
		s.readSizes()
	}
	for id := range s.pending {
		s.dirty[id] = true
	}
	for _, nodes := range s.byRequest {
		for id := range nodes {
			s.suspects[id] = true
		}
	}
}

// spawn runs a job; its busy keys stay set until the loop collects it.
func (s *scheduler) spawn(ctx context.Context, d jobDone, job func(ctx context.Context)) {
	for _, k := range d.keys {
		s.busy[k] = true
	}
	for _, k := range d.reserved {
		s.reserved[k] = true
	}
	s.jobs.Go(func() {
		defer func() {
			s.doneMu.Lock()
			s.done = append(s.done, d)
			s.doneMu.Unlock()
			select {
			case s.doneC <- struct{}{}:
			default:
			}
		}()
		select {
		case s.jobSem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-s.jobSem }()
		job(ctx)
	})
}

func (s *scheduler) collectDone() {
	s.doneMu.Lock()
	done := s.done
	s.done = nil
	s.doneMu.Unlock()
	for _, d := range done {
		for _, k := range d.keys {
			delete(s.busy, k)
			// Look at what the job left (a key is a request or a node).
			s.dirty[k] = true
			s.suspects[k] = true
		}
		for _, k := range d.reserved {
			delete(s.reserved, k)
		}
		if d.request != "" {
			delete(s.newNodes, d.request)
		}
	}
}

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
}

// headroom is what may be launched now, given the records and the jobs in
// flight.
func (s *scheduler) headroom() *headroom {
	h := &headroom{
		pool:     poolLimits(s.pool).Sub(s.used.poolUsed),
		provider: s.cloud.limits.Sub(s.cloud.others).Sub(s.used.provUsed),
		tenants:  map[string]kv.Resources{},
	}
	for _, tl := range s.l.opts.Config.TenantResourceLimits {
		h.tenants[tl.TenantName] = tenantLimits(tl).Sub(s.used.tenants[tl.TenantName])
	}
	for _, in := range s.newNodes {
		h.take(in.tenant, in.size)
	}
	return h
}

// pass looks at the pool's requests and nodes and starts the jobs they need.
func (s *scheduler) pass(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	l := s.l
	// Nodes allocated to requests that are gone, failed, or no longer
	// list them go back to the pool.
	for id := range s.suspects {
		delete(s.suspects, id)
		e, ok := s.poolNodes[id]
		if !ok || s.busy[id] || s.reserved[id] {
			continue // a job in flight marks it again when done
		}
		n := &e.Value
		if n.AllocatedTo == "" || (n.State != kv.NodeReady && n.State != kv.NodeBuilding) {
			continue
		}
		if r, ok := s.requests[n.AllocatedTo]; !ok || r.Value.State == kv.RequestFailed || !slices.Contains(r.Value.Nodes, id) {
			s.spawn(ctx, jobDone{keys: []string{id}}, func(ctx context.Context) { s.freeNode(ctx, id, n.AllocatedTo) })
		}
	}
	free := map[string][]string{} // label -> ready unallocated nodes, oldest first
	for label, ids := range s.free {
		for id := range ids {
			if !s.reserved[id] {
				free[label] = append(free[label], id)
			}
		}
		slices.SortFunc(free[label], func(a, b string) int {
			return s.poolNodes[a].Value.StateTime.Compare(s.poolNodes[b].Value.StateTime)
		})
	}
	room := s.headroom()
	if s.registered {
		room.pool = kv.Resources{} // a registered pool never launches
	}

	// Pending requests that something happened to.
	for id := range s.dirty {
		e, ok := s.pending[id]
		if !ok {
			delete(s.dirty, id)
			continue
		}
		if s.busy[id] {
			continue // looked at again when its job is done
		}
		r := e.Value
		if s.checkPending(ctx, &r, free, room) {
			delete(s.dirty, id)
		}
	}

	var waiting []*kv.Request
	for id, e := range s.waiting {
		if s.busy[id] || slices.Contains(e.Value.DeclinedBy, s.ref) {
			continue
		}
		r := e.Value
		waiting = append(waiting, &r)
	}
	slices.SortFunc(waiting, requestLess)

	live := l.livePools()
	// A request that does not fit waits in its place: it keeps the ready
	// nodes it would take, and requests behind it for one of its labels (or,
	// when a tenant limit stops it, of its tenant) wait behind it. Requests
	// for other labels pass it when they fit.
	blockedLabels := map[string]bool{}
	blockedTenants := map[string]bool{}
	paused := false
	for _, r := range waiting {
		if why := s.cannotServe(r); why != "" {
			s.spawn(ctx, jobDone{keys: []string{r.ID}}, func(ctx context.Context) { s.decline(ctx, r.ID, why) })
			continue
		}
		if !s.imagesReady(r) {
			continue // waits for an upload of its diskimage; not a decline
		}
		if s.deferred(r, live) {
			continue
		}
		plan, need := s.plan(r, free, nil)
		if need.Instances > 0 && (blockedTenants[r.Tenant] || slices.ContainsFunc(r.Labels, func(lb string) bool { return blockedLabels[lb] })) {
			continue
		}
		if ok, by := room.fits(r.Tenant, need); !ok {
			if strings.HasPrefix(by, "tenant ") {
				// Only this tenant's requests wait behind it.
				blockedTenants[r.Tenant] = true
				continue
			}
			for _, lb := range r.Labels {
				blockedLabels[lb] = true
			}
			paused = true
			continue
		}
		room.take(r.Tenant, need)
		s.newNodes[r.ID] = inflight{tenant: r.Tenant, size: need}
		d := jobDone{keys: []string{r.ID}, request: r.ID}
		for _, sl := range plan {
			if sl.reuse {
				d.reserved = append(d.reserved, sl.node)
			}
		}
		s.spawn(ctx, d, func(ctx context.Context) { s.claim(ctx, r.ID, plan) })
	}
	if paused != s.paused {
		s.paused = paused
		l.setPaused(s.ref, paused)
	}
}

// plan picks, for each label of r (or the given slots only), a ready node
// of this pool or a new one; free loses the nodes picked. need is what the
// new nodes cost.
func (s *scheduler) plan(r *kv.Request, free map[string][]string, only []int) ([]slot, kv.Resources) {
	var plan []slot
	var need kv.Resources
	for i, label := range r.Labels {
		if only != nil && !slices.Contains(only, i) {
			continue
		}
		if (r.Reuse || s.registered) && len(free[label]) > 0 {
			id := free[label][0]
			plan = append(plan, slot{index: i, label: label, node: id, reuse: true})
			s.takeFree(free, label, id)
			continue
		}
		plan = append(plan, slot{index: i, label: label, node: newNodeID()})
		need = need.Add(s.sizes[label])
	}
	return plan, need
}

// takeFree removes a node picked for a label from the free lists of every
// label it has.
func (s *scheduler) takeFree(free map[string][]string, label, id string) {
	labels := []string{label}
	if e, ok := s.poolNodes[id]; ok {
		labels = append(labels, e.Value.Labels...)
	}
	for _, l := range labels {
		free[l] = slices.DeleteFunc(free[l], func(x string) bool { return x == id })
	}
}

// newNodeID returns a fresh random node id (13 characters of [0-9a-z]).
func newNodeID() string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b [13]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// cannotServe says why this pool could never serve r ("" if it could):
// a label it does not provide, or more than its whole quota, its
// provider's whole quota or the tenant's limits.
func (s *scheduler) cannotServe(r *kv.Request) string {
	var all kv.Resources
	for _, label := range r.Labels {
		if !s.labels[label] {
			return fmt.Sprintf("label %s is not in this pool", label)
		}
		all = all.Add(s.sizes[label])
	}
	if why, over := exceeds(all, poolLimits(s.pool)); over {
		return "needs more than the pool's whole quota (" + why + ")"
	}
	if s.registered {
		if why := s.registeredShort(r.Labels); why != "" {
			return why
		}
	}
	if why, over := exceeds(all, s.cloud.limits); over {
		return "needs more than the provider's whole quota (" + why + ")"
	}
	if tl, ok := s.l.opts.Config.TenantLimit(r.Tenant); ok {
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
func (s *scheduler) checkPending(ctx context.Context, r *kv.Request, free map[string][]string, room *headroom) bool {
	if len(r.Nodes) != len(r.Labels) {
		// A plan that does not match the labels: plan every slot again.
		r.Nodes = make([]string, len(r.Labels))
	}
	ready := true
	var missing []int
	for i, id := range r.Nodes {
		e, ok := s.poolNodes[id]
		if !ok || e.Value.AllocatedTo != r.ID {
			missing = append(missing, i)
			continue
		}
		n := &e.Value
		switch {
		case n.State == kv.NodeReady || n.State == kv.NodeInUse:
		case n.State == kv.NodeFailed || (n.Reason != "" && (n.State == kv.NodeDeleting || n.State == kv.NodeUsed)):
			reason := n.Reason
			if reason == "" {
				reason = fmt.Sprintf("node %s failed", id)
			}
			s.spawn(ctx, jobDone{keys: []string{r.ID}}, func(ctx context.Context) { s.fail(ctx, r.ID, reason) })
			return true
		case n.State == kv.NodeBuilding || n.State == kv.NodeInit:
			ready = false
		default:
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		plan, need := s.plan(r, free, missing)
		if ok, _ := room.fits(r.Tenant, need); !ok {
			return false
		}
		room.take(r.Tenant, need)
		s.newNodes[r.ID] = inflight{tenant: r.Tenant, size: need}
		d := jobDone{keys: []string{r.ID}, request: r.ID}
		for _, sl := range plan {
			if sl.reuse {
				d.reserved = append(d.reserved, sl.node)
			}
		}
		old := slices.Clone(r.Nodes)
		s.spawn(ctx, d, func(ctx context.Context) { s.replan(ctx, r.ID, old, plan) })
		return true
	}
	if ready {
		nodes := slices.Clone(r.Nodes)
		s.spawn(ctx, jobDone{keys: []string{r.ID}}, func(ctx context.Context) { s.fulfil(ctx, r.ID, nodes) })
	}
	return true
}

// claim takes a waiting request for this pool (requested -> pending, with
// its plan) and then allocates or creates its nodes.
func (s *scheduler) claim(ctx context.Context, id string, plan []slot) {
	if !slices.ContainsFunc(plan, func(sl slot) bool { return !sl.reuse }) {
		s.serveFromReady(ctx, id, plan)
		return
	}
	now := time.Now().UTC()
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
	now := time.Now().UTC()
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestRequested || slices.Contains(r.DeclinedBy, s.ref) {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFulfilled, now)
		r.Provider, r.Pool = s.prov.Name, s.pool.Name
		r.Reason = ""
		r.Nodes = make([]string, len(r.Labels))
		for _, sl := range plan {
			r.Nodes[sl.index] = sl.node
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			s.log.Warn("could not fulfil request", "request", id, "err", err)
		}
		undo()
		return
	}
	s.l.metrics.RequestsFulfilled.Add(1)
}

// replan replaces the nodes of some slots of a pending request.
func (s *scheduler) replan(ctx context.Context, id string, old []string, plan []slot) {
	e, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name || !slices.Equal(r.Nodes, old) {
			return kv.ErrSkip
		}
		if len(r.Nodes) != len(r.Labels) {
			r.Nodes = make([]string, len(r.Labels))
		}
		for _, sl := range plan {
			r.Nodes[sl.index] = sl.node
		}
		return nil
	})
	if err != nil {
		return
	}
	s.assign(ctx, &e.Value, plan)
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
	s.l.metrics.NodesReused.Add(1)
	return true
}

// create writes the record of a new node for a request; the node lifecycle
// group launches it.
func (s *scheduler) create(ctx context.Context, sl slot, r *kv.Request) bool {
	now := time.Now().UTC()
	size, err := s.l.opts.Providers[s.prov.Name].QuotaForLabel(s.pool.Name, sl.label)
	if err != nil {
		size = kv.Resources{Instances: 1}
	}
	n := &kv.Node{
		ID: sl.node, State: kv.NodeBuilding, Labels: []string{sl.label},
		Provider: s.prov.Name, Pool: s.pool.Name, Cloud: s.prov.Cloud,
		AllocatedTo: r.ID, Requestor: r.Requestor, Tenant: r.Tenant,
		HostKeys: []string{}, Attributes: map[string]string{}, Resources: size,
		Created: now, StateTime: now, Attempt: 1,
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
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name || !slices.Equal(r.Nodes, nodes) {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFulfilled, time.Now().UTC())
		r.Reason = ""
		return nil
	})
	if err == nil {
		s.l.metrics.RequestsFulfilled.Add(1)
	}
}

// fail marks a pending request of this pool failed.
func (s *scheduler) fail(ctx context.Context, id, reason string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name {
			return kv.ErrSkip
		}
		r.SetState(kv.RequestFailed, time.Now().UTC())
		r.Reason = reason
		return nil
	})
	if err == nil {
		s.l.metrics.RequestsFailed.Add(1)
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
		if r.Reason == "" {
			r.Reason = note
		} else {
			r.Reason += "; " + note
		}
		failIfAllDeclined(r, s.l.livePools(), time.Now().UTC())
		return nil
	})
	if err == nil {
		s.l.metrics.RequestsDeclined.Add(1)
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
