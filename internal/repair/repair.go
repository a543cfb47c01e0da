// Package repair makes again the streams, KV buckets and object stores a
// process depends on when they are deleted (by an operator, or a user
// allowed to): it looks for them every second and makes a missing one
// again with the settings it was made with. The records a deleted bucket
// held are gone; the point is that the service goes on working.
package repair

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// Every is how often a Keeper looks by default.
const Every = time.Second

// makeTimeout bounds one try to make a stream again (a cluster without a
// leader is waited out that long, then the next look tries again).
const makeTimeout = 30 * time.Second

// Make makes a missing stream again. last is the stream's last sequence
// when it was last seen, if Keep was asked to track it (else 0).
type Make func(ctx context.Context, last uint64) error

// Keeper looks after the streams of one process.
type Keeper struct {
	js    jetstream.JetStream
	log   *slog.Logger
	every time.Duration

	mu   sync.Mutex
	kept map[string]*kept
}

// spec says how a stream is looked after.
type spec struct {
	what  string
	make  Make
	track bool
}

// kept is one stream looked after; its fields other than spec (guarded
// by Keeper.mu) belong to the goroutine that looks.
type kept struct {
	spec spec

	// seen: a look found the stream (said once, in the debug log).
	seen bool
	last uint64
	// due is when the missing stream is made again (zero: not missing);
	// repeats paces a stream that keeps going missing, failures the
	// tries that failed.
	due      time.Time
	repeats  wait.Repeats
	failures int
}

// New makes a keeper that looks every interval (0: Every).
func New(js jetstream.JetStream, every time.Duration, log *slog.Logger) *Keeper {
	if every <= 0 {
		every = Every
	}
	return &Keeper{js: js, log: log, every: every, kept: map[string]*kept{}}
}

// Keep looks after a stream from now on: stream is its name (KV_<bucket>
// for a bucket, OBJ_<store> for an object store), what names it in the
// log ("bucket nodepool-nodes"), and make makes it again. The stream
// exists (its owner made it before asking): from the next look on, a
// missing one is made again. With track, each look also reads its last
// sequence (one info request), which make gets. Keeping a stream kept
// already replaces how it is made.
func (k *Keeper) Keep(stream, what string, track bool, make Make) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kt, ok := k.kept[stream]; ok {
		kt.spec = spec{what, make, track}
		return
	}
	k.kept[stream] = &kept{spec: spec{what, make, track}}
}

// Forget stops looking after a stream.
func (k *Keeper) Forget(stream string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.kept, stream)
}

// Run looks every interval until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		k.look(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// look asks which streams exist and makes again those kept that are
// missing, once due; it reads the last sequence of those tracked.
func (k *Keeper) look(ctx context.Context) {
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
		return
	}
	var tracked []string
	for stream, sp := range specs {
		if sp.track && exists[stream] {
			tracked = append(tracked, stream)
		}
	}
	last := k.lastSequences(ctx, tracked)
	for _, stream := range slices.Sorted(maps.Keys(kept)) {
		if ctx.Err() != nil {
			return
		}
		kt, sp := kept[stream], specs[stream]
		if !exists[stream] {
			k.repair(ctx, stream, kt, sp)
			continue
		}
		if seq, ok := last[stream]; ok {
			kt.last = seq
		}
		if !kt.seen {
			k.log.Debug(sp.what+" is there; made again if it is deleted", "stream", stream, "last_sequence", kt.last)
		}
		kt.seen, kt.due, kt.failures = true, time.Time{}, 0
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
		return
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		log.Debug("could not look for "+sp.what, "err", err)
		return
	}
	if err := sp.make(mctx, kt.last); err != nil {
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
	log.Warn(sp.what+" was missing; made it again", "last_sequence", kt.last)
	kt.due, kt.failures = time.Time{}, 0
}
