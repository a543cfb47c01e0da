package kv

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseWatch is one watch of the locks bucket for every lease of a
// process: it tells the leases waiting to be elected when their key is
// deleted or expires, so that they try at once instead of at their next
// poll. Without it each lease watches its own key (a consumer on the
// server per lease); with it a process has one, however many pools and
// providers it serves. The watch runs while any lease listens.
//
// The watch only speeds an election up: a lease polls its key anyway
// (Elect), so a watch that fails is started again after a second and
// nothing is lost meanwhile.
type LeaseWatch struct {
	store *Store[LeaseRecord]
	keys  string // the keys watched: all of them (">"), or one lease's
	log   *slog.Logger

	mu     sync.Mutex
	subs   map[string]map[chan struct{}]struct{}
	n      int
	cancel context.CancelFunc
	done   chan struct{}
}

// NewLeaseWatch prepares the watch of a locks bucket.
func NewLeaseWatch(store *Store[LeaseRecord], log *slog.Logger) *LeaseWatch {
	return newLeaseWatch(store, ">", log.With("bucket", store.kv.Bucket()))
}

// newLeaseWatch watches only the keys keys matches (a lease of its own).
func newLeaseWatch(store *Store[LeaseRecord], keys string, log *slog.Logger) *LeaseWatch {
	return &LeaseWatch{store: store, keys: keys, log: log, subs: map[string]map[chan struct{}]struct{}{}}
}

// leaseWatchRetry is how long a failed watch waits before it starts again.
const leaseWatchRetry = time.Second

// Subscribe returns a channel told (without blocking: it may merge
// several) when key is deleted or expires, and the function that ends
// the subscription. The first subscription starts the watch; the last
// one's end stops it.
func (w *LeaseWatch) Subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs[key] == nil {
		w.subs[key] = map[chan struct{}]struct{}{}
	}
	w.subs[key][ch] = struct{}{}
	w.n++
	if w.n == 1 {
		ctx, cancel := context.WithCancel(context.Background())
		w.cancel, w.done = cancel, make(chan struct{})
		go w.run(ctx, w.done)
	}
	var once sync.Once
	return ch, func() { once.Do(func() { w.unsubscribe(key, ch) }) }
}

func (w *LeaseWatch) unsubscribe(key string, ch chan struct{}) {
	w.mu.Lock()
	delete(w.subs[key], ch)
	if len(w.subs[key]) == 0 {
		delete(w.subs, key)
	}
	w.n--
	var cancel context.CancelFunc
	var done chan struct{}
	if w.n == 0 {
		cancel, done = w.cancel, w.done
		w.cancel, w.done = nil, nil
	}
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// run watches the bucket until ctx ends, starting the watch again when it
// fails.
func (w *LeaseWatch) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		kw, err := w.store.WatchKeys(ctx, w.keys, jetstream.UpdatesOnly())
		if err == nil {
			w.follow(ctx, kw)
			_ = kw.Stop()
		} else if ctx.Err() == nil {
			w.log.Debug("cannot watch the leases; they poll until the watch is back", "err", err)
		}
		t := time.NewTimer(leaseWatchRetry)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// follow tells the subscribers of each key deleted or expired, until the
// watch ends or ctx does.
func (w *LeaseWatch) follow(ctx context.Context, kw jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-kw.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() == jetstream.KeyValuePut {
				continue
			}
			w.mu.Lock()
			for ch := range w.subs[e.Key()] {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
		}
	}
}
