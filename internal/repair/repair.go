// Package repair makes again the streams, KV buckets and object stores a
// process depends on when they are deleted (by an operator, or a user
// allowed to), with the settings they were made with. The records a
// deleted bucket held are gone; the point is that the service goes on
// working.
//
// A keeper looks (one request listing the streams' names) when it is
// told that a stream it keeps may be gone, and otherwise asks nothing of
// the servers while nothing happens. It is told by the process's own
// parts (Missing: a cache's staleness probe or a call that finds its
// bucket gone, a consumer that finds its stream gone), by the servers'
// announcement of a deleted stream ($JS.EVENT.ADVISORY.STREAM.DELETED.<stream>)
// and by its connection coming back (announcements made meanwhile are
// lost). Neither source alone is enough: nats-server v2.15 queues the
// announcement on the stream's own send queue and closes that queue's
// loop right after, so under load it is sometimes dropped (stream.go,
// stop), and a stream no part of this process uses is noticed by no part.
// A look every few minutes (Every) is the safety net. The last sequence
// of a followed stream is read again only when the stream was published
// to: a plain subscription to its subjects says so.
package repair

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// Every is how often a Keeper looks by default when nothing asks it to:
// the safety net for a deletion nothing noticed.
const Every = 5 * time.Minute

// minGap is the least time between two looks that were asked for: in a
// cluster busy with restarts, every failed call of every part may ask,
// and a process then looks at most as often as it did when it looked
// every second whatever happened.
const minGap = time.Second

// deletedAdvisory is the subject prefix of the servers' announcements of
// a deleted stream; the stream's name follows.
const deletedAdvisory = "$JS.EVENT.ADVISORY.STREAM.DELETED."

// makeTimeout bounds one try to make a stream again (a cluster without a
// leader is waited out that long, then the next look tries again).
const makeTimeout = 30 * time.Second

// Make makes a missing stream again. last is the stream's last sequence
// when it was last seen, if Keep was asked to follow it (else 0).
type Make func(ctx context.Context, last uint64) error

// Keeper looks after the streams of one process.
type Keeper struct {
	js    jetstream.JetStream
	log   *slog.Logger
	every time.Duration

	// wake asks the goroutine that looks to look now.
	wake chan struct{}
	// followers watch the subjects of the followed streams that exist
	// (the goroutine that looks owns it).
	followers map[string]*follower
	// activity says that a followed stream was published to: stale
	// (under mu) says which.
	activity chan struct{}

	mu    sync.Mutex
	kept  map[string]*kept
	stale map[string]bool
}

// spec says how a stream is looked after.
type spec struct {
	what string
	make Make
	// follow: the stream's subjects, if its last sequence is followed.
	follow []string
}

// kept is one stream looked after; its fields other than spec (guarded
// by Keeper.mu) belong to the goroutine that looks; last, which only that
// goroutine writes, is atomic as LastSequence reads it from anywhere.
type kept struct {
	spec spec

	// last is the highest sequence read of a followed stream (by a look
	// or a refresh).
	last atomic.Uint64
	// seen: a look found the stream (said once, in the debug log).
	seen bool
	// due is when the missing stream is made again (zero: not missing);
	// repeats paces a stream that keeps going missing, failures the
	// tries that failed.
	due      time.Time
	repeats  wait.Repeats
	failures int
}

// New makes a keeper that looks at least every interval (0: Every).
func New(js jetstream.JetStream, every time.Duration, log *slog.Logger) *Keeper {
	if every <= 0 {
		every = Every
	}
	return &Keeper{js: js, log: log, every: every, kept: map[string]*kept{}, wake: make(chan struct{}, 1),
		followers: map[string]*follower{}, activity: make(chan struct{}, 1), stale: map[string]bool{}}
}

