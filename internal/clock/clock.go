// Package clock is the time the project's timed logic goes by: leases,
// fencing, the cleanup's sweeps and the ages they compare. Code takes a
// Clock instead of calling time.Now, time.After or time.NewTicker, so that
// its tests can run on a Fake, which moves only when the test moves it.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers and tickers that go by it.
type Clock interface {
	Now() time.Time
	// Since is the time elapsed since t: Now().Sub(t).
	Since(t time.Time) time.Duration
	// After sends the time on the channel once d has passed.
	After(d time.Duration) <-chan time.Time
	// NewTimer makes a timer that fires once d has passed.
	NewTimer(d time.Duration) Timer
	// NewTicker makes a ticker that fires every d (d > 0); ticks a slow
	// reader misses are dropped, as time.Ticker's.
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop stops the timer; it reports whether the timer was still
	// pending.
	Stop() bool
}

// Ticker is a time.Ticker of a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the clock of the time package.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) Since(t time.Time) time.Duration        { return time.Since(t) }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (realClock) NewTimer(d time.Duration) Timer         { return realTimer{time.NewTimer(d)} }
func (realClock) NewTicker(d time.Duration) Ticker       { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Sleep waits d on c, or until ctx ends; it reports whether to go on.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
