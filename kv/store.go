// Package kv holds the records of the NATS KV buckets (nodes, requests,
// components, leases), stores that read and change them with
// revision-checked updates, watch caches, and leases.
package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/record"
)

// Sentinel errors of the stores (package record's).
var (
	ErrNotFound  = record.ErrNotFound
	ErrConflict  = record.ErrConflict
	ErrExists    = record.ErrExists
	ErrBadRecord = record.ErrBadRecord
	ErrSkip      = record.ErrSkip
)

// Entry is a record with its key and revision.
type Entry[T any] = record.Entry[T]

// Store reads and writes records of one type in one bucket. Every change is
// revision-checked: Update and Delete take the revision the caller read.
type Store[T any] struct {
	kv jetstream.KeyValue
	// keys, if set, is the key pattern (with * and >) of this store's
	// records, for buckets that hold records of several types.
	keys string
	// js, if set, lets List pull the records in large batches instead of
	// watching the bucket.
	js jetstream.JetStream
	// missing, if set, is told the name of the bucket's stream when a
	// call or a cache's watch finds the bucket gone (see Reporting).
	missing func(stream string)
}

// NewStore wraps a bucket.
func NewStore[T any](bucket jetstream.KeyValue) *Store[T] { return &Store[T]{kv: bucket} }

// newStore wraps a bucket of a JetStream context.
func newStore[T any](js jetstream.JetStream, bucket jetstream.KeyValue) *Store[T] {
	return &Store[T]{kv: bucket, js: js}
}

// Filtered returns a store of the records whose keys match a pattern
// ("*.*" for two-token keys): List, Keys and caches see only those.
func (s *Store[T]) Filtered(pattern string) *Store[T] {
	return &Store[T]{kv: s.kv, keys: pattern, js: s.js, missing: s.missing}
}

// Reporting returns the store whose calls, and the watches of its
// caches, tell missing (with the name of the bucket's stream, KV_<bucket>)
// when they find the bucket gone: the process's repair keeper
// (internal/repair) then looks at once instead of at its next look.
func (s *Store[T]) Reporting(missing func(stream string)) *Store[T] {
	c := *s
	c.missing = missing
	return &c
}

// failed is mapErr for the store's calls: an error that may mean the
// bucket is gone is told to missing first.
func (s *Store[T]) failed(err error) error {
	s.noteGone(err)
	return mapErr(err)
}

// noteGone tells missing of an error that may mean the bucket is gone.
func (s *Store[T]) noteGone(err error) {
	if err != nil && s.missing != nil && mayBeGone(err) {
		s.missing("KV_" + s.kv.Bucket())
	}
}

// mayBeGone reports whether an error of a call on a bucket may mean the
// bucket is gone: its stream is not found (a watch's consumer says so
// with the older nats package's error), or no stream took a request.
func mayBeGone(err error) bool {
	return bucketMissing(err) || errors.Is(err, nats.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// watch watches the store's keys.
func (s *Store[T]) watch(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	keys := s.keys
	if keys == "" {
		keys = jetstream.AllKeys
	}
	return s.WatchKeys(ctx, keys, opts...)
}

// watchStart bounds the start of a watch.
const watchStart = 10 * time.Second

// WatchKeys watches the keys matching a pattern until ctx ends or the
// watch is stopped. Starting it is bounded: its consumer is made by a
// request that, sent while the connection was being re-established or its
// server was going away, may never be answered, and the caller would wait
// for ever (the watch itself must live with ctx, which the library also
// uses when it makes the consumer again).
func (s *Store[T]) WatchKeys(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	wctx, cancel := context.WithCancel(ctx)
	type started struct {
		w   jetstream.KeyWatcher
		err error
	}
	ch := make(chan started, 1)
	go func() {
		w, err := s.kv.Watch(wctx, keys, opts...)
		ch <- started{w, err}
	}()
	t := time.NewTimer(watchStart)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			cancel()
			return nil, r.err
		}
		return &stoppingWatcher{KeyWatcher: r.w, cancel: cancel}, nil
	case <-t.C:
	case <-ctx.Done():
	}
	cancel()
	go func() {
		if r := <-ch; r.w != nil {
			_ = r.w.Stop()
		}
	}()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("watching %s: no answer within %s: %w", s.kv.Bucket(), watchStart, context.DeadlineExceeded)
}

// stoppingWatcher ends its context when stopped.
type stoppingWatcher struct {
	jetstream.KeyWatcher
	cancel context.CancelFunc
}

func (w *stoppingWatcher) Stop() error {
	err := w.KeyWatcher.Stop()
	w.cancel()
	return err
}

// Bucket returns the underlying bucket.
func (s *Store[T]) Bucket() jetstream.KeyValue { return s.kv }

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, jetstream.ErrKeyExists):
		return fmt.Errorf("%w: %w", ErrExists, err)
	}
	return err
}

// Decode parses a stored value.
func Decode[T any](key string, data []byte) (T, error) {
	var v T
	if err := record.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("%w: key %q: %w", ErrBadRecord, key, err)
	}
	return v, nil
}

// Get reads a record.
func (s *Store[T]) Get(ctx context.Context, key string) (Entry[T], error) {
	e, err := s.kv.Get(ctx, key)
	if err != nil {
		return Entry[T]{}, fmt.Errorf("reading %s/%s: %w", s.kv.Bucket(), key, s.failed(err))
	}
	v, err := Decode[T](key, e.Value())
	if err != nil {
		return Entry[T]{Key: key, Revision: e.Revision()}, err
	}
	return Entry[T]{Key: key, Value: v, Revision: e.Revision()}, nil
}

