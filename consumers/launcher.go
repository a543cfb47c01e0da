// Package consumers runs the launcher's worker groups: request intake, one
// scheduler per provider pool (led by a lease), the launches and deletes of
// the work stream that run create and delete state machines, min-ready and
// periodic cleanup.
// Every handler is idempotent, every change is a revision-checked update, and
// a message is acknowledged only after its effect is committed.
package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// DefaultFailedRequestAge is how long a failed request is kept by default.
const DefaultFailedRequestAge = 24 * time.Hour

// Requestor names used by nodepool itself.
const (
	MinReadyRequestor = "NodePool:min-ready"
)

// Options configure a launcher.
type Options struct {
	// ID is this process's identity in records and leases.
	ID string
	// Config is the loaded nodepool.yaml.
	Config *config.Config
	// Providers are the constructed drivers, by provider name.
	Providers map[string]drivers.Provider
	// LeaseTTL must match the TTL of the components and locks buckets.
	LeaseTTL time.Duration
	// SyncInterval is how often periodic sweeps run.
	SyncInterval time.Duration
	// FailedRequestAge is how long a failed request is kept before
	// cleanup deletes it (default a day).
	FailedRequestAge time.Duration
	// Clock is the time the launcher goes by (default the real one): its
	// leases, its fencing, the cleanup's sweeps and the ages they compare,
	// min-ready's retries, and the times written in the records (state
	// times, hold expirations) that those compare.
	Clock clock.Clock
	// Version is reported in the component record.
	Version string
	// Roles are the process's roles, reported in the component record
	// (default: launcher).
	Roles []string
	Log   *slog.Logger
	// Metrics is the process's metrics registry (nil: a private one).
	Metrics *metrics.Registry
	// Pacer paces the providers' API calls, shared with the other roles
	// of the process (nil: one of the launcher's own).
	Pacer *drivers.Pacer
	// Views are the process's caches of nodes, requests and components,
	// shared with its other roles and drivers; nil: the launcher keeps
	// caches of its own.
	Views *kv.Views
	// NewDriver makes a provider's driver from its section: the cleanup
	// leader makes, with it, the driver of a provider removed from the
	// configuration from its remembered section, to drain it (drain.go).
	// Nil: removed providers cannot be drained by this process.
	NewDriver func(ctx context.Context, pc *config.Provider) (drivers.Provider, error)
}

// Launcher is one launcher process's share of the worker groups.
type Launcher struct {
	opts  Options
	clock clock.Clock // opts.Clock
	js    jetstream.JetStream
	b     *kv.Buckets
	log   *slog.Logger

	nodes      *kv.Cache[kv.Node]
	requests   *kv.Cache[kv.Request]
	components *kv.Cache[kv.Component]
	images     *imageIndex // uploads of diskimages (nil without diskimage labels)
	drain      *drainer    // remembered provider sections, drivers of removed providers

	lifecycle *lifecycle
	metrics   *metrics.Launcher
	system    *metrics.System
	// statsLeader is set while this process holds the cleanup lease: it
	// then exports the gauges of the whole system.
	statsLeader atomic.Bool

	// paused holds the pools this process leads that wait on quota; a
	// change is announced at once through beat. quotas holds the cloud's
	// quota as those pools last read it, announced with the next beat.
	pausedMu sync.Mutex
	paused   map[string]bool
	quotas   map[string]*kv.CloudQuota
	beat     chan struct{}

	// snap is the configuration in force and its drivers (reload.go);
	// reloadMu serializes reloads with the start and end of Run, which
	// sets runCtx while the pool schedulers and driver managers (runners)
	// may run.
	snap      atomic.Pointer[snapshot]
	reloadMu  sync.Mutex
	runCtx    context.Context
	runners   map[string]*runner
	runnersWG sync.WaitGroup

	// born is when the launcher was made; lastBeat is when (since born)
	// the last successful heartbeat was sent (fence.go).
	born     time.Time
	lastBeat atomic.Int64
	// renewedMu guards renewed, closed and replaced each time lastBeat
	// moves on (awaitUnfenced waits on it).
	renewedMu sync.Mutex
	renewed   chan struct{}
	// unanswered are heartbeats whose answer did not come in time, which
	// may have landed all the same (fence.go).
	unanswered unansweredBeats
	// fencedOff is set while the process is fenced and its machines
	// stopped.
	fencedOff atomic.Bool
	// running is true while every worker group of this launcher is up.
	running atomic.Bool
}

