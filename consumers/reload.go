package consumers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/token"
	"github.com/nodepool-nats/nodepool/kv"
)

// A configuration reload swaps the launcher's snapshot (the configuration
// and the drivers made for it) whole. Whatever reads the configuration
// reads the snapshot current when it starts: a pass of min-ready or
// cleanup, a node's create or delete machine (which keeps its provider's
// driver, and that driver's configuration, until it ends), a pool
// scheduler's term. The pool schedulers and driver managers whose
// configuration changed are stopped (their leases released) and started
// again on the new snapshot; the others run on.

// snapshot is one configuration and the drivers made for it.
type snapshot struct {
	cfg *config.Config
	// given are the drivers as the process made them (their identity says
	// whether a provider changed); providers are the same as the launcher
	// calls them (paced by the process's limiters).
	given     map[string]drivers.Provider
	providers map[string]drivers.Provider
}

// current is the snapshot in force.
func (l *Launcher) current() *snapshot { return l.snap.Load() }

// config is the configuration in force.
func (l *Launcher) config() *config.Config { return l.current().cfg }

// Config is the configuration the launcher runs now.
func (l *Launcher) Config() *config.Config { return l.config() }

// newSnapshot checks a configuration against its drivers and paces them:
// each provider with a rate goes through the process's limiter of it
// (drivers.Pacer: kept across reloads, so a provider's pace carries on,
// and shared with the builder of the same process).
func (l *Launcher) newSnapshot(cfg *config.Config, given map[string]drivers.Provider) (*snapshot, error) {
	for _, p := range cfg.Providers {
		if _, ok := given[p.Name]; !ok {
			return nil, fmt.Errorf("provider %s has no driver", p.Name)
		}
	}
	s := &snapshot{cfg: cfg, given: given, providers: map[string]drivers.Provider{}}
	for name, p := range given {
		rate := 0.0
		if pc, ok := cfg.Provider(name); ok {
			rate = pc.CallsPerSecond()
		}
		s.providers[name] = l.opts.Pacer.Pace(name, p, rate)
	}
	return s, nil
}

// providerUse is a provider's driver taken for one piece of work, with
// its configuration; done ends the use.
type providerUse struct {
	drv  drivers.Provider
	cfg  *config.Provider
	done func()
}

// use takes the current driver of a provider for one piece of work: a
// reload that replaces it meanwhile lets the work finish with it.
func (l *Launcher) use(provider string) (providerUse, bool) {
	for range 3 {
		snap := l.current()
		drv, ok := snap.providers[provider]
		pc, cok := snap.cfg.Provider(provider)
		if !ok || !cok {
			// Not configured: the driver this process drains it with,
			// if any (drain.go).
			return l.drain.use(provider)
		}
		if done, ok := drivers.Use(drv); ok {
			return providerUse{drv: drv, cfg: pc, done: done}, true
		}
		// Retired by a reload between the two reads: take the new one.
	}
	return providerUse{}, false
}

// Reload makes a new configuration and its drivers the launcher's: pool
// schedulers and driver managers whose configuration changed are
// restarted, new ones started, removed ones stopped (their leases
// released); machines in flight finish with the driver they started with.
// The component record announces the new pools at once.
func (l *Launcher) Reload(cfg *config.Config, providers map[string]drivers.Provider) error {
	l.reloadMu.Lock()
	defer l.reloadMu.Unlock()
	snap, err := l.newSnapshot(cfg, providers)
	if err != nil {
		return err
	}
	l.snap.Store(snap)
	l.lifecycle.resize(cfg)
	l.drain.rememberSoon()
	started, stopped := l.syncRunners()
	select {
	case l.beat <- struct{}{}:
	default:
	}
	l.log.Info("launcher configuration reloaded", "providers", len(cfg.Providers), "pools_started", started, "pools_stopped", stopped)
	return nil
}

// runner is a pool scheduler or a driver manager, elected by its lease,
// or the puller of a provider's launches.
type runner struct {
	key    string // what it runs on: restarted when this changes
	cancel context.CancelFunc
	done   chan struct{}
}

