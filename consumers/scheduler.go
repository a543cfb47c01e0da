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
	l      *Launcher
	prov   *config.Provider
	pool   *config.Pool
	ref    string
	labels map[string]bool
	log    *slog.Logger
	// registered: the pool's nodes are registered by its driver (static),
	// never created here; every request is served from them.
	registered bool

	// sizes is what one node of each label costs against quota.
	sizes map[string]kv.Resources
	// disabled are the pool's labels with min-ready below 0 (its value):
	// no node of them is created.
	disabled map[string]int
}

func newScheduler(l *Launcher, prov *config.Provider, pool *config.Pool) *scheduler {
	s := &scheduler{l: l, prov: prov, pool: pool, ref: kv.PoolRef(prov.Name, pool.Name), labels: map[string]bool{}, sizes: map[string]kv.Resources{}, disabled: map[string]int{}}
	for _, pl := range pool.Labels {
		s.labels[pl.Name] = true
		size, err := l.opts.Providers[prov.Name].QuotaForLabel(pool.Name, pl.Name)
		if err != nil || size.Instances == 0 {
			size.Instances = 1
		}
		s.sizes[pl.Name] = size
		if lb, ok := l.opts.Config.Label(pl.Name); ok && lb.Disabled() {
			s.disabled[pl.Name] = lb.MinReady
		}
	}
	_, s.registered = drivers.As[drivers.Registrar](l.opts.Providers[prov.Name])
	s.log = l.log.With("pool", s.ref)
	return s
}

// run serves the pool for one term as leader, until ctx ends (the lease
// was lost or the process stops).
func (s *scheduler) run(ctx context.Context) {
	s.log.Info("leading pool")
	defer s.log.Info("no longer leading pool")
	newTerm(s).run(ctx)
}
