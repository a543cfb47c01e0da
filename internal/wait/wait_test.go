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
