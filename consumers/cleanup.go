package consumers

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// cleanup reconciles what crashes and vanished owners leave behind. It runs
// periodically in the one process holding the cleanup lease:
//
//   - nodes being launched or deleted by a launcher whose heartbeat expired
//     are handed back (launcher cleared), so that their work is asked for
//     again and another launcher resumes them (work.go);
//   - nodes that need a launcher's work that nobody took up for two sweeps
//     in a row, and whose work message does not wait in the work stream,
//     are written again, unchanged, which asks for the work again
//     (revisit);
//   - instances tagged as ours without a node record (or not the instance
//     their node records) are deleted on their second sighting;
//   - requests pending in a pool that no live launcher serves go back to
//     requested; waiting requests that every live pool declined fail;
//     requests whose lease ran out, and failed requests older than
//     FailedRequestAge, are deleted.
type cleanup struct {
	l *Launcher
	// clouds runs each provider's cloud sweep on its own (see
	// cloudSweeps).
	clouds    *cloudSweeps
	deleting  sync.Map
	lastPurge time.Time
	// orphanPools counts sweeps that found pending requests of a pool that
	// no live launcher serves.
	orphanPools map[string]int
	// unowned counts the sweeps in a row that saw a node at one revision
	// needing work that nobody does.
	unowned map[string]sighting
	// leftBehind holds the nodes whose work message takeBack saw waiting
	// while a pull waited on its consumer, at the last sweep.
	leftBehind map[string]bool
}

// sighting is a record seen at a revision in n sweeps in a row, the first
// time at first.
type sighting struct {
	rev   uint64
	n     int
	first time.Time
}

func newCleanup(l *Launcher) *cleanup { return &cleanup{l: l} }

func (c *cleanup) run(ctx context.Context) {
	if !c.l.syncCaches(ctx) {
		return
	}
	c.orphanPools = map[string]int{}
	c.unowned = map[string]sighting{}
	c.lastPurge = c.l.clock.Now()
	compSub := c.l.components.Subscribe()
	defer c.l.components.Unsubscribe(compSub)
	tick := c.l.clock.NewTicker(c.l.opts.SyncInterval)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	c.clouds = newCloudSweeps(c, &wg)
	defer c.clouds.wait()
	drain := c.l.drain.term(c, &wg)
	defer drain.end()
	for {
		gone := false
		for _, ch := range compSub.Drain() {
			if ch.New == nil {
				gone = true
			}
		}
		if gone {
			c.handBack(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-compSub.C():
			continue
		case <-tick.C():
		}
		// The records' sweeps make no cloud call: a cloud that hangs holds
		// up none of them.
		c.handBack(ctx)
		c.revisit(ctx)
		c.unaccountable(ctx)
		c.expire(ctx)
		c.expireRequests(ctx)
		c.requests(ctx)
		c.clouds.start(ctx)
		drain.pass(ctx)
		if c.l.clock.Since(c.lastPurge) > 10*time.Minute {
			c.purge(ctx)
		}
	}
}

// cloudSweeps runs each provider's cloud sweep (leaked instances, spot
// interruptions, the driver's own leftovers) in a goroutine of its own,
// with a timeout, every sync interval: a cloud whose calls hang or take
// minutes holds up its own sweep only, never another provider's, nor the
// records' sweeps (hand-back, revisit, expiry), which run on the cleanup's
// own ticker. A provider whose last pass still runs skips a pass.
type cloudSweeps struct {
	c  *cleanup
	wg *sync.WaitGroup // the deletions the passes start

	mu       sync.Mutex
	running  map[string]time.Time      // provider -> when its pass started
	suspects map[string]map[string]int // provider -> sightings of possible leaks
	warned   map[string]bool           // providers said to be slow, this pass
	passes   sync.WaitGroup
}

func newCloudSweeps(c *cleanup, wg *sync.WaitGroup) *cloudSweeps {
	return &cloudSweeps{c: c, wg: wg, running: map[string]time.Time{}, suspects: map[string]map[string]int{}, warned: map[string]bool{}}
}

// cloudSweepTimeout bounds one provider's pass.
func (c *cleanup) cloudSweepTimeout() time.Duration { return c.l.cloudCallTimeout() }

// start starts a pass of each provider whose last pass ended.
func (s *cloudSweeps) start(ctx context.Context) {
	c := s.c
	for name := range c.l.current().providers {
		s.mu.Lock()
		if started, busy := s.running[name]; busy {
			if !s.warned[name] && c.l.clock.Since(started) > 3*c.l.opts.SyncInterval {
				s.warned[name] = true
				c.l.log.Warn("a provider's cloud sweep is still running; its next passes wait for it (other providers' go on)", "provider", name, "running_for", c.l.clock.Since(started).Round(time.Second))
			}
			s.mu.Unlock()
			continue
		}
		s.running[name] = c.l.clock.Now()
		s.warned[name] = false
		suspects := s.suspects[name]
		if suspects == nil {
			suspects = map[string]int{}
			s.suspects[name] = suspects
		}
		s.mu.Unlock()
		s.passes.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.running, name)
				s.mu.Unlock()
			}()
			pctx, cancel := context.WithTimeout(ctx, c.cloudSweepTimeout())
			defer cancel()
			c.sweepCloud(pctx, ctx, s.wg, name, suspects)
		})
	}
}

