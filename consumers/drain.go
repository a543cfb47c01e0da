package consumers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Removed means drained. A provider, pool or label that a reload or a
// restart took out of the configuration launches nothing more, and what
// is left of it goes:
//
//   - A pool or label is removed when no live launcher announces it (its
//     component record lists its pools and their labels); a provider
//     when no live launcher's configuration names it (component records
//     list their providers; while a live builder still names it, its
//     uploads and images are left to that builder, and it is not
//     forgotten). Each is acted on once seen removed in two
//     cleanup sweeps in a row, a lease TTL apart, so that a launcher
//     still starting, or a reload on its way through the processes, is
//     not taken for a removal.
//   - Its ready (and building, and unregistered) nodes are deleted by the
//     cleanup leader (state deleting, with the reason), unless a
//     fulfilled request holds them: its requestor takes them, and they go
//     when given back. In-use nodes go when given back (used nodes are
//     deleted, never reused); held ones when their hold ends. A request
//     pending in a removed pool goes back to requested (cleanup's
//     orphan sweep); one pending in a pool that lost one of its labels is
//     put back by the pool's scheduler, declined by that pool, so that
//     another pool serves it, or it fails once every live pool declined.
//   - A provider's configuration section is remembered in the
//     nodepool-providers bucket by every launcher that has it (at start
//     and at each reload). When the provider is removed and records,
//     instances or uploads of it remain, the cleanup leader makes its
//     driver from that section, in a draining mode: it never launches;
//     the leader's node lifecycle deletes the provider's nodes with it,
//     and its cloud sweep deletes the provider's uploads (the images and
//     then their records), its leaked instances and images, and the
//     driver's leftovers. Once the records hold no node or upload of it
//     and its listings show no instance or image tagged as its own, the
//     section is forgotten (the record deleted) and the provider is
//     drained. A restart with the provider removed does the same: the
//     section is in the bucket.
//   - A drain that cannot go on (the driver cannot be made, the cloud's
//     calls fail) says so: a log line when it starts (again every ten
//     minutes while it lasts), the record's problem (shown in the
//     dashboard's Needs attention), and the gauge
//     nodepool_draining_providers{state="stuck"}. Nothing is written
//     again meanwhile: the revisit sweep leaves alone the nodes of a
//     provider no live launcher names. It goes on once the cloud answers
//     again; an operator gives up on such a provider with `nodepool
//     erase`, which removes its records and its remembered section.
//   - A provider whose section no launcher ever remembered (removed in
//     the change that brought this version in) can never be drained in
//     the cloud: its records are removed as they are freed (in-use and
//     held nodes once given back or their hold ends), each with a log
//     line naming what it leaves in the cloud.

// problemLogEvery is how often a drain that cannot go on is logged again.
const problemLogEvery = 10 * time.Minute

// drainer is a launcher's part of the drain: the remembered sections
// (kept by every launcher) and, in the cleanup leader, the drivers of the
// providers it drains.
type drainer struct {
	l *Launcher
	// records caches nodepool-providers (nil without the bucket).
	records  *kv.Cache[kv.ProviderRecord]
	remember chan struct{}

	mu      sync.Mutex
	drivers map[string]*drainDriver

	// draining and stuck count the providers the leader drains, and
	// those whose drain cannot go on (for the gauges).
	draining, stuck atomic.Int64
}

// drainDriver is a removed provider's driver, made from its remembered
// section (section: the bytes it was made from).
type drainDriver struct {
	drv     drivers.Provider
	cfg     *config.Provider
	section []byte
}

func newDrainer(l *Launcher) *drainer {
	d := &drainer{l: l, remember: make(chan struct{}, 1), drivers: map[string]*drainDriver{}}
	if l.b.Providers != nil {
		d.records = l.opts.Views.Providers(l.b, l.log)
	}
	return d
}

// caches are the watch caches to run with the launcher's.
func (d *drainer) caches() []interface {
	Start() func()
	WaitSynced(context.Context) error
} {
	if d.records == nil {
		return nil
	}
	return []interface {
		Start() func()
		WaitSynced(context.Context) error
	}{d.records}
}

// rememberSoon asks for the sections of the configuration in force to be
// recorded.
func (d *drainer) rememberSoon() {
	select {
	case d.remember <- struct{}{}:
	default:
	}
}

