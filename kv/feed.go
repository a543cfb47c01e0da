package kv

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/wait"
)

// sink is what a watch of a bucket keeps up to date: a cache of some of
// its keys.
type sink interface {
	// wants reports whether a key is one of the sink's.
	wants(key string) bool
	observe(e jetstream.KeyValueEntry)
	// advance records that the watch delivered every change up to seq.
	advance(seq uint64)
	markSynced()
	// reset drops every record: the bucket was deleted and made again.
	reset()
	ForgetDeleted(rev uint64)
}

func (c *Cache[T]) wants(key string) bool { return c.store.keys == "" || keyMatches(c.store.keys, key) }

// keyMatches reports whether a key matches a pattern of tokens, where *
// stands for one token and a final > for one or more.
func keyMatches(pattern, key string) bool {
	for pattern != "" {
		if key == "" {
			return false
		}
		pt, prest, _ := strings.Cut(pattern, ".")
		kt, krest, _ := strings.Cut(key, ".")
		if pt == ">" {
			return true
		}
		if pt != "*" && pt != kt {
			return false
		}
		pattern, key = prest, krest
	}
	return key == ""
}

// watchLoop is one watch of a bucket's keys (all of them if keys is
// empty) feeding sinks.
type watchLoop struct {
	kv    jetstream.KeyValue
	keys  string
	log   *slog.Logger
	sinks []sink
	// created is when the bucket's stream the sinks hold the records of
	// was made.
	created time.Time
	// missing, if set, is told the name of the bucket's stream while the
	// bucket is missing (Store.Reporting).
	missing func(stream string)
}

// run watches the bucket until ctx ends, restarting the watch where it
// stopped if it fails or falls silent while the stream moves on. When the
// bucket is deleted, it waits for it to be made again (see
// internal/repair) and then feeds the records of the new bucket: the
// records the sinks held are dropped, as deletions.
func (l *watchLoop) run(ctx context.Context) {
	var last uint64
	missing := 0
	for ctx.Err() == nil {
		// The stream's last sequence before the watch starts: once the
		// watch has delivered what was pending, the sinks cover it.
		target, created, err := streamState(ctx, l.kv)
		if bucketMissing(err) {
			if missing == 0 {
				l.log.Info("the bucket is missing; watching it again once it is made again")
			}
			if l.missing != nil {
				l.missing("KV_" + l.kv.Bucket())
			}
			if !wait.Sleep(ctx, min(wait.Backoff(missing), time.Second)) {
				break
			}
			missing++
			continue
		}
		missing = 0
		if err == nil {
			if !l.created.IsZero() && !created.Equal(l.created) {
				l.log.Info("the bucket was deleted and made again; its records are gone, watching the new one")
				for _, s := range l.sinks {
					s.reset()
				}
				last = 0
			}
			l.created = created
		}
		var opts []jetstream.WatchOpt
		if last > 0 {
			opts = append(opts, jetstream.ResumeFromRevision(last+1))
		}
		keys := l.keys
		if keys == "" {
			keys = jetstream.AllKeys
		}
		w, err := (&Store[struct{}]{kv: l.kv}).WatchKeys(ctx, keys, opts...)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			l.log.Warn("watch failed; retrying", "err", err)
			if !wait.Sleep(ctx, time.Second) {
				break
			}
			continue
		}
		last = l.consume(ctx, w, last, target, created)
		_ = w.Stop()
	}
}

func (l *watchLoop) advance(seq uint64) {
	for _, s := range l.sinks {
		s.advance(seq)
	}
}

func (l *watchLoop) markSynced() {
	for _, s := range l.sinks {
		s.markSynced()
	}
}