// Create writes a new record; ErrExists if the key is there.
func (s *Store[T]) Create(ctx context.Context, key string, v *T) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s/%s: %w", s.kv.Bucket(), key, err)
	}
	rev, err := s.kv.Create(ctx, key, data)
	if err != nil {
		return 0, fmt.Errorf("creating %s/%s: %w", s.kv.Bucket(), key, s.failed(err))
	}
	return rev, nil
}

// CreateNew writes a new record only if the key never held one, or held one
// so long ago that its delete marker was purged: a key that was deleted
// recently counts as existing (ErrExists). It tells a redelivered message
// from a new one when the record it made may have been deleted since.
func (s *Store[T]) CreateNew(ctx context.Context, key string, v *T) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s/%s: %w", s.kv.Bucket(), key, err)
	}
	rev, err := s.kv.Update(ctx, key, data, 0)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("creating %s/%s: %w", s.kv.Bucket(), key, ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("creating %s/%s: %w", s.kv.Bucket(), key, s.failed(err))
	}
	return rev, nil
}

// LastDeletion reports whether a key's last change is its deletion, and
// then when the bucket took it and at which revision (a Create or an
// Update at that revision makes the key live again). A key that never held
// a record, or whose delete marker was purged, is ErrNotFound.
func (s *Store[T]) LastDeletion(ctx context.Context, key string) (deleted bool, at time.Time, rev uint64, err error) {
	h, err := s.kv.History(ctx, key)
	if err != nil {
		return false, time.Time{}, 0, fmt.Errorf("reading the history of %s/%s: %w", s.kv.Bucket(), key, s.failed(err))
	}
	last := h[len(h)-1]
	if last.Operation() == jetstream.KeyValuePut {
		return false, time.Time{}, last.Revision(), nil
	}
	return true, last.Created(), last.Revision(), nil
}

// Update writes a record if it is still at revision rev; ErrConflict if not.
func (s *Store[T]) Update(ctx context.Context, key string, v *T, rev uint64) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s/%s: %w", s.kv.Bucket(), key, err)
	}
	nrev, err := s.kv.Update(ctx, key, data, rev)
	if err != nil {
		return 0, fmt.Errorf("updating %s/%s at revision %d: %w", s.kv.Bucket(), key, rev, s.failed(err))
	}
	return nrev, nil
}

// Delete removes a record if it is still at revision rev.
func (s *Store[T]) Delete(ctx context.Context, key string, rev uint64) error {
	if err := s.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("deleting %s/%s at revision %d: %w", s.kv.Bucket(), key, rev, s.failed(err))
	}
	return nil
}

// Modify reads a record, applies fn and writes it back revision-checked,
// retrying from a fresh read when another writer got there first (with a
// jittered backoff, at most wait.MaxConflicts times: then ErrConflict). fn
// may return ErrSkip to stop without writing (Modify then returns the
// current entry and ErrSkip) or any other error to abort.
func (s *Store[T]) Modify(ctx context.Context, key string, fn func(*T) error) (Entry[T], error) {
	for n := 0; ; n++ {
		if !wait.Sleep(ctx, wait.Conflict(n)) {
			return Entry[T]{Key: key}, ctx.Err()
		}
		e, err := s.Get(ctx, key)
		if err != nil {
			return e, err
		}
		if err := fn(&e.Value); err != nil {
			return e, err
		}
		rev, err := s.Update(ctx, key, &e.Value, e.Revision)
		if errors.Is(err, ErrConflict) {
			if ctx.Err() != nil {
				return e, ctx.Err()
			}
			if n+1 >= wait.MaxConflicts {
				return e, fmt.Errorf("gave up after %d conflicting writes: %w", n+1, err)
			}
			continue
		}
		if err != nil {
			return e, err
		}
		e.Revision = rev
		return e, nil
	}
}

// Upsert writes a record whether or not it exists: fn gets the current one
// (found false, and a zero value, if there is none, or it is not a valid
// record) and fills in what to write. A writer that got there first, or
// the key expiring in between, makes Upsert read and try again (as Modify
// does, at most wait.MaxConflicts times).
func (s *Store[T]) Upsert(ctx context.Context, key string, fn func(cur *T, found bool)) (Entry[T], error) {
	for n := 0; ; n++ {
		if !wait.Sleep(ctx, wait.Conflict(n)) {
			return Entry[T]{Key: key}, ctx.Err()
		}
		e, err := s.Get(ctx, key)
		found := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBadRecord) {
			return e, err
		}
		if !found {
			e.Value = *new(T)
		}
		fn(&e.Value, found)
		var rev uint64
		if errors.Is(err, ErrNotFound) {
			rev, err = s.Create(ctx, key, &e.Value)
		} else {
			rev, err = s.Update(ctx, key, &e.Value, e.Revision)
		}
		if errors.Is(err, ErrExists) || errors.Is(err, ErrConflict) {
			if ctx.Err() != nil {
				return e, ctx.Err()
			}
			if n+1 >= wait.MaxConflicts {
				return e, fmt.Errorf("gave up after %d conflicting writes: %w", n+1, err)
			}
			continue
		}
		if err != nil {
			return e, err
		}
		return Entry[T]{Key: key, Value: e.Value, Revision: rev}, nil
	}
}

// Keys lists the keys of the bucket.
func (s *Store[T]) Keys(ctx context.Context) ([]string, error) {
	var lister jetstream.KeyLister
	var err error
	if s.keys != "" {
		lister, err = s.kv.ListKeysFiltered(ctx, s.keys)
	} else {
		lister, err = s.kv.ListKeys(ctx)
	}
	if err != nil {
		s.noteGone(err)
		return nil, fmt.Errorf("listing %s: %w", s.kv.Bucket(), err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}
