package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/internal/clock"
)

// Lease is a key of the nodepool-locks bucket held by one process. The
// bucket's TTL removes it when its holder stops renewing it; renewals are
// revision-checked updates.
//
// The server keeps the key a TTL from the moment it stores a write, which
// is after the holder sent it: measured from the send of its last write
// that succeeded (the acquisition or a renewal), the holder knows a moment
// before which nobody else can take the lease, whenever the answer came.
// It acts only until two thirds of the TTL after that send (Until), and
// renews every quarter of the TTL, so that two renewals in a row may fail
// or be slow; past Until it steps down, on a timer of its own whatever the
// renewal on its way is doing, a third of the TTL before anyone else may
// take over.
type Lease struct {
	store  *Store[LeaseRecord]
	key    string
	holder string
	ttl    time.Duration
	clock  Clock
	log    *slog.Logger
	// watch, if set, is the process's one watch of the locks bucket; a
	// lease without it watches its own key (watchKey).
	watch *LeaseWatch

	mu    sync.Mutex
	rev   uint64
	since time.Time // the acquisition, as recorded
	sent  time.Time // when the last write that succeeded was sent (clock time)
}

// Clock is the time a lease goes by: the real one, or one a test moves
// by hand (clock.Fake).
type Clock = clock.Clock

// LeaseOption changes how a lease is made.
type LeaseOption func(*Lease)

// WithClock makes a lease go by c instead of the real time.
func WithClock(c Clock) LeaseOption { return func(l *Lease) { l.clock = c } }

// WithWatch makes a lease learn of its key's deletion from the process's
// one watch of the locks bucket (nil: the lease watches its key itself).
func WithWatch(w *LeaseWatch) LeaseOption { return func(l *Lease) { l.watch = w } }

// NewLease prepares a lease on key for holder; ttl must be the bucket's TTL.
func NewLease(store *Store[LeaseRecord], key, holder string, ttl time.Duration, log *slog.Logger, opts ...LeaseOption) *Lease {
	l := &Lease{store: store, key: key, holder: holder, ttl: ttl, clock: clock.Real(), log: log.With("lease", key)}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Key is the lease's key.
func (l *Lease) Key() string { return l.key }

// actFor is how long after the send of its last write that succeeded the
// holder may act on the lease: two thirds of the TTL, a third before the
// lease can expire.
func (l *Lease) actFor() time.Duration { return l.ttl * 2 / 3 }

// renewEvery is the renewals' period: a quarter of the TTL, so that two
// renewals in a row may fail or be slow before the holder steps down.
func (l *Lease) renewEvery() time.Duration { return l.ttl / 4 }

// Until is the moment the holder must stop acting on the lease unless a
// renewal sent before then succeeds: two thirds of the TTL after the send
// of the last write that succeeded. It is zero before the lease is taken.
func (l *Lease) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent.IsZero() {
		return time.Time{}
	}
	return l.sent.Add(l.actFor())
}

// wrote records a write that succeeded, sent at sent.
func (l *Lease) wrote(rev uint64, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Two renewals may be on their way at once (Keep): the one sent later
	// holds the record's revision, whichever answer comes first.
	if !sent.Before(l.sent) {
		l.rev, l.sent = rev, sent
	}
}

// TryAcquire takes the lease if nobody holds it, or if this holder held it
// before (a restarted process with the same id). It reports whether the lease
// is now held; Until then says until when.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	e, err := l.store.Get(ctx, l.key)
	switch {
	case errors.Is(err, ErrNotFound):
		sent := l.clock.Now()
		rev, err := l.store.Create(ctx, l.key, &LeaseRecord{Holder: l.holder, Acquired: sent.UTC(), Renewed: sent.UTC()})
		if errors.Is(err, ErrExists) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		l.acquired(rev, sent)
		return true, nil
	case err != nil && !errors.Is(err, ErrBadRecord):
		return false, err
	case err == nil && e.Value.Holder != l.holder:
		return false, nil
	}
	// Ours from a previous life, or garbage: take it over.
	sent := l.clock.Now()
	rev, err := l.store.Update(ctx, l.key, &LeaseRecord{Holder: l.holder, Acquired: sent.UTC(), Renewed: sent.UTC()}, e.Revision)
	if errors.Is(err, ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.acquired(rev, sent)
	return true, nil
}

func (l *Lease) acquired(rev uint64, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.since, l.sent = rev, sent.UTC(), sent
}

