package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Lease is a key of the nodepool-locks bucket held by one process. The
// bucket's TTL removes it when its holder stops renewing it; renewals are
// revision-checked updates, so two processes can never both believe they
// hold it for longer than one renewal interval.
type Lease struct {
	store  *Store[LeaseRecord]
	key    string
	holder string
	ttl    time.Duration
	rev    uint64
	since  time.Time
	// sent is when the last write that held the lease (taking or
	// renewing it) was sent.
	sent time.Time
	log  *slog.Logger
}

// NewLease prepares a lease on key for holder; ttl must be the bucket's TTL.
func NewLease(store *Store[LeaseRecord], key, holder string, ttl time.Duration, log *slog.Logger) *Lease {
	return &Lease{store: store, key: key, holder: holder, ttl: ttl, log: log.With("lease", key)}
}

// Key is the lease's key.
func (l *Lease) Key() string { return l.key }

// TryAcquire takes the lease if nobody holds it, or if this holder held it
// before (a restarted process with the same id). It reports whether the lease
// is now held.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	sent := time.Now()
	now := sent.UTC()
	e, err := l.store.Get(ctx, l.key)
	switch {
	case errors.Is(err, ErrNotFound):
		rev, err := l.store.Create(ctx, l.key, &LeaseRecord{Holder: l.holder, Acquired: now, Renewed: now})
		if errors.Is(err, ErrExists) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		l.rev, l.since, l.sent = rev, now, sent
		return true, nil
	case err != nil && !errors.Is(err, ErrBadRecord):
		return false, err
	case err == nil && e.Value.Holder != l.holder:
		return false, nil
	}
	// Ours from a previous life, or garbage: take it over.
	rev, err := l.store.Update(ctx, l.key, &LeaseRecord{Holder: l.holder, Acquired: now, Renewed: now}, e.Revision)
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.rev, l.since, l.sent = rev, now, sent
	return true, nil
}

// Renew extends a held lease. An ErrConflict or ErrNotFound means it was lost.
//
// A key that is missing although the holder wrote it less than a TTL ago
// did not expire: it was deleted (by an operator, or with its bucket,
// which is then made again, see internal/repair). If nobody took the lease
// meanwhile, the holder writes it again and goes on holding it; if
// somebody did, it is lost.
func (l *Lease) Renew(ctx context.Context) error {
	sent := time.Now()
	now := sent.UTC()
	rec := &LeaseRecord{Holder: l.holder, Acquired: l.since, Renewed: now}
	rev, err := l.store.Update(ctx, l.key, rec, l.rev)
	if errors.Is(err, ErrConflict) {
		// A renewal whose answer did not come in time (a loaded cluster)
		// may have landed all the same: the lease is still this
		// holder's, from this acquisition, if the record says so.
		e, gerr := l.store.Get(ctx, l.key)
		switch {
		case gerr == nil && e.Value.Holder == l.holder && e.Value.Acquired.Equal(l.since):
			rev, err = l.store.Update(ctx, l.key, rec, e.Revision)
		case errors.Is(gerr, ErrNotFound) && sent.Sub(l.sent) < l.ttl:
			rev, err = l.store.Create(ctx, l.key, rec)
			switch {
			case err == nil:
				l.log.Warn("the lease's key was deleted while held; written again")
			case errors.Is(err, ErrExists):
				err = fmt.Errorf("%w: the lease's key was deleted and taken by another holder", ErrConflict)
			}
		}
	}
	if err != nil {
		return err
	}
	l.rev, l.sent = rev, sent
	return nil
}

// Release gives a held lease up at once, so another process need not wait
// for the TTL.
func (l *Lease) Release(ctx context.Context) error {
	return l.store.Delete(ctx, l.key, l.rev)
}

// Elect runs fn whenever this process holds the lease, and cancels fn's
// context as soon as the lease may be lost. It returns when ctx ends, after
// fn returned and the lease was released.
func (l *Lease) Elect(ctx context.Context, fn func(ctx context.Context)) {
	changed := l.watchKey(ctx)
	interval := l.ttl / 3
	for ctx.Err() == nil {
		held, err := l.TryAcquire(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("could not take lease", "err", err)
		}
		if !held {
			select {
			case <-ctx.Done():
			case <-changed:
			case <-time.After(interval):
			}
			continue
		}
		l.log.Debug("lease taken")
		l.hold(ctx, fn)
	}
}

// hold runs fn while renewing the lease.
func (l *Lease) hold(ctx context.Context, fn func(ctx context.Context)) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(lctx)
	}()
	interval := l.ttl / 3
	lastRenew := time.Now()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-done:
			break loop
		case <-ticker.C:
			rctx, rcancel := context.WithTimeout(ctx, interval)
			err := l.Renew(rctx)
			rcancel()
			if err == nil {
				lastRenew = time.Now()
				continue
			}
			if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
				l.log.Warn("lease lost", "err", err)
				cancel()
				<-done
				return
			}
			// A passing error: keep going while the lease surely still
			// lives, and step down before it may expire.
			if time.Since(lastRenew) > l.ttl-interval {
				l.log.Warn("lease could not be renewed in time; stepping down", "err", err)
				cancel()
				<-done
				return
			}
		}
	}
	cancel()
	<-done
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer rcancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
		l.log.Debug("could not release lease", "err", err)
	}
}

// watchKey signals when the lease key is deleted or expires, so a waiting
// process can try at once instead of at its next poll.
func (l *Lease) watchKey(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	w, err := l.store.WatchKeys(ctx, l.key, jetstream.UpdatesOnly())
	if err != nil {
		l.log.Debug("cannot watch lease key; polling only", "err", err)
		return ch
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil && e.Operation() != jetstream.KeyValuePut {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return ch
}

// String describes the lease.
func (l *Lease) String() string { return fmt.Sprintf("lease %s held by %s", l.key, l.holder) }