// keepRemembered records the sections of the configuration in force at
// start and after each reload, trying again until it succeeds; and looks
// again every ten sync intervals, in case a record went missing (the
// bucket deleted and made again, an operator's erase of a provider this
// process still has): a section that is as recorded is not written.
func (d *drainer) keepRemembered(ctx context.Context) {
	if d.records == nil {
		return
	}
	d.rememberSoon()
	tick := time.NewTicker(10 * d.l.opts.SyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.remember:
		case <-tick.C:
		}
		for failures := 0; ; failures++ {
			err := d.rememberAll(ctx)
			if err == nil || ctx.Err() != nil {
				break
			}
			d.l.log.Warn("could not record the providers' configuration sections; trying again", "err", err)
			if !wait.Sleep(ctx, wait.Backoff(failures)) {
				return
			}
		}
	}
}

// rememberAll writes the section of every provider of the configuration
// in force whose record differs (or says it drains).
func (d *drainer) rememberAll(ctx context.Context) error {
	var errs []error
	for i := range d.l.config().Providers {
		pc := &d.l.config().Providers[i]
		section, err := config.ProviderSection(pc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		key := kv.ProviderKey(pc.Name)
		if e, ok := d.records.Get(key); ok && bytes.Equal(e.Value.Section, section) && e.Value.DrainingSince == nil && e.Value.Problem == "" {
			continue
		}
		e, err := d.l.b.Providers.Upsert(ctx, key, func(cur *kv.ProviderRecord, _ bool) {
			*cur = kv.ProviderRecord{Name: pc.Name, Driver: pc.Driver, Section: section,
				Recorded: d.l.clock.Now().UTC(), Launcher: d.l.opts.ID}
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("provider %s: %w", pc.Name, err))
			continue
		}
		d.records.Apply(e)
	}
	return errors.Join(errs...)
}

// driver returns the draining driver of a provider, if this process has
// made one (it leads cleanup and drains the provider).
func (d *drainer) driver(provider string) (drivers.Provider, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dd, ok := d.drivers[provider]
	if !ok {
		return nil, false
	}
	return dd.drv, true
}

// use takes the draining driver of a provider for one piece of work (a
// delete).
func (d *drainer) use(provider string) (providerUse, bool) {
	d.mu.Lock()
	dd, ok := d.drivers[provider]
	d.mu.Unlock()
	if !ok {
		return providerUse{}, false
	}
	done, ok := drivers.Use(dd.drv)
	if !ok {
		return providerUse{}, false
	}
	return providerUse{drv: dd.drv, cfg: dd.cfg, done: done}, true
}

// ensureDriver returns the draining driver of a provider, made from its
// remembered section (made again when the section changed).
func (d *drainer) ensureDriver(ctx context.Context, rec *kv.ProviderRecord) (drivers.Provider, error) {
	d.mu.Lock()
	dd, ok := d.drivers[rec.Name]
	d.mu.Unlock()
	if ok && bytes.Equal(dd.section, rec.Section) {
		return dd.drv, nil
	}
	if len(rec.Section) == 0 {
		return nil, errors.New("no launcher recorded its configuration section, so its driver cannot be made")
	}
	pc, err := config.ProviderFromSection(rec.Section)
	if err != nil {
		return nil, err
	}
	if pc.Name != rec.Name {
		return nil, fmt.Errorf("its remembered section names provider %s", pc.Name)
	}
	if d.l.opts.NewDriver == nil {
		return nil, errors.New("this process cannot make drivers (no driver factory)")
	}
	drv, err := d.l.opts.NewDriver(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("making its driver from the remembered section: %w", err)
	}
	drv = d.l.opts.Pacer.Pace(rec.Name, drv, pc.CallsPerSecond())
	d.mu.Lock()
	old := d.drivers[rec.Name]
	d.drivers[rec.Name] = &drainDriver{drv: drv, cfg: pc, section: bytes.Clone(rec.Section)}
	d.mu.Unlock()
	if old != nil {
		old.drv.Close() // once its deletes in flight end
	}
	d.l.log.Info("made the driver of a removed provider from its remembered configuration, to drain it", "provider", rec.Name, "driver", pc.Driver)
	return drv, nil
}

// retire closes the draining driver of a provider (once the deletes in
// flight on it end).
func (d *drainer) retire(provider string) {
	d.mu.Lock()
	dd, ok := d.drivers[provider]
	delete(d.drivers, provider)
	d.mu.Unlock()
	if ok {
		dd.drv.Close()
	}
}

// retireAll closes every draining driver: this process no longer leads
// cleanup.
func (d *drainer) retireAll() {
	d.mu.Lock()
	all := d.drivers
	d.drivers = map[string]*drainDriver{}
	d.mu.Unlock()
	for _, dd := range all {
		dd.drv.Close()
	}
	d.draining.Store(0)
	d.stuck.Store(0)
}

// Draining counts the removed providers the cleanup leader drains, and
// those whose drain cannot go on (this process's view: it is the leader
// when it exports the system gauges).
func (l *Launcher) Draining() (draining, stuck int) {
	return int(l.drain.draining.Load()), int(l.drain.stuck.Load())
}

// driverOf returns the driver a node's provider has in this process: the
// configured one, or the draining one (draining true) if this process
// drains the provider.
func (l *Launcher) driverOf(provider string) (drv drivers.Provider, draining, ok bool) {
	if drv, ok := l.current().providers[provider]; ok {
		return drv, false, true
	}
	if drv, ok := l.drain.driver(provider); ok {
		return drv, true, true
	}
	return nil, false, false
}

// launchable reports whether the configuration in force has the pool and
// label a node is launched for: one a reload removed launches nothing
// more (the drain deletes the node, or another launcher that still has
// them launches it).
func (l *Launcher) launchable(n *kv.Node) bool {
	pc, ok := l.config().Provider(n.Provider)
	if !ok {
		return false
	}
	_, _, err := pc.PoolLabel(n.Pool, createRequest(n).Label)
	return err == nil
}

// namedProviders are the providers some live launcher's configuration
// names, this one's included: those whose nodes a launcher deletes. A
// provider that only a builder still names (a builder not reloaded yet)
// is drained all the same, but for its uploads (builderProviders).
func (l *Launcher) namedProviders() map[string]bool {
	out := map[string]bool{}
	for name := range l.current().given {
		out[name] = true
	}
	l.components.Range(func(e *kv.Entry[kv.Component]) bool {
		c := &e.Value
		if !isLauncher(c) {
			return true
		}
		for _, p := range c.Pools {
			out[p.Provider] = true
		}
		for _, p := range c.Providers {
			out[p] = true
		}
		return true
	})
	return out
}

// builderProviders are the providers that a live builder (a process
// without the launcher role) names: their uploads are the builder's
// while it has them.
func (l *Launcher) builderProviders() map[string]bool {
	out := map[string]bool{}
	l.components.Range(func(e *kv.Entry[kv.Component]) bool {
		if c := &e.Value; !isLauncher(c) {
			for _, p := range c.Providers {
				out[p] = true
			}
		}
		return true
	})
	return out
}

// isLauncher reports whether a component record is a launcher's (a
// record without roles is an older launcher's).
func isLauncher(c *kv.Component) bool {
	return len(c.Roles) == 0 || slices.Contains(c.Roles, config.RoleLauncher)
}

// removal says what of a node's configuration is gone: its provider,
// its pool, or its labels.
type removal struct {
	key    string // "provider <p>", "pool <p>/<pool>", "label <p>/<pool> <label>"
	reason string
	// provider: the whole provider is gone (its driver must be made from
	// its remembered section).
	provider bool
}

// removals returns a function that tells what of a node's configuration
// is gone, by the configuration of the live processes now (nil: nothing).
func (l *Launcher) removals() func(n *kv.Node) *removal {
	named := l.namedProviders()
	live := l.livePools()
	return func(n *kv.Node) *removal {
		if n.Provider == "" {
			return nil
		}
		if !named[n.Provider] {
			return &removal{key: "provider " + n.Provider, provider: true,
				reason: fmt.Sprintf("provider %s was removed from the configuration", n.Provider)}
		}
		ref := kv.PoolRef(n.Provider, n.Pool)
		p, ok := live[ref]
		if !ok {
			return &removal{key: "pool " + ref, reason: fmt.Sprintf("pool %s was removed from the configuration", ref)}
		}
		if len(n.Labels) == 0 || slices.ContainsFunc(n.Labels, func(lb string) bool { return slices.Contains(p.Labels, lb) }) {
			return nil
		}
		return &removal{key: "label " + ref + " " + strings.Join(n.Labels, ","),
			reason: fmt.Sprintf("label %s was removed from pool %s", strings.Join(n.Labels, ","), ref)}
	}
}

// drainTerm is the drain in one term of the cleanup leader.
type drainTerm struct {
	c  *cleanup
	d  *drainer
	l  *Launcher
	wg *sync.WaitGroup // deletions of leaked instances

	// gone holds what was seen removed, since when and how many sweeps
	// in a row.
	gone map[string]sighting

	mu        sync.Mutex
	running   map[string]bool           // providers whose cloud pass runs
	suspects  map[string]map[string]int // provider -> instance or image -> sightings
	problems  map[string]*drainProblem  // provider -> why its drain cannot go on
	providers map[string]bool           // the providers drained now
	passes    sync.WaitGroup
}

// drainProblem is why a provider's drain cannot go on, since when, and
// when it was last logged.
type drainProblem struct {
	text   string
	since  time.Time
	logged time.Time
}

// drainTerm starts the drain of a cleanup term; end ends it.
func (d *drainer) term(c *cleanup, wg *sync.WaitGroup) *drainTerm {
	return &drainTerm{c: c, d: d, l: d.l, wg: wg, gone: map[string]sighting{}, running: map[string]bool{},
		suspects: map[string]map[string]int{}, problems: map[string]*drainProblem{}, providers: map[string]bool{}}
}

// end waits for the cloud passes and closes the draining drivers.
func (t *drainTerm) end() {
	t.passes.Wait()
	t.d.retireAll()
}

// due tells, for each key seen removed in this sweep, whether it was in
// two sweeps in a row and for at least a lease TTL; keys not seen are
// forgotten.
func (t *drainTerm) due(seen map[string]bool) map[string]bool {
	now := t.l.clock.Now()
	out := map[string]bool{}
	for key := range t.gone {
		if !seen[key] {
			delete(t.gone, key)
		}
	}
	for key := range seen {
		s, ok := t.gone[key]
		if !ok {
			s = sighting{first: now}
		}
		s.n++
		t.gone[key] = s
		out[key] = s.n >= 2 && now.Sub(s.first) >= t.l.opts.LeaseTTL
	}
	return out
}

// pass is one sweep of the drain: the records' part here (no cloud
// call), each drained provider's cloud pass in a goroutine of its own.
func (t *drainTerm) pass(ctx context.Context) {
	l := t.l
	removed := l.removals()
	named := l.namedProviders()
	seen := map[string]bool{}
	type found struct {
		e kv.Entry[kv.Node]
		r *removal
	}
	var nodes []found
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if r := removed(&e.Value); r != nil {
			seen[r.key] = true
			nodes = append(nodes, found{*e, r})
		}
		return true
	})
	// Providers with uploads or a remembered section and no live process
	// naming them are drained too.
	l.images.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if p := e.Value.Provider; p != "" && !named[p] {
			seen["provider "+p] = true
		}
		return true
	})
	if t.d.records != nil {
		t.d.records.Range(func(e *kv.Entry[kv.ProviderRecord]) bool {
			if p := e.Value.Name; p != "" && !named[p] {
				seen["provider "+p] = true
			}
			return true
		})
	}
	due := t.due(seen)

	for _, f := range nodes {
		if !due[f.r.key] {
			continue
		}
		t.node(ctx, f.e, f.r)
	}
	drained := map[string]bool{}
	for key, ok := range due {
		if p, isProvider := strings.CutPrefix(key, "provider "); isProvider && ok {
			drained[p] = true
		}
	}
	t.mu.Lock()
	for p := range t.providers {
		if !drained[p] {
			// Named again (re-added), or nothing of it is left.
			delete(t.providers, p)
			delete(t.problems, p)
			delete(t.suspects, p)
			t.d.retire(p)
		}
	}
	for p := range drained {
		t.providers[p] = true
	}
	t.countLocked()
	t.mu.Unlock()
	for p := range drained {
		t.startCloudPass(ctx, p)
	}
}