// wait waits for the passes in flight.
func (s *cloudSweeps) wait() { s.passes.Wait() }

// sweepCloud is one provider's pass; the instances it finds leaked are
// deleted under the cleanup's context (the pass's may time out first).
func (c *cleanup) sweepCloud(ctx, deleteCtx context.Context, wg *sync.WaitGroup, name string, suspects map[string]int) {
	u, ok := c.l.use(name)
	if !ok {
		return
	}
	defer u.done()
	c.leaks(ctx, deleteCtx, wg, name, u.drv, suspects)
	if in, ok := drivers.As[drivers.Interrupter](u.drv); ok {
		c.interruptions(ctx, name, in)
	}
	if sw, ok := drivers.As[drivers.Sweeper](u.drv); ok {
		if err := sw.Sweep(ctx, c.l.nodes.Has); err != nil && deleteCtx.Err() == nil {
			c.l.log.Warn("could not sweep the provider's leftovers", "provider", name, "err", err)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && deleteCtx.Err() == nil {
		c.l.log.Warn("a provider's cloud sweep ran out of time; the next one starts afresh", "provider", name, "timeout", c.cloudSweepTimeout())
	}
}

// handBack clears the launcher of nodes whose launcher is dead; every
// launcher's watch sees the change and asks for the node's work (work.go),
// which a live process claims.
func (c *cleanup) handBack(ctx context.Context) {
	l := c.l
	var orphans []string
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if (n.State == kv.NodeBuilding || n.State == kv.NodeDeleting) && n.Launcher != "" && !l.alive(n.Launcher) {
			orphans = append(orphans, e.Key)
		}
		return true
	})
	for _, id := range orphans {
		if e, ok := l.nodes.Get(id); !ok || !l.gone(ctx, e.Value.Launcher) {
			continue
		}
		_, err := l.nodes.Modify(ctx, id, func(n *kv.Node) error {
			if (n.State != kv.NodeBuilding && n.State != kv.NodeDeleting) || n.Launcher == "" || l.alive(n.Launcher) {
				return kv.ErrSkip
			}
			l.log.Info("handing back a node whose launcher is gone", "node", id, "launcher", n.Launcher, "state", n.State)
			n.Launcher = ""
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			l.log.Warn("could not hand back node", "node", id, "err", err)
		}
	}
}

// unowned reports whether a node needs a launcher's work and has
// no launcher on it: used, failed or aborted (to be deleted), or being
// launched or deleted with no launcher named.
func unowned(n *kv.Node) bool {
	switch n.State {
	case kv.NodeUsed, kv.NodeFailed, kv.NodeAborted:
		return true
	case kv.NodeBuilding, kv.NodeDeleting:
		return n.Launcher == ""
	}
	return false
}

// revisit writes again, unchanged, the nodes that needed the lifecycle
// group's work at the same revision in two sweeps in a row and for at
// least a lease TTL (the time a dead owner takes to be noticed): their change
// was acknowledged without the work being taken up (a process killed in
// between), or dropped past the consumer's delivery bound. The write is a
// new change, which the group takes up like any other.
func (c *cleanup) revisit(ctx context.Context) {
	l := c.l
	var due []*kv.Entry[kv.Node]
	seen := map[string]bool{}
	named := l.namedProviders()
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		// A node of a provider no live process has is nobody's to take
		// up: the drain deletes it, or says why it cannot (drain.go).
		if !unowned(&e.Value) || !named[e.Value.Provider] {
			return true
		}
		seen[e.Key] = true
		s := c.unowned[e.Key]
		if s.rev != e.Revision {
			s = sighting{rev: e.Revision, first: l.clock.Now()}
		}
		s.n++
		c.unowned[e.Key] = s
		if s.n >= 2 && l.clock.Since(s.first) >= l.opts.LeaseTTL {
			due = append(due, e)
		}
		return true
	})
	for id := range c.unowned {
		if !seen[id] {
			delete(c.unowned, id)
		}
	}
	due = c.notQueued(ctx, due)
	for _, e := range due {
		// Said once written: a node whose work was taken up since the
		// sweep looked (a launch that was waiting for a slot claimed
		// meanwhile) has moved on, and the revision-checked write is
		// refused.
		n := e.Value
		_, err := l.nodes.Update(ctx, e.Key, &n, e.Revision)
		switch {
		case err == nil:
			l.log.Info("node needs work nobody took up; wrote it again", "node", e.Key, "state", e.Value.State, "launcher", e.Value.Launcher)
		case errors.Is(err, kv.ErrConflict):
			l.log.Debug("node due a revisit changed meanwhile; left alone", "node", e.Key)
		case ctx.Err() == nil:
			l.log.Warn("could not write node again", "node", e.Key, "err", err)
		}
	}
}

