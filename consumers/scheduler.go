package consumers

import (
	"context"
	"log/slog"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// scheduler serves the requests of one provider pool. It runs in the one
// process that holds the pool's lease, so decisions (order, quota, which
// ready node goes to which request) are made in one place; every decision
// is then committed with revision-checked updates, so even two schedulers
// that both believe they lead can never give one node to two requests.
// The scheduler is level-triggered: each pass looks at the records as they
// are, so a new leader simply carries on from them.
//
// The scheduler itself holds only what the configuration fixes; each
// term as leader runs with a fresh term value (scheduler_term.go), so
// nothing of an earlier term carries over. The work is split by concept:
// the term's loop (scheduler_term.go), the indexes of records
// (scheduler_index.go), planning (scheduler_plan.go), the jobs in flight
// (scheduler_jobs.go) and the writes the jobs make (scheduler_writes.go).
type scheduler struct {
	l *Launcher
	// snap is the configuration the scheduler runs on (a reload that
	// changes what it reads starts another scheduler); drv is its
	// provider's driver in that snapshot.
	snap   *snapshot
	drv    drivers.Provider
	prov   *config.Provider
	pool   *config.Pool
	ref    string
	labels map[string]bool
	log    *slog.Logger
	// registered: the pool's nodes are registered by its driver (static),
	// never created here; every request is served from them.
	registered bool

	// sizes is what one node of each label costs against quota; unsized
	// are the labels whose size the driver could not tell yet (a cloud
	// driver learns its flavors from the cloud), asked again every sync
	// interval.
	sizes   map[string]kv.Resources
	unsized map[string]bool
	// disabled are the pool's labels with min-ready below 0 (its value):
	// no node of them is created.
	disabled map[string]int
}

func newScheduler(l *Launcher, snap *snapshot, prov *config.Provider, pool *config.Pool) *scheduler {
	s := &scheduler{l: l, snap: snap, drv: snap.providers[prov.Name], prov: prov, pool: pool, ref: kv.PoolRef(prov.Name, pool.Name), labels: map[string]bool{}, sizes: map[string]kv.Resources{}, disabled: map[string]int{}}
	s.unsized = map[string]bool{}
	for _, pl := range pool.Labels {
		s.labels[pl.Name] = true
		s.unsized[pl.Name] = true
		if lb, ok := snap.cfg.Label(pl.Name); ok && lb.Disabled() {
			s.disabled[pl.Name] = lb.MinReady
		}
	}
	s.readSizes()
	_, s.registered = drivers.As[drivers.Registrar](s.drv)
	s.log = l.log.With("pool", s.ref)
	return s
}

// readSizes asks the driver what a node of each label it could not tell
// yet costs; until it can, a node counts as one instance.
func (s *scheduler) readSizes() {
	for label := range s.unsized {
		size, err := s.drv.QuotaForLabel(s.pool.Name, label)
		if err == nil {
			delete(s.unsized, label)
		}
		if err != nil || size.Instances == 0 {
			size.Instances = 1
		}
		s.sizes[label] = size
	}
}

// run serves the pool for one term as leader, until ctx ends (the lease
// was lost or the process stops).
func (s *scheduler) run(ctx context.Context) {
	done, ok := drivers.Use(s.drv)
	if !ok {
		<-ctx.Done() // the driver was replaced: a reload stops this scheduler
		return
	}
	defer done()
	s.log.Info("leading pool")
	defer s.log.Info("no longer leading pool")
	newTerm(s).run(ctx)
}
