// Package wait holds the small timing helpers every worker loop uses: a
// sleep that ends with its context, the backoff of a failing call, and the
// jittered, capped backoff of a write that lost a revision check.
package wait

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nodepool-nats/nodepool/internal/clock"
)

// Sleep waits d or until ctx ends; it reports whether to go on.
func Sleep(ctx context.Context, d time.Duration) bool { return clock.Sleep(ctx, clock.Real(), d) }

// Backoff is the wait before retry number n (from 0) of a failing call:
// 100 ms doubling, at most 30 s.
func Backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 8)
	return min(d, 30*time.Second)
}

// MaxConflicts bounds the retries of a revision-checked write that another
// writer keeps getting to first: past it, the write gives up with the
// conflict error (the next change or sweep brings the record back).
const MaxConflicts = 50

// Conflict is the wait before retry number n (from 0) of a write that lost
// a revision check to another writer: none for the first retry (a fresh
// read usually settles it), then a random wait of up to 1 ms doubling to
// 100 ms ("full jitter"), so that writers that collided do not collide
// again in step.
func Conflict(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := min(time.Millisecond<<min(n-1, 10), 100*time.Millisecond)
	return time.Duration(rand.Int64N(int64(d))) + 1
}

// Repeats paces something that may keep being needed again, such as
// making again a stream or consumer that an operator keeps deleting: the
// first time it is done at once; needed again within RepeatWindow of the
// last time, it waits 1 s, then 2 s, doubling up to RepeatWindow. A
// RepeatWindow without it starts the count again. The zero value is ready.
type Repeats struct {
	n    int
	last time.Time
}

// RepeatWindow is how long Repeats remembers the last time.
const RepeatWindow = time.Minute

// Next counts one more time at now and returns how long to wait before
// doing it.
func (r *Repeats) Next(now time.Time) time.Duration {
	if r.last.IsZero() || now.Sub(r.last) > RepeatWindow {
		r.n = 0
	}
	r.n++
	r.last = now
	if r.n == 1 {
		return 0
	}
	d := min(time.Second<<min(r.n-2, 6), RepeatWindow)
	r.last = now.Add(d) // it happens then
	return d
}
