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

	mu     sync.Mutex
	kept   map[string]*kept
	onList func([]*jetstream.StreamInfo, time.Time)
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
// missing one is made again. Each look reads its info; with track, make
// gets the last sequence the latest look found. Keeping a stream kept already replaces how it
// is made.
func (k *Keeper) Keep(stream, what string, track bool, make Make) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kt, ok := k.kept[stream]; ok {
		kt.spec = spec{what, make, track}
		return
	}
	k.kept[stream] = &kept{spec: spec{what, make, track}}
}

// OnList has fn get the infos of the kept streams each look read, with
// when it asked (the process's caches read their staleness probes from
// them: kv.Listing). Call it before Run.
func (k *Keeper) OnList(fn func(infos []*jetstream.StreamInfo, at time.Time)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onList = fn
}

// Forget stops looking after a stream.
func (k *Keeper) Forget(stream string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.kept, stream)
}

// Kept lists the streams looked after.
func (k *Keeper) Kept() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.kept))
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

// look reads the info of each stream kept (their last sequences come
// with them) and makes again those missing that are due.
func (k *Keeper) look(ctx context.Context) {
	at := time.Now()
	infos, missing := k.ask(ctx)
	last := make(map[string]uint64, len(infos))
	for _, info := range infos {
		last[info.Config.Name] = info.State.LastSeq
	}
	k.mu.Lock()
	onList := k.onList
	k.mu.Unlock()
	if onList != nil {
		onList(infos, at)
	}
	k.mu.Lock()
	kept := maps.Clone(k.kept)
	specs := map[string]spec{}
	for stream, kt := range kept {
		specs[stream] = kt.spec
	}
	k.mu.Unlock()
	for _, stream := range slices.Sorted(maps.Keys(kept)) {
		if ctx.Err() != nil {
			return
		}
		kt, sp := kept[stream], specs[stream]
		if seq, ok := last[stream]; ok {
			if sp.track {
				kt.last = seq
			}
			if !kt.seen {
				k.log.Debug(sp.what+" is there; made again if it is deleted", "stream", stream, "last_sequence", kt.last)
			}
			kt.seen, kt.due, kt.failures = true, time.Time{}, 0
			continue
		}
		if missing[stream] {
			k.repair(ctx, stream, kt, sp)
		}
	}
}

// ask reads the info of each stream kept, one request per stream, all at
// once: each is answered by that stream's leader. (A listing of the
// streams, STREAM.LIST, has a cluster's meta leader ask every stream of
// the account, ours or not, for every process every second.) missing has
// the streams the server said do not exist; a stream whose info could not
// be read is in neither.
func (k *Keeper) ask(ctx context.Context) (infos []*jetstream.StreamInfo, missing map[string]bool) {
	lctx, cancel := context.WithTimeout(ctx, natsretry.AttemptTimeout)
	defer cancel()
	names := k.Kept()
	found := make([]*jetstream.StreamInfo, len(names))
	gone := make([]bool, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			s, err := k.js.Stream(lctx, name)
			switch {
			case err == nil:
				found[i] = s.CachedInfo()
			case errors.Is(err, jetstream.ErrStreamNotFound):
				gone[i] = true
			case ctx.Err() == nil:
				k.log.Debug("could not read the stream's info", "stream", name, "err", err)
			}
		})
	}
	wg.Wait()
	missing = map[string]bool{}
	for i, name := range names {
		if found[i] != nil {
			infos = append(infos, found[i])
		}
		if gone[i] {
			missing[name] = true
		}
	}
	return infos, missing
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