// node deletes a node of something removed, or has it deleted, as its
// state allows.
func (t *drainTerm) node(ctx context.Context, e kv.Entry[kv.Node], r *removal) {
	l := t.l
	n := &e.Value
	switch n.State {
	case kv.NodeReady, kv.NodeBuilding, kv.NodeInit:
		if t.takenSoon(n) {
			return // its requestor takes it; it goes when given back
		}
		now := t.l.clock.Now().UTC()
		_, err := l.nodes.Modify(ctx, e.Key, func(cur *kv.Node) error {
			if cur.State != n.State || cur.Provider != n.Provider || cur.Pool != n.Pool || t.takenSoon(cur) {
				return kv.ErrSkip
			}
			l.log.Info("deleting a node of a removed provider, pool or label", "node", e.Key, "state", cur.State,
				"provider", cur.Provider, "pool", cur.Pool, "labels", cur.Labels, "why", r.reason)
			cur.SetState(kv.NodeDeleting, now)
			cur.Launcher, cur.DriverData, cur.AllocatedTo, cur.Reason = "", nil, "", r.reason
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
			l.log.Warn("could not delete a node of a removed provider, pool or label", "node", e.Key, "err", err)
		}
	default:
		// Nodes to delete (used, failed, deleting...) of a provider no
		// process has: this process deletes them with the provider's
		// draining driver, if it has it. Those of a pool or label go
		// through the provider's launchers as any other.
		if !r.provider || !l.needsWork(n) {
			return
		}
		if _, ok := t.d.driver(n.Provider); !ok {
			return
		}
		if err := l.lifecycle.reconcile(ctx, e, ""); err != nil && ctx.Err() == nil {
			l.log.Debug("could not take up a node of a removed provider yet", "node", e.Key, "err", err)
		}
	}
}

// takenSoon reports whether a node is allocated to a fulfilled request
// that still exists: its requestor is about to take it.
func (t *drainTerm) takenSoon(n *kv.Node) bool {
	if n.AllocatedTo == "" || n.State != kv.NodeReady {
		return false
	}
	r, ok := t.l.requests.Get(n.AllocatedTo)
	return ok && r.Value.State == kv.RequestFulfilled && slices.Contains(r.Value.Nodes, n.ID)
}

// countLocked updates the gauges' counts.
func (t *drainTerm) countLocked() {
	t.d.draining.Store(int64(len(t.providers)))
	t.d.stuck.Store(int64(len(t.problems)))
}

// startCloudPass starts a provider's cloud pass unless one runs.
func (t *drainTerm) startCloudPass(ctx context.Context, provider string) {
	t.mu.Lock()
	if t.running[provider] {
		t.mu.Unlock()
		return
	}
	t.running[provider] = true
	if t.suspects[provider] == nil {
		t.suspects[provider] = map[string]int{}
	}
	suspects := t.suspects[provider]
	t.mu.Unlock()
	t.passes.Go(func() {
		defer func() {
			t.mu.Lock()
			delete(t.running, provider)
			t.mu.Unlock()
		}()
		pctx, cancel := context.WithTimeout(ctx, t.c.cloudSweepTimeout())
		defer cancel()
		t.cloudPass(pctx, ctx, provider, suspects)
	})
}

// unserved says which labels of a request pending in the pool the pool
// no longer has ("" if it has them all).
func (t *term) unserved(r *kv.Request) string {
	var gone []string
	for _, lb := range r.Labels {
		if !t.labels[lb] {
			gone = append(gone, lb)
		}
	}
	if len(gone) == 0 {
		return ""
	}
	return fmt.Sprintf("label %s is no longer in this pool", strings.Join(gone, ", "))
}

// putBack gives up a request pending in this pool that the pool can no
// longer serve: it goes back to requested, declined by this pool, for
// another pool to serve (or to fail once every live pool declined); the
// nodes planned for it are freed or, being of a removed label, deleted.
func (s *scheduler) putBack(ctx context.Context, id, why string) {
	_, err := s.l.requests.Modify(ctx, id, func(r *kv.Request) error {
		if r.State != kv.RequestPending || r.Provider != s.prov.Name || r.Pool != s.pool.Name {
			return kv.ErrSkip
		}
		now := s.l.clock.Now().UTC()
		s.log.Info("request pending in a pool that lost one of its labels; putting it back", "request", id, "why", why)
		r.SetState(kv.RequestRequested, now)
		r.Provider, r.Pool, r.Nodes = "", "", []string{}
		if !slices.Contains(r.DeclinedBy, s.ref) {
			r.DeclinedBy = append(r.DeclinedBy, s.ref)
		}
		r.Reason = s.ref + ": " + why
		failIfAllDeclined(r, s.l.livePools(), now)
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.log.Warn("could not put back a request", "request", id, "err", err)
	}
}