// notQueued leaves out of nodes due a revisit those whose work message
// waits in the work stream: a launch waits for a free slot there, not for
// a message (with no stream to ask, they wait for a later sweep). A
// message that waits for nothing is stuck, and taken back (takeBack): the
// node is asked for again.
func (c *cleanup) notQueued(ctx context.Context, due []*kv.Entry[kv.Node]) []*kv.Entry[kv.Node] {
	if len(due) == 0 {
		return due
	}
	queued, err := events.QueuedWork(ctx, c.l.js)
	if err != nil {
		if ctx.Err() == nil {
			c.l.log.Warn("could not list the queued work; nodes waiting for work are looked at again next sweep", "err", err)
		}
		return nil
	}
	var waiting []*kv.Entry[kv.Node]
	due = slices.DeleteFunc(due, func(e *kv.Entry[kv.Node]) bool {
		if queued[events.Work{Kind: workKind(&e.Value), Node: e.Key}] {
			waiting = append(waiting, e)
			return true
		}
		return false
	})
	return append(due, c.takeBack(ctx, waiting)...)
}

// workKind is the kind of work a node that needs some waits for.
func workKind(n *kv.Node) string {
	if n.State == kv.NodeBuilding {
		return events.KindLaunch
	}
	return events.KindDelete
}

// maxTakeBack bounds the messages takeBack removes in one sweep. A
// launch that only some launchers of its provider can take (their
// configurations differ), waiting for a slot of those while the others
// wait for work, is taken back too, every few sweeps, and asked for again:
// the bound keeps a long queue of those from making a storm of writes.
const maxTakeBack = 100

