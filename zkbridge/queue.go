package zkbridge

import (
	"context"
	"sync"
	"time"
)

// queue holds the keys of records to reconcile, each at most once: a key
// added while it waits is not added twice, and a key added while a worker
// reconciles it is reconciled again after. So any number of workers work
// on different keys, and every change is looked at after it happened.
type queue struct {
	mu      sync.Mutex
	waiting []string
	queued  map[string]bool
	active  map[string]bool
	again   map[string]bool
	signal  chan struct{}
	timers  map[string]*time.Timer
	stopped bool
}

func newQueue() *queue {
	return &queue{queued: map[string]bool{}, active: map[string]bool{}, again: map[string]bool{},
		signal: make(chan struct{}, 1), timers: map[string]*time.Timer{}}
}

// add queues a key.
func (q *queue) add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key)
}

func (q *queue) addLocked(key string) {
	switch {
	case q.stopped, q.queued[key]:
	case q.active[key]:
		q.again[key] = true
	default:
		q.queued[key] = true
		q.waiting = append(q.waiting, key)
		select {
		case q.signal <- struct{}{}:
		default:
		}
	}
}

// addAfter queues a key after d (a retry); an earlier pending retry of
// the key stands.
func (q *queue) addAfter(key string, d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped || q.timers[key] != nil {
		return
	}
	q.timers[key] = time.AfterFunc(d, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.timers, key)
		q.addLocked(key)
	})
}

// get takes the next key, waiting for one until ctx ends.
func (q *queue) get(ctx context.Context) (string, bool) {
	for {
		q.mu.Lock()
		if len(q.waiting) > 0 {
			key := q.waiting[0]
			q.waiting[0] = ""
			q.waiting = q.waiting[1:]
			delete(q.queued, key)
			q.active[key] = true
			if len(q.waiting) > 0 {
				select {
				case q.signal <- struct{}{}:
				default:
				}
			}
			q.mu.Unlock()
			return key, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-q.signal:
		}
	}
}

// done ends the work on a key; if it was added meanwhile, it is queued
// again.
func (q *queue) done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.active, key)
	if q.again[key] {
		delete(q.again, key)
		q.addLocked(key)
	}
}

// stop drops every waiting key and pending retry.
func (q *queue) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	for _, t := range q.timers {
		t.Stop()
	}
	q.timers = map[string]*time.Timer{}
	q.waiting = nil
	q.queued = map[string]bool{}
}
