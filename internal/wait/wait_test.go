package wait

import (
	"context"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, 100 * time.Millisecond}, {1, 200 * time.Millisecond}, {3, 800 * time.Millisecond}, {8, 25600 * time.Millisecond}, {9, 25600 * time.Millisecond}, {100, 25600 * time.Millisecond}} {
		if got := Backoff(c.n); got != c.want {
			t.Errorf("Backoff(%d) = %s, want %s", c.n, got, c.want)
		}
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep went on after its context ended")
	}
	if !Sleep(context.Background(), 0) {
		t.Error("Sleep(0) should go on")
	}
}

func TestConflictIsJitteredAndCapped(t *testing.T) {
	if Conflict(0) != 0 {
		t.Error("the first retry after a conflict waits")
	}
	for n := 1; n < 40; n++ {
		for range 50 {
			if d := Conflict(n); d <= 0 || d > 100*time.Millisecond+1 || d > time.Millisecond<<min(n-1, 10)+1 {
				t.Fatalf("Conflict(%d) = %s", n, d)
			}
		}
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[Conflict(8)] = true
	}
	if len(seen) < 5 {
		t.Errorf("Conflict(8) is hardly random: %v", seen)
	}
}

func TestRepeatsBackOffAndForget(t *testing.T) {
	var r Repeats
	now := time.Unix(1000, 0)
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		d := r.Next(now)
		if d != w {
			t.Fatalf("time %d: wait %s, want %s", i+1, d, w)
		}
		now = now.Add(d + time.Second)
	}
	if d := r.Next(now.Add(RepeatWindow + time.Second)); d != 0 {
		t.Errorf("after a quiet window: wait %s, want none", d)
	}
}