// takeBack looks at the nodes due a revisit whose work message still
// waits in the work stream. A message waits for a process with room
// (a free launch slot of max-concurrency, a free delete worker); one that
// is still there while a process waits for work on its consumer (a pull
// is waiting), its node unchanged for the revisit's two sweeps and a
// lease TTL, waits for nothing: the server left it behind (delivered to
// a pull that was lost and not delivered again: under a loaded cluster
// whose members restarted, two launches waited 69 s). Such a message is
// removed from the stream (one message per node and kind: while it is
// there, no new one is taken), and its node returned for the revisit to
// write again, which asks for the work anew. A consumer an operator
// paused holds its messages on purpose: they are left alone. A message
// is taken back only when so seen at two sweeps in a row: one sweep can
// see a message queued behind a busy slot at the moment the slot frees,
// its pull on the way (loaded run 5 at ba03f5e took back two such).
// Removing a message a process handles at that moment is harmless all the
// same: its claim and the revisit's write are revision-checked, and only
// one lands.
func (c *cleanup) takeBack(ctx context.Context, waiting []*kv.Entry[kv.Node]) []*kv.Entry[kv.Node] {
	sawNow, before := map[string]bool{}, c.leftBehind
	defer func() { c.leftBehind = sawNow }()
	if len(waiting) == 0 {
		return nil
	}
	st, err := c.l.js.Stream(ctx, events.WorkStream)
	if err != nil {
		if ctx.Err() == nil {
			c.l.log.Debug("could not open the work stream to look at the work waiting there", "err", err)
		}
		return nil
	}
	idle := map[string]bool{} // consumer: a pull waits on it, and it is not paused
	var out []*kv.Entry[kv.Node]
	for _, e := range waiting {
		kind := workKind(&e.Value)
		consumer := events.DeleteConsumer
		if kind == events.KindLaunch {
			consumer = events.LaunchConsumer(e.Value.Provider)
		}
		ok, seen := idle[consumer]
		if !seen {
			cons, err := st.Consumer(ctx, consumer)
			if err == nil {
				info := cons.CachedInfo()
				ok = info.NumWaiting > 0 && !info.Paused
			}
			idle[consumer] = ok
		}
		if !ok {
			continue
		}
		if sawNow[e.Key] = true; !before[e.Key] {
			continue // taken back if so at the next sweep too
		}
		if len(out) == maxTakeBack {
			c.l.log.Warn("more work waits in the work stream while processes wait for work; the rest is taken back next sweep", "taken_back", len(out))
			break
		}
		subject := events.WorkSubjectOf(kind, e.Value.Provider, e.Key)
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			if ctx.Err() == nil {
				c.l.log.Warn("could not take back stuck work; trying again next sweep", "node", e.Key, "work", kind, "err", err)
			}
			continue
		}
		c.l.log.Warn("work waited in the work stream while processes waited for work; asking for it again", "node", e.Key, "work", kind,
			"provider", e.Value.Provider, "waited", c.l.clock.Since(c.unowned[e.Key].first).Round(time.Second))
		out = append(out, e)
	}
	return out
}

// expire deletes nodes past their time: unallocated ready nodes older than
// their label's max-ready-age, held nodes past hold_expiration or
// max-hold-age, in-use nodes whose holder let lease_until pass.
func (c *cleanup) expire(ctx context.Context) {
	l := c.l
	ex := newExpiry(l.config(), l.clock.Now().UTC())
	var due []string
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if ex.why(&e.Value) != "" {
			due = append(due, e.Key)
		}
		return true
	})
	for _, id := range due {
		_, err := l.nodes.Modify(ctx, id, func(n *kv.Node) error {
			why := ex.why(n)
			if why == "" {
				return kv.ErrSkip
			}
			l.log.Info("deleting node", "node", id, "state", n.State, "why", why)
			n.SetState(kv.NodeDeleting, ex.now)
			n.Launcher, n.DriverData, n.Reason = "", nil, why
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			l.log.Warn("could not delete expired node", "node", id, "err", err)
		}
	}
}

// expiry tells which nodes are past their time at one instant.
type expiry struct {
	now        time.Time
	maxReady   map[string]time.Duration // label -> max-ready-age
	maxHoldAge time.Duration
}

func newExpiry(cfg *config.Config, now time.Time) expiry {
	ex := expiry{now: now, maxReady: map[string]time.Duration{}, maxHoldAge: cfg.MaxHoldAge.D()}
	for _, lb := range cfg.Labels {
		if lb.MaxReadyAge > 0 {
			ex.maxReady[lb.Name] = lb.MaxReadyAge.D()
		}
	}
	return ex
}