// NewLauncher prepares a launcher; Run starts it.
func NewLauncher(js jetstream.JetStream, b *kv.Buckets, opts Options) (*Launcher, error) {
	if opts.ID == "" {
		return nil, errors.New("launcher needs an id")
	}
	if opts.Config == nil {
		return nil, errors.New("launcher needs a configuration")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	switch {
	case b.LeaseTTL > 0 && opts.LeaseTTL != 0 && opts.LeaseTTL != b.LeaseTTL:
		opts.Log.Warn("the launcher's lease TTL differs from the buckets' TTL; using the buckets'", "configured", opts.LeaseTTL, "buckets", b.LeaseTTL)
		opts.LeaseTTL = b.LeaseTTL
	case opts.LeaseTTL == 0 && b.LeaseTTL > 0:
		opts.LeaseTTL = b.LeaseTTL
	case opts.LeaseTTL == 0:
		opts.LeaseTTL = 10 * time.Second
	}
	if opts.SyncInterval == 0 {
		opts.SyncInterval = 5 * time.Second
	}
	if opts.FailedRequestAge == 0 {
		opts.FailedRequestAge = DefaultFailedRequestAge
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real()
	}
	log := opts.Log.With("launcher", opts.ID)
	if opts.Pacer == nil {
		opts.Pacer = drivers.NewPacer(log)
	}
	l := &Launcher{
		opts:       opts,
		clock:      opts.Clock,
		js:         js,
		b:          b,
		log:        log,
		nodes:      opts.Views.Nodes(b, log),
		requests:   opts.Views.Requests(b, log),
		components: opts.Views.Components(b, log),
		images:     newImageIndex(b, opts.Views, log),
		paused:     map[string]bool{},
		quotas:     map[string]*kv.CloudQuota{},
		beat:       make(chan struct{}, 1),
		born:       opts.Clock.Now(),
		renewed:    make(chan struct{}),
		runners:    map[string]*runner{},
	}
	snap, err := l.newSnapshot(opts.Config, opts.Providers)
	if err != nil {
		return nil, err
	}
	l.snap.Store(snap)
	l.drain = newDrainer(l)
	l.metrics = metrics.NewLauncher(opts.Metrics, l.config)
	l.lastBeat.Store(-int64(opts.LeaseTTL)) // fenced until the first heartbeat
	l.lifecycle = newLifecycle(l)
	l.system = metrics.NewSystem(l.metrics.Registry(), metrics.SystemSource{
		Leader: l.statsLeader.Load,
		Nodes: func(yield func(*kv.Node) bool) {
			l.nodes.Range(func(e *kv.Entry[kv.Node]) bool { return yield(&e.Value) })
		},
		Requests: func(yield func(*kv.Request) bool) {
			l.requests.Range(func(e *kv.Entry[kv.Request]) bool { return yield(&e.Value) })
		},
		Pools:    func() []kv.ComponentPool { return slices.Collect(maps.Values(l.livePools())) },
		Config:   l.config,
		Removed:  func() func(*kv.Node) bool { r := l.removals(); return func(n *kv.Node) bool { return r(n) != nil } },
		Draining: l.Draining,
	})
	return l, nil
}

// Metrics returns the launcher's series.
func (l *Launcher) Metrics() *metrics.Launcher { return l.metrics }

// Nodes is the launcher's view of the nodes bucket.
func (l *Launcher) Nodes() *kv.Cache[kv.Node] { return l.nodes }

// Requests is the launcher's view of the requests bucket.
func (l *Launcher) Requests() *kv.Cache[kv.Request] { return l.requests }

// Components is the launcher's view of the live components.
func (l *Launcher) Components() *kv.Cache[kv.Component] { return l.components }

// Running reports whether the launcher has started every worker group and
// is not stopping (readiness).
func (l *Launcher) Running() bool { return l.running.Load() }

// Run runs the launcher's worker groups until ctx ends, then shuts down:
// consumers stop taking messages, launches in flight stop after their
// current step (their progress is in the node records) and are handed to
// other launchers, and the component record is removed. A ctx that ends
// while the launcher is still starting is a shutdown too, not a failure:
// Run then returns nil.
func (l *Launcher) Run(ctx context.Context) error {
	err := l.run(ctx)
	if err != nil && ctx.Err() != nil {
		l.log.Info("launcher stopped while starting", "error", err)
		return nil
	}
	return err
}

func (l *Launcher) run(parent context.Context) error {
	// ctx ends with parent, or when starting fails, so that what was
	// started before the failure stops before run returns.
	ctx, stop := context.WithCancel(parent)
	defer stop()
	// The process's views may be shared with its other roles and drivers
	// (Options.Views): each runs one watch while any of them has it
	// started.
	stopViews := []func(){l.nodes.Start(), l.requests.Start(), l.components.Start()}
	for _, c := range append(l.images.caches(), l.drain.caches()...) {
		stopViews = append(stopViews, c.Start())
	}
	defer func() {
		for _, stop := range stopViews {
			stop()
		}
	}()
	for _, c := range []interface{ WaitSynced(context.Context) error }{l.nodes, l.requests, l.components} {
		if err := c.WaitSynced(ctx); err != nil {
			return err
		}
	}
	for _, c := range append(l.images.caches(), l.drain.caches()...) {
		if err := c.WaitSynced(ctx); err != nil {
			return err
		}
	}

	// A cluster electing a leader is waited out: a process started then
	// must not give up.
	if _, err := natsretry.Do(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, l.heartbeat(ctx) }); err != nil {
		return fmt.Errorf("registering launcher: %w", err)
	}

	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	wg.Go(func() { l.keepHeartbeat(ctx) })
	wg.Go(func() { l.watchFence(ctx) })
	wg.Go(func() { l.opts.Pacer.Share(ctx, l.components) })
	wg.Go(func() { l.drain.keepRemembered(ctx) })

	// The consumers are opened at once: a process restarted while a
	// cluster elects leaders waits out the slower one, not both.
	var intakeCons, deleteCons *durable.Consumer
	var intakeErr, deleteErr error
	var opening sync.WaitGroup
	opening.Go(func() { intakeCons, intakeErr = l.openIntake(ctx) })
	opening.Go(func() { deleteCons, deleteErr = l.lifecycle.openDeletes(ctx) })
	opening.Wait()
	if err := errors.Join(intakeErr, deleteErr); err != nil {
		for _, c := range []*durable.Consumer{intakeCons, deleteCons} {
			if c != nil {
				c.Stop()
			}
		}
		return err
	}
	intake, err := l.startIntake(ctx, intakeCons)
	if err != nil {
		return err
	}
	endpoints, err := l.startAPI(ctx)
	if err != nil {
		intake.Stop()
		return err
	}
	lc, err := l.lifecycle.startDeletes(ctx, deleteCons)
	if err != nil {
		intake.Stop()
		endpoints.Stop()
		return err
	}
	l.lifecycle.resumeOwn(ctx)
	wg.Go(func() { l.lifecycle.watchOwn(ctx) })
	wg.Go(func() { l.lifecycle.askWork(ctx) })
	wg.Go(func() { l.lifecycle.followMachines(ctx) })

	l.reloadMu.Lock()
	l.runCtx = ctx
	l.syncRunners()
	l.reloadMu.Unlock()
	mr := newMinReady(l)
	mrLease := kv.NewLease(l.b.Locks, "min-ready", l.opts.ID, l.opts.LeaseTTL, l.log, kv.WithClock(l.clock), kv.WithWatch(l.opts.Views.Leases()))
	wg.Go(func() { mrLease.Elect(ctx, safeLoop(l, "min-ready", mr.run)) })
	cl := newCleanup(l)
	clLease := kv.NewLease(l.b.Locks, "cleanup", l.opts.ID, l.opts.LeaseTTL, l.log, kv.WithClock(l.clock), kv.WithWatch(l.opts.Views.Leases()))
	wg.Go(func() { clLease.Elect(ctx, safeLoop(l, "cleanup", l.exportingSystem(cl.run))) })

	l.log.Info("launcher running", "providers", len(l.config().Providers))
	l.running.Store(true)
	<-ctx.Done()
	l.running.Store(false)
	l.log.Info("launcher stopping")

	// Stop taking new messages; what was taken and not acknowledged is
	// delivered again to another process.
	intake.Stop()
	endpoints.Stop()
	lc.Stop()
	l.stopRunners()
	wg.Wait()
	l.lifecycle.stop()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	l.lifecycle.handOver(sctx)
	if e, err := l.b.Components.Get(sctx, l.opts.ID); err == nil {
		_ = l.b.Components.Delete(sctx, l.opts.ID, e.Revision)
	}
	l.log.Info("launcher stopped")
	return nil
}

