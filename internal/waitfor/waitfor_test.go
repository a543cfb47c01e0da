package waitfor_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// run runs fn on a goroutine of its own, as a test's, and returns what it
// failed with ("" if nothing).
func run(t *testing.T, fn func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// sub is a subscription that counts its drains.
type sub struct {
	c      chan struct{}
	drains atomic.Int32
}

func (s *sub) C() <-chan struct{} { return s.c }
func (s *sub) Drain() []int       { s.drains.Add(1); return nil }

// signalled is a condition that holds once set is called, and a channel
// that set signals, after a moment.
func signalled() (cond func() bool, ch chan struct{}) {
	var held atomic.Bool
	ch = make(chan struct{}, 1)
	go func() {
		time.Sleep(20 * time.Millisecond) // the change comes after the first check
		held.Store(true)
		ch <- struct{}{}
	}()
	return held.Load, ch
}

func TestWaits(t *testing.T) {
	t.Parallel()
	var checks atomic.Int32
	counting := func(holdsAt int32) func() bool {
		checks.Store(0)
		return func() bool { return checks.Add(1) >= holdsAt }
	}
	for _, c := range []struct {
		name string
		fn   func(tb testing.TB)
		// want is the failure message ("": none); wantChecks, if not 0,
		// the checks of a counting condition.
		want       string
		wantChecks int32
	}{
		{name: "holds at once: one check", wantChecks: 1, fn: func(tb testing.TB) {
			waitfor.Until(tb, time.Minute, "x", counting(1))
		}},
		{name: "polled until it holds", wantChecks: 3, fn: func(tb testing.TB) {
			waitfor.Until(tb, time.Minute, "x", counting(3), waitfor.Every(time.Millisecond))
		}},
		{name: "never holds: fails naming what, with the details", want: "timed out after 50ms waiting for the thing\nstate: a\nmore", fn: func(tb testing.TB) {
			waitfor.Until(tb, 50*time.Millisecond, "the thing", func() bool { return false }, waitfor.Every(time.Millisecond),
				waitfor.Detail(func() string { return "state: a\n" }), waitfor.Detail(func() string { return "more" }))
		}},
		{name: "woken by a channel long before the poll", fn: func(tb testing.TB) {
			cond, ch := signalled()
			waitfor.Until(tb, 30*time.Second, "the signal", cond, waitfor.Every(time.Hour), waitfor.Wake(nil, ch))
		}},
		{name: "woken by the channel of a WakeFunc, closed on a change", fn: func(tb testing.TB) {
			var mu sync.Mutex
			changed, held := make(chan struct{}), false
			go func() {
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				held = true
				close(changed)
				changed = make(chan struct{})
				mu.Unlock()
			}()
			waitfor.Until(tb, 30*time.Second, "the change", func() bool { mu.Lock(); defer mu.Unlock(); return held }, waitfor.Every(time.Hour),
				waitfor.WakeFunc(func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return changed }))
		}},
		{name: "Changes wakes on the subscription and drains it before each check", wantChecks: 2, fn: func(tb testing.TB) {
			s := &sub{c: make(chan struct{}, 1)}
			checks.Store(0)
			waitfor.Until(tb, 30*time.Second, "the change", func() bool {
				n := checks.Add(1)
				if s.drains.Load() != n {
					tb.Fatalf("check %d after %d drains", n, s.drains.Load())
				}
				if n == 1 {
					s.c <- struct{}{}
				}
				return n == 2
			}, waitfor.Every(time.Hour), waitfor.Changes(s))
		}},
		{name: "Before runs before every check", fn: func(tb testing.TB) {
			var before, checked int
			waitfor.Until(tb, time.Minute, "x", func() bool {
				checked++
				if before != checked {
					tb.Fatalf("check %d after %d Before calls", checked, before)
				}
				return checked == 3
			}, waitfor.Every(time.Millisecond), waitfor.Before(func() { before++ }))
		}},
		{name: "UntilErr goes on after an error", wantChecks: 3, fn: func(tb testing.TB) {
			checks.Store(0)
			waitfor.UntilErr(tb, time.Minute, "x", func(ctx context.Context) (bool, error) {
				if checks.Add(1) < 3 {
					return false, errors.New("not yet")
				}
				return true, nil
			}, waitfor.Every(time.Millisecond))
		}},
		{name: "UntilErr reports the last error", want: "timed out after 50ms waiting for the server (last error: refused 2)\nlast answer", fn: func(tb testing.TB) {
			n := 0
			waitfor.UntilErr(tb, 50*time.Millisecond, "the server", func(ctx context.Context) (bool, error) {
				n++
				if n <= 2 {
					return false, fmt.Errorf("refused %d", n)
				}
				return false, nil
			}, waitfor.Every(time.Millisecond), waitfor.Detail(func() string { return "last answer" }))
		}},
		{name: "UntilErr's context ends at the deadline", want: "timed out after 50ms waiting for a call (last error: context deadline exceeded)", fn: func(tb testing.TB) {
			waitfor.UntilErr(tb, 50*time.Millisecond, "a call", func(ctx context.Context) (bool, error) {
				<-ctx.Done()
				return false, ctx.Err()
			})
		}},
		{name: "True: held", fn: func(tb testing.TB) {
			if !waitfor.True(time.Minute, counting(2), waitfor.Every(time.Millisecond)) {
				tb.Fatalf("True did not see the condition hold")
			}
		}, wantChecks: 2},
		{name: "True: timed out, without failing", fn: func(tb testing.TB) {
			start := time.Now()
			if waitfor.True(50*time.Millisecond, func() bool { return false }) {
				tb.Fatalf("True on a condition that never holds")
			}
			if d := time.Since(start); d < 50*time.Millisecond {
				tb.Fatalf("True gave up after %s, before its timeout", d)
			}
		}},
	} {
		// One at a time: the cases share the check counter.
		got := run(t, c.fn)
		if got != c.want {
			t.Errorf("%s: failed with %q, want %q", c.name, got, c.want)
		}
		if c.wantChecks != 0 && checks.Load() != c.wantChecks {
			t.Errorf("%s: %d checks, want %d", c.name, checks.Load(), c.wantChecks)
		}
	}
}

// A deadline that passed while the condition was being checked ends the
// wait even when a change is waiting too: no check after the deadline.
func TestNoCheckAfterTheDeadline(t *testing.T) {
	t.Parallel()
	ch := make(chan struct{}, 1)
	checks := 0
	got := run(t, func(tb testing.TB) {
		waitfor.Until(tb, 10*time.Millisecond, "x", func() bool {
			checks++
			time.Sleep(30 * time.Millisecond)
			ch <- struct{}{}
			return false
		}, waitfor.Wake(ch))
	})
	if checks != 1 || !strings.HasPrefix(got, "timed out after 10ms waiting for x") {
		t.Errorf("%d checks, failed with %q; want 1 check and a time-out", checks, got)
	}
}