// Keep looks after a stream from now on: stream is its name (KV_<bucket>
// for a bucket, OBJ_<store> for an object store), what names it in the
// log ("bucket nodepool-nodes"), and make makes it again. The stream
// exists (its owner made it before asking): from the next look on, a
// missing one is made again. With follow, the stream's subjects, the
// keeper follows its last sequence, which make gets. Keeping a stream
// kept already replaces how it is made.
func (k *Keeper) Keep(stream, what string, follow []string, make Make) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kt, ok := k.kept[stream]; ok {
		kt.spec = spec{what, make, follow}
		return
	}
	k.kept[stream] = &kept{spec: spec{what, make, follow}}
	k.poke()
}

// Forget stops looking after a stream.
func (k *Keeper) Forget(stream string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.kept, stream)
	k.poke()
}

// Missing tells the keeper that a stream may be gone (a caller found it
// missing): if the keeper keeps it, it looks now.
func (k *Keeper) Missing(stream string) {
	k.mu.Lock()
	_, ok := k.kept[stream]
	k.mu.Unlock()
	if ok {
		k.poke()
	}
}

// poke asks for a look soon.
func (k *Keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Run looks after the streams until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	nc := k.js.Conn()
	// Publications missed while disconnected: look on reconnect.
	status := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(status)
	defer k.stopFollowers()
	// The servers' announcements of deleted streams: one kept asks for a
	// look.
	sub, err := nc.Subscribe(deletedAdvisory+">", func(m *nats.Msg) { k.Missing(strings.TrimPrefix(m.Subject, deletedAdvisory)) })
	if err != nil {
		k.log.Debug("could not subscribe to the announcements of deleted streams; a deletion is noticed by the process's parts or the next look", "err", err)
	} else {
		defer func() { _ = sub.Unsubscribe() }()
	}

	// The first look answers the Keeps made before Run.
	select {
	case <-k.wake:
	default:
	}
	t := time.NewTimer(k.look(ctx))
	defer t.Stop()
	lastLook := time.Now()
	// A stream published to is read again within a second of the last
	// read, so that a busy stream costs one read a second.
	var refresh <-chan time.Time
	var lastRead time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.wake:
			// Asked again and again (every failed call tells): at
			// most one look every minGap.
			if d := minGap - time.Since(lastLook); d > 0 {
				t.Reset(d)
				continue
			}
		case <-status:
			// Publications missed while disconnected: read every followed
			// stream again.
			k.mu.Lock()
			for stream := range k.followers {
				k.stale[stream] = true
			}
			k.mu.Unlock()
		case <-k.activity:
			if refresh == nil {
				refresh = time.After(max(0, time.Second-time.Since(lastRead)))
			}
			continue
		case <-refresh:
			refresh = nil
			lastRead = time.Now()
			k.refresh(ctx)
			continue
		}
		t.Reset(k.look(ctx))
		lastLook = time.Now()
	}
}

// refresh reads the last sequence of the followed streams published to
// since they were last read. One that could not be read is read again
// at the next refresh.
func (k *Keeper) refresh(ctx context.Context) {
	k.mu.Lock()
	stale := map[string]*kept{}
	for stream := range k.stale {
		if kt, ok := k.kept[stream]; ok && k.followers[stream] != nil {
			stale[stream] = kt
		}
	}
	clear(k.stale)
	k.mu.Unlock()
	read := k.lastSequences(ctx, slices.Collect(maps.Keys(stale)))
	for stream, kt := range stale {
		if last, ok := read[stream]; ok {
			kt.saw(last)
		} else {
			k.touch(stream)
		}
	}
}

