package drivers

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"golang.org/x/time/rate"

	"github.com/nodepool-nats/nodepool/record"
)

// Pacer paces the API calls of a process's drivers: one limiter for each
// provider with a rate, shared by every role of the process (the
// launcher's machines, listings and quota reads, and the builder's image
// uploads, deletes and listings) and kept across configuration reloads.
// Every live process that calls a provider takes an equal share of its
// rate, so that all of them together stay within it.
type Pacer struct {
	log *slog.Logger

	mu       sync.Mutex
	rates    map[string]float64
	limiters map[string]*rate.Limiter
	changed  chan struct{}
}

// NewPacer makes a pacer; providers are paced as Pace is asked to.
func NewPacer(log *slog.Logger) *Pacer {
	return &Pacer{log: log, rates: map[string]float64{}, limiters: map[string]*rate.Limiter{}, changed: make(chan struct{}, 1)}
}

// Limiter returns the process's limiter of a provider whose rate is r calls
// a second: made on first use and kept (with its pace) across reloads; nil
// if r is not positive (the provider is not paced).
func (p *Pacer) Limiter(name string, r float64) *rate.Limiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r <= 0 {
		delete(p.rates, name)
		delete(p.limiters, name)
		return nil
	}
	lim, ok := p.limiters[name]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(r), 1)
		p.limiters[name] = lim
	}
	if p.rates[name] != r || !ok {
		p.rates[name] = r
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
	return lim
}

// Pace returns a provider's driver as its calls are to be made: wrapped by
// RateLimited, or handed the limiter if it paces every API call itself
// (Paced); unchanged without a rate.
func (p *Pacer) Pace(name string, prov Provider, r float64) Provider {
	lim := p.Limiter(name, r)
	if lim == nil {
		return prov
	}
	if paced, ok := As[Paced](prov); ok {
		paced.Pace(lim)
		return prov
	}
	return RateLimited(prov, lim)
}

// Components is the view of the live components the pacer reads: every
// record, and a signal after they change (kv.Cache has both).
type Components interface {
	Range(fn func(*record.Entry[record.Component]) bool)
	Changes() (changed <-chan struct{}, stop func())
}

// Share keeps this process's share of each rate until ctx ends: the rate
// divided by the live processes that call the provider (launchers serving
// a pool of it, and builders, which may upload to any provider), as the
// components bucket lists them.
func (p *Pacer) Share(ctx context.Context, components Components) {
	changed, stop := components.Changes()
	defer stop()
	for {
		p.mu.Lock()
		for name, lim := range p.limiters {
			n := 0
			components.Range(func(e *record.Entry[record.Component]) bool {
				if slices.Contains(e.Value.Roles, "builder") || slices.ContainsFunc(e.Value.Pools, func(cp record.ComponentPool) bool { return cp.Provider == name }) {
					n++
				}
				return true
			})
			share := rate.Limit(p.rates[name] / float64(max(n, 1)))
			if lim.Limit() != share {
				p.log.Info("API rate share", "provider", name, "rate", float64(share), "processes", max(n, 1))
				lim.SetLimit(share)
			}
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-p.changed:
		}
	}
}
