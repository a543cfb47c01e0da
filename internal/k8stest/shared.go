package k8stest

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
)

// Shared is a test package's stack, started by the first test that asks
// for it and stopped by Stop, which the package's TestMain calls after
// its tests (or let Run do both). A package holds one in a variable of its
// own: the only state its tests share.
type Shared struct {
	mu    sync.Mutex
	stack *Stack
	dir   string
	err   error
	// keep leaves the stack's directory (its logs) after Stop; it is set
	// when the stack did not start or a test that used it failed.
	keep bool
}

// Get returns the shared stack, starting it on first use (or fails the
// test with why it could not start, the build command if the binaries are
// missing). If the test fails, its log ends with what each process of the
// stack logged during the test.
func (sh *Shared) Get(t testing.TB) *Stack {
	t.Helper()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.stack == nil && sh.err == nil {
		if sh.err = Available(); sh.err != nil {
			t.Fatal(sh.err)
		}
		sh.dir, sh.err = os.MkdirTemp("", "k8stest")
		if sh.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			start := time.Now()
			sh.stack, sh.err = Start(ctx, sh.dir)
			cancel()
			if sh.err == nil {
				t.Logf("started a Kubernetes stack in %s (files in %s)", time.Since(start).Round(time.Millisecond), sh.stack.Dir())
			}
		}
		sh.keep = sh.err != nil
	}
	if errors.Is(sh.err, ErrNotBuilt) {
		t.Fatal(sh.err)
	}
	if sh.err != nil {
		t.Fatalf("starting a Kubernetes stack (files in %s): %v", sh.dir, sh.err)
	}
	s := sh.stack
	from := s.logOffsets()
	t.Cleanup(func() {
		if t.Failed() {
			sh.mu.Lock()
			sh.keep = true
			sh.mu.Unlock()
			t.Logf("the Kubernetes stack's logs during the test (in full under %s):\n%s", s.Dir(), s.logsSince(from, 30))
		}
	})
	return s
}

// Stop stops the shared stack, if it was started, and removes its files,
// unless a test that used it failed.
func (sh *Shared) Stop() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.stack != nil {
		sh.stack.Stop()
		sh.stack = nil
	}
	if sh.dir != "" && !sh.keep {
		_ = os.RemoveAll(sh.dir)
	}
}

// Run runs the package's tests and then stops the stack: a TestMain of
// `os.Exit(stack.Run(m))`.
func (sh *Shared) Run(m *testing.M) int {
	defer sh.Stop()
	return m.Run()
}
