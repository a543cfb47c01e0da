package drivers

import (
	"context"
	"log/slog"
	"slices"

	"golang.org/x/time/rate"

	"github.com/nodepool-nats/nodepool/kv"
)

// Pacer paces the API calls of a process's drivers: one limiter for each
// provider with a rate, shared by every role of the process (the
// launcher's machines, listings and quota reads, and the builder's image
// uploads, deletes and listings). Every live process that calls a
// provider takes an equal share of its rate, so that all of them together
// stay within it.
type Pacer struct {
	rates    map[string]float64
	limiters map[string]*rate.Limiter
	log      *slog.Logger
}

// NewPacer makes a pacer for providers with these rates (calls per second;
// providers without a rate are not paced).
func NewPacer(rates map[string]float64, log *slog.Logger) *Pacer {
	p := &Pacer{rates: map[string]float64{}, limiters: map[string]*rate.Limiter{}, log: log}
	for name, r := range rates {
		if r > 0 {
			p.rates[name] = r
			p.limiters[name] = rate.NewLimiter(rate.Limit(r), 1)
		}
	}
	return p
}

// Wrap paces the calls of one provider's driver (unchanged if it has no
// rate). A driver that paces every API call itself (Paced) is handed the
// limiter instead of being wrapped.
func (p *Pacer) Wrap(name string, prov Provider) Provider {
	lim, ok := p.limiters[name]
	if !ok {
		return prov
	}
	if paced, ok := As[Paced](prov); ok {
		paced.Pace(lim)
		return prov
	}
	return RateLimited(prov, lim)
}

// WrapAll paces every driver of a map, in place.
func (p *Pacer) WrapAll(providers map[string]Provider) {
	for name, prov := range providers {
		providers[name] = p.Wrap(name, prov)
	}
}

// Paced reports whether any provider has a rate.
func (p *Pacer) Paced() bool { return len(p.limiters) > 0 }

// Share keeps this process's share of each rate until ctx ends: the rate
// divided by the live processes that call the provider (launchers serving
// a pool of it, and builders, which may upload to any provider), as the
// components bucket lists them.
func (p *Pacer) Share(ctx context.Context, components *kv.Cache[kv.Component]) {
	sub := components.Subscribe()
	defer components.Unsubscribe(sub)
	for {
		sub.Drain()
		for name, lim := range p.limiters {
			n := 0
			components.Range(func(e *kv.Entry[kv.Component]) bool {
				if slices.Contains(e.Value.Roles, "builder") || slices.ContainsFunc(e.Value.Pools, func(cp kv.ComponentPool) bool { return cp.Provider == name }) {
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
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
		}
	}
}
