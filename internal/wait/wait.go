// Package wait holds the two small timing helpers every worker loop uses:
// a sleep that ends with its context, and the backoff of a failing call.
package wait

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends; it reports whether to go on.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Backoff is the wait before retry number n (from 0) of a failing call:
// 100 ms doubling, at most 30 s.
func Backoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 8)
	return min(d, 30*time.Second)
}
