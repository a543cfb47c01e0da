// Package waitfor is the tests' one way to wait, with a deadline, until a
// condition holds: it checks the condition, then again whenever a channel
// it was given signals a change (a cache's subscription, a process's
// "more output"), and at the latest every poll interval, for what no
// channel announces; at the deadline it fails the test naming what it
// waited for, with whatever the caller adds to describe the state then.
//
// Only tests import it (from _test.go files): it is in no binary.
package waitfor

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// DefaultEvery is the poll interval when no Every option is given: the
// latest a condition is checked again when no channel signals.
const DefaultEvery = 20 * time.Millisecond

// Option changes how a wait checks its condition and what its failure
// says.
type Option func(*waiter)

type waiter struct {
	every  time.Duration
	wake   []<-chan struct{}
	wakeFn []func() <-chan struct{}
	before []func()
	detail []func() string
}

// Every sets the poll interval: the condition is checked again at the
// latest d after the last check (d <= 0: DefaultEvery).
func Every(d time.Duration) Option {
	return func(w *waiter) {
		if d > 0 {
			w.every = d
		}
	}
}

// Wake checks the condition again as soon as any of the channels
// receives (nil channels are left out). A closed channel would wake the
// wait at once, every time: give only channels that signal.
func Wake(chs ...<-chan struct{}) Option {
	return func(w *waiter) {
		for _, ch := range chs {
			if ch != nil {
				w.wake = append(w.wake, ch)
			}
		}
	}
}

// WakeFunc is Wake for a channel that changes: fn is called before each
// check, and the wait after that check ends early when the channel it
// returned receives or is closed (as a channel closed and replaced on
// every change is).
func WakeFunc(fn func() <-chan struct{}) Option {
	return func(w *waiter) { w.wakeFn = append(w.wakeFn, fn) }
}

// Before calls fn before each check of the condition (to drain what woke
// the wait, say).
func Before(fn func()) Option {
	return func(w *waiter) { w.before = append(w.before, fn) }
}

// Subscription is a queue of changes whose channel signals that Drain
// has some, as a kv.Cache's subscription is.
type Subscription[E any] interface {
	C() <-chan struct{}
	Drain() []E
}

// Changes wakes the wait on every change s queues, and drains s before
// each check (its changes are dropped: the condition looks at the state).
func Changes[E any](s Subscription[E]) Option {
	return func(w *waiter) {
		Wake(s.C())(w)
		Before(func() { s.Drain() })(w)
	}
}

// Detail adds fn's text, on a line of its own, to the failure message
// of Until or UntilErr (a dump of the records, the last answer seen); fn
// is called only when the wait failed.
func Detail(fn func() string) Option {
	return func(w *waiter) { w.detail = append(w.detail, fn) }
}

// True waits until cond holds or timeout passes, and reports whether it
// held. It never fails a test: for goroutines other than the test's, and
// for a caller that reports the failure itself.
func True(timeout time.Duration, cond func() bool, opts ...Option) bool {
	return newWaiter(opts).wait(timeout, cond)
}

// Until waits until cond holds; after timeout it fails the test with
// "timed out after <timeout> waiting for <what>" and the Detail texts.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool, opts ...Option) {
	t.Helper()
	w := newWaiter(opts)
	if !w.wait(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s%s", timeout, what, w.details())
	}
}

// UntilErr is Until for a condition that may fail on the way (a call to
// a server that is not up yet): an error is not the end, cond is checked
// again, and the failure message reports the last error. cond's context
// ends at the deadline (or with the test).
func UntilErr(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error), opts ...Option) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	w := newWaiter(opts)
	var last error
	ok := w.wait(timeout, func() bool {
		done, err := cond(ctx)
		if err != nil {
			last = err
		}
		return done
	})
	if !ok {
		t.Fatalf("timed out after %s waiting for %s (last error: %v)%s", timeout, what, last, w.details())
	}
}

func newWaiter(opts []Option) *waiter {
	w := &waiter{every: DefaultEvery}
	for _, o := range opts {
		o(w)
	}
	return w
}

func (w *waiter) details() string {
	var b strings.Builder
	for _, d := range w.detail {
		fmt.Fprintf(&b, "\n%s", strings.TrimSuffix(d(), "\n"))
	}
	return b.String()
}

// wait checks cond until it holds (true) or timeout passed (false).
func (w *waiter) wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTimer(w.every)
	defer poll.Stop()
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(poll.C)},
	}
	for _, ch := range w.wake {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	fixed := len(cases)
	for {
		for _, b := range w.before {
			b()
		}
		cases = cases[:fixed]
		for _, fn := range w.wakeFn {
			if ch := fn(); ch != nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
			}
		}
		if cond() {
			return true
		}
		// A deadline that passed during the check ends the wait, even
		// when a change came too.
		select {
		case <-deadline.C:
			return false
		default:
		}
		poll.Reset(w.every)
		if chosen, _, _ := reflect.Select(cases); chosen == 0 {
			return false
		}
	}
}
