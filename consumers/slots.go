package consumers

import (
	"context"
	"sync"

	"github.com/nodepool-nats/nodepool/config"
)

// slots bounds the launches a process runs at once for one provider
// (max-concurrency; 0 is no bound). A reload changes the bound in place,
// so launches that hold a slot give it back to the same count.
type slots struct {
	mu    sync.Mutex
	limit int
	used  int
	freed chan struct{} // closed and replaced when a slot frees or the bound grows
}

func newSlots(limit int) *slots { return &slots{limit: limit, freed: make(chan struct{})} }

// tryTake takes a slot if one is free.
func (s *slots) tryTake() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 && s.used >= s.limit {
		return false
	}
	s.used++
	return true
}

// take waits for a slot until ctx ends.
func (s *slots) take(ctx context.Context) bool {
	for {
		s.mu.Lock()
		if s.limit <= 0 || s.used < s.limit {
			s.used++
			s.mu.Unlock()
			return true
		}
		ch := s.freed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// give gives a slot back.
func (s *slots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used--
	s.wake()
}

// setLimit changes the bound.
func (s *slots) setLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = n
	s.wake()
}

func (s *slots) wake() {
	close(s.freed)
	s.freed = make(chan struct{})
}

// slotsOf returns a provider's slots (made on first use).
func (lc *lifecycle) slotsOf(provider string) *slots {
	lc.semsMu.Lock()
	defer lc.semsMu.Unlock()
	s := lc.sems[provider]
	if s == nil {
		limit := 0
		if pc, ok := lc.l.config().Provider(provider); ok {
			limit = pc.MaxConcurrency
		}
		s = newSlots(limit)
		lc.sems[provider] = s
	}
	return s
}

// resize applies a reloaded configuration's max-concurrency.
func (lc *lifecycle) resize(cfg *config.Config) {
	lc.semsMu.Lock()
	defer lc.semsMu.Unlock()
	for name, s := range lc.sems {
		limit := 0
		if pc, ok := cfg.Provider(name); ok {
			limit = pc.MaxConcurrency
		}
		s.setLimit(limit)
	}
}