// component is this process's record in nodepool-components.
func (l *Launcher) component() *kv.Component {
	host, _ := os.Hostname()
	roles := l.opts.Roles
	if len(roles) == 0 {
		roles = []string{config.RoleLauncher}
	}
	c := &kv.Component{ID: l.opts.ID, Roles: roles, Hostname: host, PID: os.Getpid(),
		Version: l.opts.Version, Heartbeat: l.clock.Now().UTC()}
	l.pausedMu.Lock()
	defer l.pausedMu.Unlock()
	c.Providers = []string{}
	for _, p := range l.config().Providers {
		c.Providers = append(c.Providers, p.Name)
		for _, pool := range p.Pools {
			ref := kv.PoolRef(p.Name, pool.Name)
			cp := kv.ComponentPool{Provider: p.Name, Pool: pool.Name, Priority: pool.Priority, Paused: l.paused[ref], CloudQuota: l.quotas[ref]}
			for _, pl := range pool.Labels {
				cp.Labels = append(cp.Labels, pl.Name)
			}
			c.Pools = append(c.Pools, cp)
		}
	}
	return c
}

// heartbeat writes the component record (creating it if it expired). It
// writes once, at the revision its cache holds (its own last write, or one
// the watch brought: Cache.Modify): a read first would be a request to the
// stream's leader that waits in the server's API queue behind every other,
// and on a loaded cluster made heartbeats miss their time. Only when that
// revision is not the record's (another process wrote it) does it read the
// record and write again, and only when the record expired does it make it
// anew.
func (l *Launcher) heartbeat(ctx context.Context) error {
	sent := l.elapsed()
	c := l.component()
	// fill makes cur this heartbeat, keeping when the process started; a
	// heartbeat of its own found there whose answer came late counts.
	fill := func(cur *kv.Component, found bool) {
		if found {
			l.unanswered.landed(l, cur.Heartbeat)
		}
		started := cur.Started
		*cur = *c
		cur.Started = started
		if !found || started.IsZero() {
			cur.Started = c.Heartbeat
		}
	}
	_, err := l.components.Modify(ctx, l.opts.ID, func(cur *kv.Component) error {
		fill(cur, true)
		return nil
	})
	if errors.Is(err, kv.ErrNotFound) || errors.Is(err, kv.ErrBadRecord) {
		var e kv.Entry[kv.Component]
		if e, err = l.b.Components.Upsert(ctx, l.opts.ID, fill); err == nil {
			l.components.Apply(e)
		}
	}
	if err != nil {
		l.unanswered.add(c.Heartbeat, sent)
		return err
	}
	l.beaten(sent)
	l.unanswered.answered(sent)
	return nil
}