// why says why a node is past its time, or "" if it is not.
func (ex expiry) why(n *kv.Node) string {
	switch n.State {
	case kv.NodeReady:
		return ex.readyTooLong(n)
	case kv.NodeHold:
		if n.HoldExpiration != nil && ex.now.After(*n.HoldExpiration) {
			return "hold expired at " + n.HoldExpiration.Format(time.RFC3339)
		}
		if ex.maxHoldAge > 0 && ex.now.Sub(n.StateTime) > ex.maxHoldAge {
			return fmt.Sprintf("held for longer than max-hold-age %s", ex.maxHoldAge)
		}
	case kv.NodeInUse:
		if n.LeaseUntil != nil && ex.now.After(*n.LeaseUntil) {
			return "lease of " + n.Holder + " ran out at " + n.LeaseUntil.Format(time.RFC3339)
		}
	}
	return ""
}

// readyTooLong: an unallocated ready node older than its label's
// max-ready-age.
func (ex expiry) readyTooLong(n *kv.Node) string {
	if len(n.Labels) == 0 || n.AllocatedTo != "" {
		return ""
	}
	if age, ok := ex.maxReady[n.Labels[0]]; ok && ex.now.Sub(n.StateTime) > age {
		return fmt.Sprintf("ready for longer than max-ready-age %s", age)
	}
	return ""
}

// expireRequests deletes requests whose lease ran out (their requestor
// stopped renewing lease_until, so it is gone; nodes allocated to them and
// not taken are freed as for any deleted request) and failed requests
// older than FailedRequestAge (from their state_time), which nobody else
// deletes when their requestor does not.
func (c *cleanup) expireRequests(ctx context.Context) {
	l := c.l
	now := l.clock.Now()
	var due []kv.Entry[kv.Request]
	l.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if requestExpired(&e.Value, now) || failedLongAgo(&e.Value, now, l.opts.FailedRequestAge) {
			due = append(due, *e)
		}
		return true
	})
	for _, e := range due {
		if requestExpired(&e.Value, now) {
			l.log.Info("request lease ran out; deleting the request", "request", e.Key, "requestor", e.Value.Requestor,
				"lease_until", e.Value.LeaseUntil.Format(time.RFC3339))
		} else {
			l.log.Info("request failed long ago; deleting the request", "request", e.Key, "requestor", e.Value.Requestor,
				"failed", e.Value.StateTime.Format(time.RFC3339), "failed_request_age", l.opts.FailedRequestAge)
		}
		if err := l.requests.Delete(ctx, e.Key, e.Revision); err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			l.log.Warn("could not delete request", "request", e.Key, "err", err)
		}
	}
}

// requestExpired reports whether a request's lease ran out.
func requestExpired(r *kv.Request, now time.Time) bool {
	return r.LeaseUntil != nil && now.After(*r.LeaseUntil)
}

// failedLongAgo reports whether a request failed more than age ago (from
// its state_time, or its creation when a record has no state_time).
func failedLongAgo(r *kv.Request, now time.Time, age time.Duration) bool {
	if r.State != kv.RequestFailed {
		return false
	}
	since := r.StateTime
	if since.IsZero() {
		since = r.Created
	}
	return now.Sub(since) > age
}

// requests fails waiting requests that every live pool declined and puts
// back requests pending in pools nobody serves any more.
func (c *cleanup) requests(ctx context.Context) {
	live := c.l.livePools()
	if len(live) == 0 {
		return
	}
	declined, orphaned := c.requestsToEnd(live)
	for _, id := range declined {
		c.failDeclined(ctx, id)
	}
	for _, id := range orphaned {
		c.putBack(ctx, id)
	}
}

// requestsToEnd lists the waiting requests every live pool declined, and
// the requests pending in a pool nobody served at the last sweep either.
func (c *cleanup) requestsToEnd(live map[string]kv.ComponentPool) (declined, orphaned []string) {
	seenOrphan := map[string]bool{}
	c.l.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := e.Value
		switch r.State {
		case kv.RequestRequested:
			if failIfAllDeclined(&r, live, c.l.clock.Now()) {
				declined = append(declined, e.Key)
			}
		case kv.RequestPending:
			ref := kv.PoolRef(r.Provider, r.Pool)
			if _, ok := live[ref]; !ok {
				seenOrphan[ref] = true
				if c.orphanPools[ref] >= 1 {
					orphaned = append(orphaned, e.Key)
				}
			}
		}
		return true
	})
	for ref := range c.orphanPools {
		if !seenOrphan[ref] {
			delete(c.orphanPools, ref)
		}
	}
	for ref := range seenOrphan {
		c.orphanPools[ref]++
	}
	return declined, orphaned
}

