package openstack

import (
	"context"
	"sync"
)

// flights makes concurrent lookups of one thing share one call to the
// cloud: when hundreds of launches start at once, they need the flavors,
// the availability zones or an image's id once, not once each (which,
// with a rate, would queue them all behind the same question).
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

// do runs fn unless a call of the same key runs; then it waits for that
// one and returns its error. fn stores what it found where callers read
// it.
func (f *flights) do(ctx context.Context, key string, fn func() error) error {
	f.mu.Lock()
	if c, ok := f.m[key]; ok {
		f.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	c := &flight{done: make(chan struct{})}
	f.m[key] = c
	f.mu.Unlock()
	c.err = fn()
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
	close(c.done)
	return c.err
}