// setPaused records whether a pool this process leads waits on quota, and
// announces a change at once.
func (l *Launcher) setPaused(ref string, paused bool) {
	l.pausedMu.Lock()
	changed := l.paused[ref] != paused
	l.paused[ref] = paused
	l.pausedMu.Unlock()
	if changed {
		select {
		case l.beat <- struct{}{}:
		default:
		}
	}
}

// setCloudQuota records the cloud's quota as a pool this process leads
// last read it (nil: none), for the next heartbeat to announce.
func (l *Launcher) setCloudQuota(ref string, q *kv.CloudQuota) {
	l.pausedMu.Lock()
	defer l.pausedMu.Unlock()
	if q == nil {
		delete(l.quotas, ref)
		return
	}
	l.quotas[ref] = q
}

// syncCaches waits until the node, request and component caches hold
// every change made before the call, trying again until ctx ends; it
// reports whether they do. A process taking over a duty from another
// (a pool's lease, min-ready, cleanup) calls it first: after a server of
// the cluster went away, its watches may be behind for a moment, and a
// decision taken on an older view than its predecessor's (how many nodes a
// pool has, which instances no record accounts for) would be wrong.
func (l *Launcher) syncCaches(ctx context.Context) bool {
	for failures := 0; ctx.Err() == nil; failures++ {
		sctx, cancel := context.WithTimeout(ctx, l.opts.LeaseTTL)
		err := errors.Join(l.nodes.Sync(sctx), l.requests.Sync(sctx), l.components.Sync(sctx))
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() == nil {
			l.log.Debug("caches not in sync yet", "err", err)
		}
		if !wait.Sleep(ctx, min(wait.Backoff(failures), time.Second)) {
			break
		}
	}
	return false
}