func (l *watchLoop) consume(ctx context.Context, w jetstream.KeyWatcher, last, target uint64, created time.Time) uint64 {
	if last > 0 {
		// A resumed watch sends no initial-values marker we need.
		l.markSynced()
	}
	// Deletions are remembered for a minute or two: long enough for any
	// write-through of an older revision to arrive and be refused.
	tidy := time.NewTicker(time.Minute)
	defer tidy.Stop()
	check := time.NewTicker(staleCheck)
	defer check.Stop()
	var lastAtTidy uint64
	heard := time.Now()
	// fresh is the stream sequence up to which the watch delivered every
	// change (of its keys).
	fresh := last
	// suspect is a stream sequence the watch had not delivered at the
	// last check; still missing at the next one, the watch has stalled (a
	// change just written is merely on its way).
	var suspect uint64
	for {
		select {
		case <-ctx.Done():
			return last
		case <-tidy.C:
			for _, s := range l.sinks {
				s.ForgetDeleted(lastAtTidy)
			}
			lastAtTidy = last
		case <-check.C:
			if time.Since(heard) < staleCheck {
				continue
			}
			// Quiet for a while: if the stream has moved on, the watch
			// has stalled; start it again where it stopped.
			if suspect > fresh {
				l.log.Debug("watch silent while the bucket changed; restarting it", "revision", last, "missing", suspect)
				return last
			}
			suspect = 0
			seq, cr, err := streamState(ctx, l.kv)
			switch {
			case bucketMissing(err):
				return last // deleted: run waits for it to be made again
			case err != nil:
			case !created.IsZero() && !cr.Equal(created):
				return last // deleted and made again: run starts afresh
			case seq > fresh:
				suspect = seq
			}
		case e, ok := <-w.Updates():
			if !ok {
				return last
			}
			heard = time.Now()
			if e == nil {
				// Caught up with what the stream held when the watch
				// started.
				fresh = max(fresh, last, l.covered(ctx, last, target))
				l.advance(fresh)
				l.markSynced()
				continue
			}
			last = e.Revision()
			for _, s := range l.sinks {
				if s.wants(e.Key()) {
					s.observe(e)
				}
			}
			fresh = max(fresh, last)
			l.advance(last)
		}
	}
}

// covered is how far a watch that delivered every change up to last, and
// then its initial-values marker, covers the bucket: up to target (the
// stream's last sequence when the watch started; what lies between last
// and it is gone, expired or purged), unless a change in between is still
// there. The watch's consumer is on one server, which for a replicated
// bucket may be a replica catching up (a server just restarted): its
// marker says it delivered what that replica has, and the changes it lacks
// come later. Then the watch covers only last, and its deliveries, or the
// staleness check, move it on.
func (l *watchLoop) covered(ctx context.Context, last, target uint64) uint64 {
	lk, ok := l.kv.(*leaderKV)
	if !ok || target <= last {
		return target // one replica: the consumer reads the one store there is
	}
	next, found, err := lk.nextAfter(ctx, last, l.keys)
	switch {
	case err != nil:
		l.log.Debug("could not tell whether the watch is behind the stream's leader; taking it as behind", "revision", last, "err", err)
		return last
	case found && next <= target:
		l.log.Debug("watch behind the stream's leader (its server is catching up)", "revision", last, "missing", next)
		return last
	}
	return target
}

// streamState reads the last sequence of a bucket's stream (from the
// stream's leader) and when the stream was made.
func streamState(ctx context.Context, bucket jetstream.KeyValue) (uint64, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := bucket.Status(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	bst, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, time.Time{}, errors.New("unexpected bucket status")
	}
	info := bst.StreamInfo()
	return info.State.LastSeq, info.Created, nil
}

// Feed is one watch of a bucket that keeps several caches of its keys up
// to date (the image, build and upload records of the images bucket): one
// consumer on the server and one staleness probe for all of them. Its
// caches' Start and Run start it; it runs while any of them is started.
type Feed struct {
	loop watchLoop
	runs counted
}

// newFeed makes a feed of a bucket; feedCache adds its caches, before
// any of them starts.
func newFeed(bucket jetstream.KeyValue, missing func(stream string), log *slog.Logger) *Feed {
	return &Feed{loop: watchLoop{kv: bucket, log: log.With("bucket", bucket.Bucket()), missing: missing}}
}

// feedCache makes a cache of a store's keys fed by f (the store must be
// over f's bucket).
func feedCache[T any](f *Feed, store *Store[T], log *slog.Logger) *Cache[T] {
	c := NewCache(store, log)
	c.feed = f
	f.loop.sinks = append(f.loop.sinks, c)
	return c
}

// Start runs the feed in the background until the returned stop is
// called (as Cache.Start does).
func (f *Feed) Start() (stop func()) { return f.runs.start(f.loop.run) }

// ImageCaches are caches of the images bucket's three kinds of record,
// fed by one watch.
type ImageCaches struct {
	Images  *Cache[DiskImage]
	Builds  *Cache[ImageBuild]
	Uploads *Cache[ImageUpload]
}

// ImageCaches makes the caches of the images bucket, fed by one watch
// that reports the bucket missing as the buckets' stores do.
func (b *Buckets) ImageCaches(log *slog.Logger) *ImageCaches {
	bucket := b.Images
	f := newFeed(bucket, b.missing, log)
	s := NewImageStores(bucket)
	return &ImageCaches{
		Images:  feedCache(f, s.Images, log),
		Builds:  feedCache(f, s.Builds, log),
		Uploads: feedCache(f, s.Uploads, log),
	}
}
