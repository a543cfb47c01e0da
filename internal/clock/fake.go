package clock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Fake is a Clock that moves only when Set or Advance moves it. Its timers
// and tickers fire when it passes their time; a test waits with
// BlockUntil or BlockUntilDue until the code under test is waiting on the
// clock before it moves it.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeWaiter // pending timers and running tickers
	changed chan struct{} // closed and replaced when waiters change
}

// fakeWaiter is a timer (period 0) or a ticker waiting for the clock to
// reach due.
type fakeWaiter struct {
	f      *Fake
	due    time.Time
	period time.Duration
	ch     chan time.Time
}

// NewFake makes a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{now: t, changed: make(chan struct{})} }

// Now is the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since is the fake time elapsed since t.
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// After sends the fake time on the channel once the clock passed d from
// now.
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// NewTimer makes a timer that fires once the clock passed d from now (at
// once if d <= 0).
func (f *Fake) NewTimer(d time.Duration) Timer { return f.add(d, 0) }

// NewTicker makes a ticker that fires whenever the clock passes another d
// (d > 0) from now; ticks not read are dropped, as time.Ticker's.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic(fmt.Sprintf("clock: non-positive interval %s for NewTicker", d))
	}
	return fakeTicker{f.add(d, d)}
}

// fakeTicker is a ticker of a Fake.
type fakeTicker struct{ w *fakeWaiter }

func (t fakeTicker) C() <-chan time.Time { return t.w.ch }
func (t fakeTicker) Stop()               { t.w.Stop() }

func (f *Fake) add(d, period time.Duration) *fakeWaiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{f: f, due: f.now.Add(d), period: period, ch: make(chan time.Time, 1)}
	if period == 0 && d <= 0 {
		w.ch <- f.now
		return w
	}
	f.waiters = append(f.waiters, w)
	f.notifyLocked()
	return w
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Set moves the clock to t and fires the timers and tickers due by then,
// earliest first. A ticker fires once however many of its periods passed.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	due := slices.DeleteFunc(slices.Clone(f.waiters), func(w *fakeWaiter) bool { return w.due.After(t) })
	if len(due) == 0 {
		return
	}
	slices.SortStableFunc(due, func(a, b *fakeWaiter) int { return a.due.Compare(b.due) })
	for _, w := range due {
		select {
		case w.ch <- t:
		default: // a ticker's last tick is not read yet
		}
		if w.period == 0 {
			f.removeLocked(w)
			continue
		}
		for !w.due.After(t) {
			w.due = w.due.Add(w.period)
		}
	}
	f.notifyLocked()
}

// Advance moves the clock d forward (see Set).
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

func (f *Fake) removeLocked(w *fakeWaiter) bool {
	i := slices.Index(f.waiters, w)
	if i < 0 {
		return false
	}
	f.waiters = slices.Delete(f.waiters, i, i+1)
	return true
}

// Waiters is how many timers are pending and tickers running.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil waits until at least n timers are pending or tickers
// running, or ctx ends.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	return f.waitFor(ctx, func(due []time.Time) bool { return len(due) >= n }, fmt.Sprintf("%d waiters", n))
}

// BlockUntilDue waits until a timer or ticker is due at t, or ctx ends.
func (f *Fake) BlockUntilDue(ctx context.Context, t time.Time) error {
	return f.waitFor(ctx, func(due []time.Time) bool {
		return slices.ContainsFunc(due, t.Equal)
	}, "a waiter due at "+t.Format(time.RFC3339Nano))
}

// waitFor waits until cond holds of the due times of the waiters.
func (f *Fake) waitFor(ctx context.Context, cond func(due []time.Time) bool, what string) error {
	for {
		f.mu.Lock()
		due := make([]time.Time, len(f.waiters))
		for i, w := range f.waiters {
			due[i] = w.due
		}
		changed := f.changed
		f.mu.Unlock()
		if cond(due) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s on the fake clock: %w", what, context.Cause(ctx))
		}
	}
}

func (w *fakeWaiter) C() <-chan time.Time { return w.ch }

// Stop stops the timer or ticker; it reports whether it was pending.
func (w *fakeWaiter) Stop() bool {
	f := w.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.removeLocked(w) {
		return false
	}
	f.notifyLocked()
	return true
}