// alive reports whether a component is alive (its heartbeat has not
// expired).
func (l *Launcher) alive(id string) bool {
	return id != "" && l.components.Has(id)
}

// gone reports whether a launcher's heartbeat has expired, confirmed by a
// fresh read of its record: taking over its nodes on the word of the
// cache alone would be wrong when the cache is behind (a watch that
// stalled, a launcher that has just registered), and two launchers would
// then drive one machine. When not sure, it answers false.
func (l *Launcher) gone(ctx context.Context, id string) bool {
	if id == "" {
		return true
	}
	if l.alive(id) {
		return false
	}
	if t := l.components.Restarted(); !t.IsZero() && time.Since(t) < l.opts.LeaseTTL {
		// The components bucket was deleted and made again a moment ago:
		// live launchers write their heartbeats again within a TTL, and
		// until then a missing one means nothing.
		return false
	}
	e, err := l.b.Components.Get(ctx, id)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return true
	case err == nil:
		l.components.Apply(e)
	}
	return false
}

// livePools lists the pools served by live launchers, with their
// announcement; a pool is paused if its leader says so.
func (l *Launcher) livePools() map[string]kv.ComponentPool {
	out := map[string]kv.ComponentPool{}
	l.components.Range(func(e *kv.Entry[kv.Component]) bool {
		for _, p := range e.Value.Pools {
			ref := kv.PoolRef(p.Provider, p.Pool)
			prev, ok := out[ref]
			if !ok {
				out[ref] = p
			} else if p.Paused && !prev.Paused {
				// Only the pool's leader knows; any report of a pause wins.
				prev.Paused = true
				out[ref] = prev
			}
		}
		return true
	})
	return out
}

// exportingSystem runs fn (cleanup's loop) as the process that exports
// the gauges of the whole system: to Prometheus while it runs, and to
// statsd every sync interval.
func (l *Launcher) exportingSystem(fn func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		l.statsLeader.Store(true)
		defer l.statsLeader.Store(false)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for wait.Sleep(ctx, l.opts.SyncInterval) {
				l.system.Send()
			}
		}()
		fn(ctx)
		<-done
	}
}

// cloudCallTimeout bounds the periodic calls a launcher makes to a cloud
// on its own (listings for the cleanup's sweeps and the quota reading):
// ten sync intervals, and at least two minutes, as a big cloud's paginated
// listing can take that long.
func (l *Launcher) cloudCallTimeout() time.Duration {
	return max(10*l.opts.SyncInterval, 2*time.Minute)
}

// firstQuotaWait is how long a pool's scheduler waits for the cloud's
// quota before its first decision: five sync intervals, between one and
// ten seconds.
func (l *Launcher) firstQuotaWait() time.Duration {
	return min(max(5*l.opts.SyncInterval, time.Second), 10*time.Second)
}
