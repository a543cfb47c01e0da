// Package logtest records what a process logs, for tests that wait for a
// log line (with a deadline) instead of sleeping.
package logtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Recorder is a slog.Handler that keeps every line (at any level), as
// "LEVEL message key=value ...".
type Recorder struct {
	shared *lines
	attrs  []slog.Attr
	group  string
}

type lines struct {
	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed and replaced on each new line
	tee   slog.Handler  // NODEPOOL_TEST_LOG: also to stderr
}

// New returns a logger that records into the returned Recorder (and, with
// NODEPOOL_TEST_LOG set, also writes to stderr).
func New(t testing.TB) (*slog.Logger, *Recorder) {
	l := &lines{more: make(chan struct{})}
	if os.Getenv("NODEPOOL_TEST_LOG") != "" {
		l.tee = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}).WithAttrs([]slog.Attr{slog.String("test", t.Name())})
	}
	r := &Recorder{shared: l}
	return slog.New(r), r
}

// Enabled records every level.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle records a line.
func (r *Recorder) Handle(ctx context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String())
	b.WriteString(" ")
	b.WriteString(rec.Message)
	write := func(a slog.Attr) {
		key := a.Key
		if r.group != "" {
			key = r.group + "." + key
		}
		fmt.Fprintf(&b, " %s=%v", key, a.Value.Any())
	}
	for _, a := range r.attrs {
		write(a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		write(a)
		return true
	})
	l := r.shared
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	close(l.more)
	l.more = make(chan struct{})
	tee := l.tee
	l.mu.Unlock()
	if tee != nil {
		h := tee.WithAttrs(r.attrs)
		if r.group != "" {
			h = h.WithGroup(r.group)
		}
		return h.Handle(ctx, rec)
	}
	return nil
}

// WithAttrs adds attributes to every line.
func (r *Recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Recorder{shared: r.shared, attrs: append(r.attrs[:len(r.attrs):len(r.attrs)], attrs...), group: r.group}
}

// WithGroup prefixes the keys of later attributes.
func (r *Recorder) WithGroup(name string) slog.Handler {
	return &Recorder{shared: r.shared, attrs: r.attrs, group: name}
}

// Lines returns the lines that contain every one of parts.
func (r *Recorder) Lines(parts ...string) []string {
	l := r.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if containsAll(line, parts) {
			out = append(out, line)
		}
	}
	return out
}

func containsAll(line string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(line, p) {
			return false
		}
	}
	return true
}

// Wait waits until a line contains every one of parts, and returns it; the
// test fails at the deadline, showing the lines recorded.
func (r *Recorder) Wait(t testing.TB, timeout time.Duration, parts ...string) string {
	t.Helper()
	lines := r.WaitCount(t, timeout, 1, parts...)
	return lines[0]
}

// WaitCount waits until n lines contain every one of parts, and returns
// them; the test fails at the deadline, showing the lines recorded.
func (r *Recorder) WaitCount(t testing.TB, timeout time.Duration, n int, parts ...string) []string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	l := r.shared
	for {
		l.mu.Lock()
		more := l.more
		l.mu.Unlock()
		if found := r.Lines(parts...); len(found) >= n {
			return found
		}
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("fewer than %d log lines with %q within %s; the log:\n%s", n, parts, timeout, r.String())
			return nil
		}
	}
}

// String is every line recorded.
func (r *Recorder) String() string {
	l := r.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