// syncRunners makes the running pool schedulers and driver managers those
// of the current snapshot: stopped where the snapshot no longer has them
// or changed what they run on, then started where missing. It does
// nothing before Run started them or after Run ended. Call with reloadMu
// held.
func (l *Launcher) syncRunners() (started, stopped []string) {
	if l.runCtx == nil {
		return nil, nil
	}
	snap := l.current()
	want := map[string]string{}
	starts := map[string]func(context.Context){}
	for i := range snap.cfg.Providers {
		prov := &snap.cfg.Providers[i]
		for j := range prov.Pools {
			pool := &prov.Pools[j]
			ref := kv.PoolRef(prov.Name, pool.Name)
			want["pool "+ref] = poolKey(snap, prov, pool)
			starts["pool "+ref] = func(ctx context.Context) {
				s := newScheduler(l, snap, prov, pool)
				lease := kv.NewLease(l.b.Locks, "pool."+token.Encode(prov.Name)+"."+token.Encode(pool.Name), l.opts.ID, l.opts.LeaseTTL, l.log, kv.WithClock(l.clock), kv.WithWatch(l.opts.Views.Leases()))
				lease.Elect(ctx, safeLoop(l, "pool "+s.ref, s.run))
			}
		}
	}
	for i := range snap.cfg.Providers {
		name := snap.cfg.Providers[i].Name
		// The provider's launches, pulled as its slots free: one puller
		// whatever a reload changes (max-concurrency is resized in place).
		want["launches "+name] = "launches"
		starts["launches "+name] = func(ctx context.Context) { l.lifecycle.pullLaunches(ctx, name) }
	}
	for name, drv := range snap.given {
		m, ok := drivers.As[drivers.Manager](drv)
		if !ok {
			continue
		}
		want["manager "+name] = fmt.Sprintf("%p", drv)
		lease := kv.NewLease(l.b.Locks, "provider."+token.Encode(name), l.opts.ID, l.opts.LeaseTTL, l.log, kv.WithClock(l.clock), kv.WithWatch(l.opts.Views.Leases()))
		starts["manager "+name] = func(ctx context.Context) {
			lease.Elect(ctx, safeLoop(l, "manager of "+name, func(ctx context.Context) {
				done, ok := drivers.Use(drv)
				if !ok {
					<-ctx.Done()
					return
				}
				defer done()
				m.Manage(ctx, l.opts.SyncInterval)
			}))
		}
	}
	var waits []chan struct{}
	for name, r := range l.runners {
		if key, ok := want[name]; !ok || key != r.key {
			r.cancel()
			waits = append(waits, r.done)
			delete(l.runners, name)
			stopped = append(stopped, name)
		}
	}
	// A runner is stopped (its lease released) before its successor on
	// the same lease starts: one process never runs two terms of a pool.
	for _, w := range waits {
		<-w
	}
	for name, key := range want {
		if _, ok := l.runners[name]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(l.runCtx)
		r := &runner{key: key, cancel: cancel, done: make(chan struct{})}
		l.runners[name] = r
		run := starts[name]
		l.runnersWG.Go(func() {
			defer close(r.done)
			run(ctx)
		})
		started = append(started, name)
	}
	slices.Sort(started)
	slices.Sort(stopped)
	return started, stopped
}

// poolKey is what a pool's scheduler runs on: its provider's driver (a
// new one whenever the provider's configuration changed, pools and labels
// included), the top-level entries of its labels, the tenants' limits and
// the diskimages.
func poolKey(snap *snapshot, prov *config.Provider, pool *config.Pool) string {
	var labels []config.Label
	for _, pl := range pool.Labels {
		if lb, ok := snap.cfg.Label(pl.Name); ok {
			labels = append(labels, lb)
		}
	}
	b, err := json.Marshal(struct {
		Labels     []config.Label
		Tenants    []config.TenantLimit
		Diskimages []config.Diskimage
	}{labels, snap.cfg.TenantResourceLimits, snap.cfg.Diskimages})
	if err != nil {
		return fmt.Sprintf("%p/%v", snap.given[prov.Name], err)
	}
	return fmt.Sprintf("%p/%s", snap.given[prov.Name], b)
}

// stopRunners stops every pool scheduler and driver manager and lets no
// reload start one again.
func (l *Launcher) stopRunners() {
	l.reloadMu.Lock()
	l.runCtx = nil
	for _, r := range l.runners {
		r.cancel()
	}
	l.runners = map[string]*runner{}
	l.reloadMu.Unlock()
	l.runnersWG.Wait()
}