// failDeclined fails a waiting request every live pool declined.
func (c *cleanup) failDeclined(ctx context.Context, id string) {
	l := c.l
	_, err := l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if !failIfAllDeclined(r, l.livePools(), l.clock.Now().UTC()) {
			return kv.ErrSkip
		}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		l.log.Warn("could not fail a request every live pool declined", "request", id, "err", err)
	}
}

// putBack puts a request pending in a pool nobody serves back in line.
func (c *cleanup) putBack(ctx context.Context, id string) {
	l := c.l
	_, err := l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending {
			return kv.ErrSkip
		}
		if _, ok := l.livePools()[kv.PoolRef(r.Provider, r.Pool)]; ok {
			return kv.ErrSkip
		}
		l.log.Info("request pending in a pool nobody serves; putting it back", "request", r.ID, "pool", kv.PoolRef(r.Provider, r.Pool))
		r.SetState(kv.RequestRequested, l.clock.Now().UTC())
		r.Provider, r.Pool, r.Nodes = "", "", []string{}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && ctx.Err() == nil {
		l.log.Warn("could not put back request", "request", id, "err", err)
	}
}

// leaks deletes instances tagged as this provider's that no node record
// accounts for, once seen in two sweeps in a row.
func (c *cleanup) leaks(ctx, deleteCtx context.Context, wg *sync.WaitGroup, provider string, drv drivers.Provider, suspects map[string]int) {
	l := c.l
	listed := l.clock.Now()
	insts, err := drv.ListInstances(ctx)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("could not list instances", "provider", provider, "err", err)
		}
		return
	}
	c.deadNodes(ctx, provider, drv, insts, listed) // deadnodes.go
	seen := map[string]bool{}
	// By index: a copy of each instance taken in the loop would be one
	// allocation per instance of the cloud (the closure below keeps it),
	// at every sweep.
	for i := range insts {
		inst := &insts[i]
		if inst.Tags[drivers.TagProvider] != provider || !c.leaked(inst) {
			continue
		}
		key := provider + "/" + inst.ExternalID
		seen[key] = true
		suspects[key]++
		if suspects[key] < 2 {
			continue
		}
		if !c.confirmLeaked(ctx, inst) {
			delete(suspects, key)
			continue
		}
		if _, busy := c.deleting.LoadOrStore(key, true); busy {
			continue
		}
		l.log.Info("deleting leaked instance", "provider", provider, "external_id", inst.ExternalID, "node", inst.NodeID())
		externalID := inst.ExternalID
		wg.Go(func() {
			defer c.deleting.Delete(key)
			done, ok := drivers.Use(drv)
			if !ok {
				return // replaced by a reload meanwhile; the next sweep sees it again
			}
			defer done()
			if l.lifecycle.deleteInstance(deleteCtx, drv, externalID, nil) {
				l.metrics.LeakedDeleted(provider, "instances", 1)
			}
		})
	}
	for key := range suspects {
		if !seen[key] {
			delete(suspects, key)
		}
	}
}

// leaked reports whether an instance of ours is not accounted for by its
// node record.
func (c *cleanup) leaked(inst *drivers.Instance) bool {
	nodeID := inst.NodeID()
	if nodeID == "" {
		return true
	}
	if zookeeperNodeID.MatchString(nodeID) {
		// A Python Nodepool launcher's instance (its node ids are
		// ZooKeeper sequences; this project's never are): during a
		// migration it may serve a provider of the same cloud, and its
		// nodes are its own to delete.
		return false
	}
	e, ok := c.l.nodes.Get(nodeID)
	if !ok {
		return true
	}
	n := &e.Value
	if n.ExternalID == inst.ExternalID {
		return false
	}
	// A node still being created may be on a later attempt whose launcher
	// cleans up the earlier one itself, or have not recorded its instance
	// yet.
	return n.State != kv.NodeBuilding && n.State != kv.NodeInit
}

