package drivers

import "sync"

// Shared is a provider instance that several parts of a process use (the
// launcher's machines, schedulers and sweeps, the builder's uploads) and
// that a configuration reload may replace: the reload retires it, and it
// is closed once the last use that began before ends. Work in flight thus
// finishes with the instance it started with.
type Shared struct {
	Provider
	mu      sync.Mutex
	uses    int
	retired bool
	closed  bool
}

// Share wraps p for shared use.
func Share(p Provider) *Shared { return &Shared{Provider: p} }

// Use begins a use; it reports false once the provider is retired (the
// caller takes the current configuration's provider instead).
func (s *Shared) Use() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retired {
		return false
	}
	s.uses++
	return true
}

// Done ends a use; the last use of a retired provider closes it.
func (s *Shared) Done() {
	s.mu.Lock()
	s.uses--
	last := s.retired && s.uses == 0 && !s.closed
	if last {
		s.closed = true
	}
	s.mu.Unlock()
	if last {
		s.Provider.Close()
	}
}

// Retire closes the provider as soon as nobody uses it; no use begins
// after.
func (s *Shared) Retire() {
	s.mu.Lock()
	s.retired = true
	now := s.uses == 0 && !s.closed
	if now {
		s.closed = true
	}
	s.mu.Unlock()
	if now {
		s.Provider.Close()
	}
}

// Close retires the provider.
func (s *Shared) Close() { s.Retire() }

// Unwrap returns the provider underneath.
func (s *Shared) Unwrap() Provider { return s.Provider }

// Use begins a use of p if it is (or wraps) a Shared provider: ok is false
// when it was retired; done ends the use. A provider that is not shared is
// always usable.
func Use(p Provider) (done func(), ok bool) {
	s, shared := As[*Shared](p)
	if !shared {
		return func() {}, true
	}
	if !s.Use() {
		return nil, false
	}
	return s.Done, true
}