// look asks which streams exist and makes again those kept that are
// missing, once due; it starts following those to follow that exist, and
// reads their last sequence. It returns how long until the
// next look, if nothing asks for one sooner.
func (k *Keeper) look(ctx context.Context) time.Duration {
	k.mu.Lock()
	kept := maps.Clone(k.kept)
	specs := map[string]spec{}
	for stream, kt := range kept {
		specs[stream] = kt.spec
	}
	k.mu.Unlock()
	exists, err := k.names(ctx)
	if err != nil {
		if ctx.Err() == nil {
			k.log.Debug("could not list the names of the streams", "err", err)
		}
		return time.Second
	}
	next := k.every
	if !k.followAll(specs, exists) {
		next = time.Second // one not followed yet: soon again
	}
	read := k.lastSequences(ctx, k.toRead(specs, exists))
	for _, stream := range slices.Sorted(maps.Keys(kept)) {
		if ctx.Err() != nil {
			return next
		}
		kt, sp := kept[stream], specs[stream]
		if !exists[stream] {
			k.unfollow(stream)
			k.repair(ctx, stream, kt, sp)
			if !kt.due.IsZero() {
				next = min(next, max(time.Until(kt.due), 10*time.Millisecond))
			}
			continue
		}
		if last, ok := read[stream]; ok {
			kt.saw(last)
		}
		if !kt.seen {
			k.log.Debug(sp.what+" is there; made again if it is deleted", "stream", stream, "last_sequence", kt.last.Load())
		}
		kt.seen, kt.due, kt.failures = true, time.Time{}, 0
	}
	// The followers of streams no longer kept or followed stop.
	for stream := range k.followers {
		if specs[stream].follow == nil {
			k.unfollow(stream)
		}
	}
	return next
}

// toRead lists the streams to follow that exist whose last sequence a
// look reads: those just followed or not followed (their subscription
// failed), and those published to since the last read.
func (k *Keeper) toRead(specs map[string]spec, exists map[string]bool) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var streams []string
	for stream, sp := range specs {
		if sp.follow != nil && exists[stream] && (!k.followers[stream].running() || k.stale[stream]) {
			streams = append(streams, stream)
			delete(k.stale, stream)
		}
	}
	return streams
}

// followAll follows the streams to follow that exist and are not
// followed yet; it reports whether every one is.
func (k *Keeper) followAll(specs map[string]spec, exists map[string]bool) bool {
	all := true
	for stream, sp := range specs {
		if sp.follow != nil && exists[stream] && !k.followers[stream].running() && !k.follow(stream, sp.follow) {
			all = false
		}
	}
	return all
}

// follow starts following a stream: its subscription first, so that the
// read the look makes next misses no publication. It reports whether the
// stream is followed.
func (k *Keeper) follow(stream string, subjects []string) bool {
	k.unfollow(stream)
	f := k.startFollower(stream, subjects)
	if f == nil {
		return false
	}
	k.followers[stream] = f
	k.mu.Lock()
	k.stale[stream] = true
	k.mu.Unlock()
	return true
}

// saw raises the last sequence known to seq (only the goroutine that
// looks writes it).
func (kt *kept) saw(seq uint64) {
	if seq > kt.last.Load() {
		kt.last.Store(seq)
	}
}

// unfollow stops following a stream.
func (k *Keeper) unfollow(stream string) {
	k.followers[stream].stop()
	delete(k.followers, stream)
}

func (k *Keeper) stopFollowers() {
	for stream := range k.followers {
		k.unfollow(stream)
	}
}

// follower watches a followed stream's subjects: a message published
// there (its stream takes it, with the next sequence) marks the stream's
// last sequence stale, and it is read again within a second. A plain
// subscription, not a consumer: a work-queue stream takes no second
// consumer of its subjects, and an idle stream costs nothing.
type follower struct {
	subs []*nats.Subscription
}

// startFollower starts watching a stream's subjects; nil if it could
// not (the stream is then read at each look).
func (k *Keeper) startFollower(stream string, subjects []string) *follower {
	f := &follower{}
	for _, subject := range subjects {
		sub, err := k.js.Conn().Subscribe(subject, func(*nats.Msg) { k.touch(stream) })
		if err != nil {
			k.log.Debug("could not watch the stream's subjects; reading its last sequence at each look", "stream", stream, "err", err)
			f.stop()
			return nil
		}
		f.subs = append(f.subs, sub)
	}
	return f
}

// touch marks a stream's last sequence stale.
func (k *Keeper) touch(stream string) {
	k.mu.Lock()
	k.stale[stream] = true
	k.mu.Unlock()
	select {
	case k.activity <- struct{}{}:
	default:
	}
}