// zookeeperNodeID is the form of a Python Nodepool's node ids.
var zookeeperNodeID = regexp.MustCompile(`^\d{10}$`)

// confirmLeaked reads the instance's node record afresh before the instance
// is deleted for good: the cache may be behind the bucket (a watch that
// stalled when a server of the cluster went away), and an instance whose
// node the cache has not seen yet is not leaked.
func (c *cleanup) confirmLeaked(ctx context.Context, inst *drivers.Instance) bool {
	nodeID := inst.NodeID()
	if nodeID == "" {
		return true
	}
	e, err := c.l.b.Nodes.Get(ctx, nodeID)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return true
	case err != nil:
		return false // not sure: the next sweep looks again
	}
	c.l.nodes.Apply(e)
	n := &e.Value
	return n.ExternalID != inst.ExternalID && n.State != kv.NodeBuilding && n.State != kv.NodeInit
}

// purge drops delete markers older than half an hour from the node and
// request buckets, so churn does not grow them for ever.
func (c *cleanup) purge(ctx context.Context) {
	c.lastPurge = c.l.clock.Now()
	for _, b := range []jetstream.KeyValue{c.l.b.Nodes.Bucket(), c.l.b.Requests.Bucket()} {
		if err := b.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(30*time.Minute)); err != nil && ctx.Err() == nil {
			c.l.log.Debug("could not purge delete markers", "bucket", b.Bucket(), "err", err)
		}
	}
}

// interruptions acts on the instances a provider's cloud is taking back:
// a ready node that nobody took is deleted (a pending request it was
// planned for gets another one), a node in use, held, or waiting for its
// requestor to take it gets the reason in its `reason`.
func (c *cleanup) interruptions(ctx context.Context, provider string, drv drivers.Interrupter) {
	l := c.l
	list, err := drv.Interruptions(ctx)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("could not read the cloud's interruptions", "provider", provider, "err", err)
		}
		return
	}
	for _, in := range list {
		e, ok := l.nodes.Get(in.NodeID)
		if !ok || e.Value.Provider != provider || e.Value.ExternalID != in.ExternalID {
			continue
		}
		action := ""
		_, err := l.nodes.Modify(ctx, in.NodeID, func(n *kv.Node) error {
			if n.ExternalID != in.ExternalID {
				return kv.ErrSkip
			}
			action = c.interrupted(n, in.Reason)
			if action == "" {
				return kv.ErrSkip
			}
			return nil
		})
		if err == nil {
			l.metrics.Interruption(provider, action)
		} else if !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			l.log.Warn("could not act on an interruption", "node", in.NodeID, "err", err)
		}
	}
}

// interrupted changes a node whose instance the cloud takes back: a ready
// node nobody waits for is replaced, a node in use is told. It returns
// what it did ("replaced", "told"), or "" when the node needs nothing.
func (c *cleanup) interrupted(n *kv.Node, why string) string {
	l := c.l
	replace := n.State == kv.NodeReady && n.AllocatedTo == ""
	if n.State == kv.NodeReady && n.AllocatedTo != "" {
		r, ok := l.requests.Get(n.AllocatedTo)
		replace = !ok || r.Value.State == kv.RequestPending
	}
	switch {
	case replace:
		l.log.Info("replacing a ready node whose instance the cloud takes back", "node", n.ID, "external_id", n.ExternalID, "why", why)
		n.SetState(kv.NodeDeleting, l.clock.Now().UTC())
		n.Launcher, n.DriverData, n.AllocatedTo, n.Reason = "", nil, "", why
		return "replaced"
	case (n.State == kv.NodeInUse || n.State == kv.NodeHold || n.State == kv.NodeReady) && n.Reason != why:
		l.log.Info("the cloud takes back the instance of a node in use", "node", n.ID, "external_id", n.ExternalID, "state", n.State, "why", why)
		n.Reason = why
		return "told"
	}
	return ""
}
