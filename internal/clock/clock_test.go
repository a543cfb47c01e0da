package clock

import (
	"context"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func fired(c <-chan time.Time) (time.Time, bool) {
	select {
	case t := <-c:
		return t, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimers(t *testing.T) {
	f := NewFake(t0)
	a := f.After(time.Second)
	b := f.NewTimer(2 * time.Second)
	stopped := f.NewTimer(time.Second)
	if _, ok := fired(f.After(0)); !ok {
		t.Error("After(0) did not fire at once")
	}
	if n := f.Waiters(); n != 3 {
		t.Fatalf("%d waiters, want 3", n)
	}
	if !stopped.Stop() || stopped.Stop() {
		t.Error("Stop of a pending timer: want true, then false")
	}
	f.Advance(time.Second - 1)
	if _, ok := fired(a); ok {
		t.Error("a timer fired before its time")
	}
	f.Advance(1)
	if at, ok := fired(a); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Errorf("timer of 1s: fired %v at %s", ok, at)
	}
	if _, ok := fired(stopped.C()); ok {
		t.Error("a stopped timer fired")
	}
	f.Set(t0.Add(time.Hour))
	if at, ok := fired(b.C()); !ok || !at.Equal(t0.Add(time.Hour)) {
		t.Errorf("timer of 2s after a jump of an hour: fired %v at %s", ok, at)
	}
	if b.Stop() || f.Waiters() != 0 {
		t.Errorf("a fired timer is still pending (%d waiters)", f.Waiters())
	}
	if got := f.Since(t0); got != time.Hour {
		t.Errorf("Since = %s", got)
	}
}

func TestFakeTicker(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(time.Second)
	f.Advance(500 * time.Millisecond)
	if _, ok := fired(tk.C()); ok {
		t.Error("ticked early")
	}
	f.Advance(500 * time.Millisecond)
	if _, ok := fired(tk.C()); !ok {
		t.Error("no tick at 1s")
	}
	// Missed ticks are dropped: one tick for a jump over many periods,
	// and the next one period after the last passed.
	f.Advance(10*time.Second + 100*time.Millisecond)
	if _, ok := fired(tk.C()); !ok {
		t.Error("no tick after a jump")
	}
	if _, ok := fired(tk.C()); ok {
		t.Error("more than one tick after a jump")
	}
	f.Advance(800 * time.Millisecond)
	if _, ok := fired(tk.C()); ok {
		t.Error("ticked before 12s")
	}
	f.Advance(100 * time.Millisecond)
	if _, ok := fired(tk.C()); !ok {
		t.Error("no tick at 12s")
	}
	tk.Stop()
	f.Advance(time.Minute)
	if _, ok := fired(tk.C()); ok || f.Waiters() != 0 {
		t.Error("a stopped ticker ticked")
	}
}

func TestFakeBlockUntil(t *testing.T) {
	f := NewFake(t0)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	slept := make(chan bool)
	go func() { slept <- Sleep(ctx, f, time.Minute) }()
	if err := f.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := f.BlockUntilDue(ctx, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	f.Advance(time.Minute)
	if !<-slept {
		t.Error("Sleep did not go on")
	}
	short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	defer stop()
	if err := f.BlockUntil(short, 1); err == nil {
		t.Error("BlockUntil returned with no waiter")
	}
	done, end := context.WithCancel(ctx)
	end()
	if Sleep(done, f, time.Minute) {
		t.Error("Sleep went on after its context ended")
	}
	if f.Waiters() != 0 {
		t.Errorf("Sleep left %d waiters", f.Waiters())
	}
}

func TestReal(t *testing.T) {
	c := Real()
	start := c.Now()
	if !Sleep(t.Context(), c, time.Millisecond) || c.Since(start) < time.Millisecond {
		t.Error("Sleep on the real clock")
	}
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	<-c.After(time.Millisecond)
	if tm := c.NewTimer(time.Hour); !tm.Stop() {
		t.Error("Stop of a pending real timer")
	}
}