// running reports whether the follower still watches its stream.
func (f *follower) running() bool {
	if f == nil {
		return false
	}
	for _, sub := range f.subs {
		if !sub.IsValid() {
			return false
		}
	}
	return true
}

func (f *follower) stop() {
	if f != nil {
		for _, sub := range f.subs {
			_ = sub.Unsubscribe()
		}
	}
}

// names asks for the names of the streams: one request, which a
// cluster's meta leader answers from what it holds. (A listing of the
// streams with their states, STREAM.LIST, has the meta leader ask the
// leader of every stream of the account, ours or not, and in nats-server
// v2.15 can panic a server shutting down meanwhile.)
func (k *Keeper) names(ctx context.Context) (map[string]bool, error) {
	lctx, cancel := context.WithTimeout(ctx, natsretry.AttemptTimeout)
	defer cancel()
	lister := k.js.StreamNames(lctx)
	exists := map[string]bool{}
	for name := range lister.Name() {
		exists[name] = true
	}
	if err := lister.Err(); err != nil {
		return nil, err
	}
	return exists, nil
}

// lastSequences reads the last sequence of each stream named, one info
// request per stream (answered by its leader), all at once. A stream
// whose info could not be read is left out: its last sequence stays as
// the previous look found it.
func (k *Keeper) lastSequences(ctx context.Context, streams []string) map[string]uint64 {
	lctx, cancel := context.WithTimeout(ctx, natsretry.AttemptTimeout)
	defer cancel()
	seqs := make([]uint64, len(streams))
	read := make([]bool, len(streams))
	var wg sync.WaitGroup
	for i, name := range streams {
		wg.Go(func() {
			s, err := k.js.Stream(lctx, name)
			if err != nil {
				if ctx.Err() == nil {
					k.log.Debug("could not read the stream's last sequence", "stream", name, "err", err)
				}
				return
			}
			seqs[i], read[i] = s.CachedInfo().State.LastSeq, true
		})
	}
	wg.Wait()
	last := make(map[string]uint64, len(streams))
	for i, name := range streams {
		if read[i] {
			last[name] = seqs[i]
		}
	}
	return last
}

// repair makes a missing stream again, once it is due.
func (k *Keeper) repair(ctx context.Context, stream string, kt *kept, sp spec) {
	log := k.log.With("stream", stream)
	now := time.Now()
	if kt.due.IsZero() {
		d := kt.repeats.Next(now)
		kt.due = now.Add(d)
		if d > 0 {
			log.Warn(sp.what+" is missing again; making it again after a pause", "pause", d)
		}
	}
	if now.Before(kt.due) {
		return
	}
	// Several processes notice at once: a random pause lets one make it
	// and the others find it made.
	if !wait.Sleep(ctx, time.Duration(rand.Int64N(int64(200*time.Millisecond)))) {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, makeTimeout)
	defer cancel()
	_, err := natsretry.Do(mctx, func(ctx context.Context) (jetstream.Stream, error) { return k.js.Stream(ctx, stream) })
	switch {
	case err == nil:
		log.Info(sp.what + " was missing; another process made it again")
		kt.due, kt.failures = time.Time{}, 0
		k.poke() // the next look follows it again
		return
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		log.Debug("could not look for "+sp.what, "err", err)
		return
	}
	if err := sp.make(mctx, kt.last.Load()); err != nil {
		if ctx.Err() != nil {
			return
		}
		if kt.failures == 0 {
			log.Warn("could not make "+sp.what+" again; retrying", "err", err)
		}
		kt.due = time.Now().Add(min(wait.Backoff(kt.failures), 10*time.Second))
		kt.failures++
		return
	}
	log.Warn(sp.what+" was missing; made it again", "last_sequence", kt.last.Load())
	kt.due, kt.failures = time.Time{}, 0
	k.poke() // the next look follows it again
}

// LastSequence is the last sequence the keeper knows of a followed stream
// (0 if it knows none): the stream made again starts past it.
func (k *Keeper) LastSequence(stream string) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kt, ok := k.kept[stream]; ok {
		return kt.last.Load()
	}
	return 0
}