// Renew extends a held lease. An ErrConflict or ErrNotFound means it was lost.
//
// A key that is missing although the holder wrote it less than a TTL ago
// did not expire: it was deleted (by an operator, or with its bucket,
// which is then made again, see internal/repair). If nobody took the lease
// meanwhile, the holder writes it again and goes on holding it; if
// somebody did, it is lost.
func (l *Lease) Renew(ctx context.Context) error {
	sent := l.clock.Now()
	l.mu.Lock()
	rev, since, last := l.rev, l.since, l.sent
	l.mu.Unlock()
	rec := &LeaseRecord{Holder: l.holder, Acquired: since, Renewed: sent.UTC()}
	nrev, err := l.store.Update(ctx, l.key, rec, rev)
	if errors.Is(err, ErrConflict) {
		// A renewal whose answer did not come in time (a loaded cluster)
		// may have landed all the same: the lease is still this
		// holder's, from this acquisition, if the record says so.
		e, gerr := l.store.Get(ctx, l.key)
		switch {
		case gerr == nil && e.Value.Holder == l.holder && e.Value.Acquired.Equal(since):
			nrev, err = l.store.Update(ctx, l.key, rec, e.Revision)
		case errors.Is(gerr, ErrNotFound) && sent.Sub(last) < l.ttl:
			nrev, err = l.store.Create(ctx, l.key, rec)
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
	// The lease lives a TTL from when the server stored the write, which
	// is after sent, whichever of the writes above it was.
	l.wrote(nrev, sent)
	return nil
}

// Release gives a held lease up at once, so another process need not wait
// for the TTL.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	return l.store.Delete(ctx, l.key, rev)
}

// maxRenewals is how many renewals of a lease may be on their way at
// once. A renewal waits for its answer until the holder would step down:
// on a loaded cluster an answer later than the renewal's period still
// extends the lease. But an answer lost with a connection (the client does
// not fail a request when it reconnects) would hold the next renewal back
// until it is too late; so a renewal is sent every period beside those on
// their way. Each waits at most two thirds of the TTL, which is less than
// three periods: three at once, at most.
const maxRenewals = 3

// Keep renews a held lease every quarter of the TTL until ctx ends. As
// soon as the holder may no longer act on the lease it calls lost with the
// reason, and returns: when a renewal finds the lease taken or gone, or at
// Until, kept by a timer of its own, while no renewal sent before then has
// succeeded (however long the ones on their way take).
func (l *Lease) Keep(ctx context.Context, lost func(error)) {
	every := l.renewEvery()
	rctx, stop := context.WithCancel(ctx)
	results := make(chan error, maxRenewals)
	inFlight := 0
	defer func() {
		stop()
		for ; inFlight > 0; inFlight-- {
			<-results
		}
	}()
	renew := l.clock.After(every)
	until := l.Until()
	stepDown := l.clock.After(until.Sub(l.clock.Now()))
	for {
		select {
		case <-ctx.Done():
			return
		case <-stepDown:
			now := l.clock.Now()
			if u := l.Until(); now.Before(u) {
				until, stepDown = u, l.clock.After(u.Sub(now)) // renewed meanwhile
				continue
			}
			lost(fmt.Errorf("no renewal sent in the last %s succeeded (every %s); the lease may expire %s after the last one that did",
				l.actFor(), every, l.ttl-l.actFor()))
			return
		case <-renew:
			renew = l.clock.After(every)
			if inFlight >= maxRenewals {
				continue // the last ones are still on their way
			}
			inFlight++
			wait := max(every, until.Sub(l.clock.Now()))
			go func() {
				c, cancel := context.WithTimeout(rctx, wait)
				defer cancel()
				results <- l.Renew(c)
			}()
		case err := <-results:
			inFlight--
			switch {
			case err == nil:
				if u := l.Until(); u.After(until) {
					until, stepDown = u, l.clock.After(u.Sub(l.clock.Now()))
				}
			case errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound):
				lost(fmt.Errorf("lease lost: %w", err))
				return
			case ctx.Err() == nil:
				l.log.Debug("could not renew lease", "err", err, "steps_down_in", until.Sub(l.clock.Now()).Round(time.Millisecond))
			}
		}
	}
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
			case <-l.clock.After(interval):
			}
			continue
		}
		l.log.Debug("lease taken")
		l.hold(ctx, fn)
	}
}

// hold runs fn while keeping the lease, then releases it.
func (l *Lease) hold(ctx context.Context, fn func(ctx context.Context)) {
	defer l.release(ctx)
	if !l.clock.Now().Before(l.Until()) {
		// The answer came too late to act on it (NATS is slow): let it go
		// and try again.
		l.log.Warn("lease taken too late to act on it; letting it go")
		return
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kctx, stopKeep := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		l.Keep(kctx, func(err error) {
			if ctx.Err() == nil {
				l.log.Warn("stepping down", "err", err)
			}
			cancel()
		})
	}()
	fn(lctx)
	stopKeep()
	<-kept
}

// release gives the lease up after fn returned, unless it was lost.
func (l *Lease) release(ctx context.Context) {
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer rcancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
		l.log.Debug("could not release lease", "err", err)
	}
}

// watchKey signals when the lease key is deleted or expires, so a waiting
// process can try at once instead of at its next poll: from the process's
// watch of the locks bucket, or a watch of the lease's own key.
func (l *Lease) watchKey(ctx context.Context) <-chan struct{} {
	w := l.watch
	if w == nil {
		w = newLeaseWatch(l.store, l.key, l.log)
	}
	ch, stop := w.Subscribe(l.key)
	context.AfterFunc(ctx, stop)
	return ch
}

// String describes the lease.
func (l *Lease) String() string { return fmt.Sprintf("lease %s held by %s", l.key, l.holder) }
