package kv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// Change is one change seen by a Cache: New is nil when the key was deleted,
// Old is nil when it was created. Revision is the change's revision: New's,
// or for a deletion the revision at which the key was seen deleted (at
// least the last revision it had).
type Change[T any] struct {
	Key      string
	Old      *Entry[T]
	New      *Entry[T]
	Revision uint64
}

// Cache holds the current records of a bucket in memory, kept up to date by
// a watch. Writers may apply their own successful writes at once (Apply), so
// that a process never acts on an older revision of what it just wrote.
type Cache[T any] struct {
	store *Store[T]
	log   *slog.Logger

	mu      sync.RWMutex
	entries map[string]*Entry[T]
	// gone remembers the revision at which keys were deleted, so that a late
	// Apply of an older revision cannot bring them back.
	gone map[string]uint64
	subs []*Subscription[T]
	// observers are told of every change synchronously, by whoever makes
	// it; they must be safe for concurrent use.
	observers []func(Change[T])
	synced    chan struct{}
	once      sync.Once

	// fresh is the stream sequence up to which the cache holds every
	// change of its keys; progress is closed (and replaced) when it grows.
	fresh    uint64
	progress chan struct{}

	// bad holds the records the watch saw that do not decode, until a
	// newer revision of their key replaces or deletes them.
	bad map[string]BadRecord

	// restarted is when the cache last started afresh because the bucket
	// was deleted and made again.
	restarted time.Time

	// feed, if set, is the one watch of the bucket that feeds this cache
	// and others: Start and Run start it.
	feed *Feed

	// runs is the watch the Starts share.
	runs counted
}

// BadRecord is a record that does not decode: its key, revision, stored
// bytes and the decoding error.
type BadRecord struct {
	Key      string
	Revision uint64
	Data     []byte
	Err      error
}

// staleCheck is how long a watch may deliver nothing before the cache asks
// the stream whether it missed something. A watch is an ordered consumer on
// the server that leads the bucket's stream; when that server goes away,
// the client notices only after two missed idle heartbeats (10 to 20 s),
// and until then the cache would silently fall behind.
const staleCheck = time.Second

// NewCache makes a cache of a store; Run fills it.
func NewCache[T any](store *Store[T], log *slog.Logger) *Cache[T] {
	return &Cache[T]{
		store:    store,
		log:      log.With("bucket", store.kv.Bucket()),
		entries:  map[string]*Entry[T]{},
		gone:     map[string]uint64{},
		bad:      map[string]BadRecord{},
		synced:   make(chan struct{}),
		progress: make(chan struct{}),
	}
}

// Synced is closed once the cache holds every record that existed when Run
// started.
func (c *Cache[T]) Synced() <-chan struct{} { return c.synced }

// WaitSynced waits for Synced or the context.
func (c *Cache[T]) WaitSynced(ctx context.Context) error {
	select {
	case <-c.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run watches the bucket until ctx ends, restarting the watch where it
// stopped if it fails or falls silent while the stream moves on. When the
// bucket is deleted, it waits for it to be made again (see
// internal/repair) and then holds the records of the new bucket: the
// records it held are dropped, as deletions. A cache fed by a Feed
// starts the feed's watch instead, for as long as Run runs.
func (c *Cache[T]) Run(ctx context.Context) error {
	if c.feed != nil {
		stop := c.feed.Start()
		<-ctx.Done()
		stop()
		return nil
	}
	w := &watchLoop{kv: c.store.kv, keys: c.store.keys, log: c.log, sinks: []sink{c}, missing: c.store.missing}
	w.run(ctx)
	return nil
}

// bucketMissing reports whether an error says the bucket does not exist.
func bucketMissing(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// reset drops every record, as deletions, and what the cache knew of the
// bucket's revisions: the bucket was made again, and its revisions start
// again from one.
func (c *Cache[T]) reset() {
	c.mu.Lock()
	var changes []Change[T]
	for key, old := range c.entries {
		ch := Change[T]{Key: key, Old: old, Revision: old.Revision}
		changes = append(changes, ch)
		for _, s := range c.subs {
			s.push(ch)
		}
	}
	c.entries = map[string]*Entry[T]{}
	c.gone = map[string]uint64{}
	c.bad = map[string]BadRecord{}
	c.fresh = 0
	c.restarted = time.Now()
	observers := c.observers
	c.mu.Unlock()
	for _, ch := range changes {
		for _, fn := range observers {
			fn(ch)
		}
	}
}

// Restarted is when the cache last started afresh because its bucket was
// deleted and made again (zero if never). Until every process has written
// its records again (a heartbeat, a lease), their absence then means
// nothing.
func (c *Cache[T]) Restarted() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.restarted
}

// Start runs the cache in the background until the returned stop is
// called; stop waits for the watch to end. Starts are counted: every role
// and driver of a process that reads the cache starts it, one watch
// serves them all, and it ends with the last stop.
func (c *Cache[T]) Start() (stop func()) {
	if c.feed != nil {
		return c.feed.Start()
	}
	return c.runs.start(func(ctx context.Context) { _ = c.Run(ctx) })
}

// counted runs one loop while any of its starts is not stopped yet.
type counted struct {
	mu      sync.Mutex
	starts  int
	stopRun func()
}

// start runs run in the background if it does not run yet; the returned
// stop (once; later calls do nothing) ends it, and waits for it, when it
// is the last.
func (r *counted) start(run func(context.Context)) (stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.starts == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			run(ctx)
		}()
		r.stopRun = func() {
			cancel()
			<-done
		}
	}
	r.starts++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.starts--; r.starts == 0 {
				r.stopRun()
				r.stopRun = nil
			}
		})
	}
}

// streamState reads the last sequence of the bucket's stream (from the
// stream's leader) and when the stream was made.
func (c *Cache[T]) streamState(ctx context.Context) (uint64, time.Time, error) {
	return streamState(ctx, c.store.kv)
}

// advance records that the cache holds every change up to seq.
func (c *Cache[T]) advance(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq > c.fresh {
		c.fresh = seq
		close(c.progress)
		c.progress = make(chan struct{})
	}
}

// Sync waits until the cache holds every change the bucket had when Sync
// was called: a process that takes over a duty (a pool's scheduling, a
// sweep) calls it before acting on the cache, so that it does not act on
// a view older than its predecessor's.
func (c *Cache[T]) Sync(ctx context.Context) error {
	target, _, err := c.streamState(ctx)
	if err != nil {
		return err
	}
	for {
		c.mu.RLock()
		fresh, progress := c.fresh, c.progress
		c.mu.RUnlock()
		if fresh >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-progress:
		}
	}
}

func (c *Cache[T]) markSynced() { c.once.Do(func() { close(c.synced) }) }

func (c *Cache[T]) observe(e jetstream.KeyValueEntry) {
	key := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		c.remove(key, e.Revision())
		return
	}
	v, err := Decode[T](key, e.Value())
	if err != nil {
		c.log.Error("ignoring a record that is not valid", "key", key, "revision", e.Revision(), "err", err)
		c.remove(key, e.Revision())
		c.mu.Lock()
		if c.bad[key].Revision < e.Revision() {
			c.bad[key] = BadRecord{Key: key, Revision: e.Revision(), Data: e.Value(), Err: err}
		}
		c.mu.Unlock()
		return
	}
	c.Apply(Entry[T]{Key: key, Value: v, Revision: e.Revision()})
}

func (c *Cache[T]) remove(key string, rev uint64) {
	c.mu.Lock()
	old, ok := c.entries[key]
	if ok && old.Revision > rev {
		c.mu.Unlock()
		return
	}
	delete(c.entries, key)
	c.gone[key] = max(c.gone[key], rev)
	if b, isBad := c.bad[key]; isBad && b.Revision < rev {
		delete(c.bad, key)
	}
	ch := Change[T]{Key: key, Old: old, Revision: rev}
	if ok {
		// Queued under the lock, so that every subscriber sees the changes
		// of a key in the order the cache made them.
		for _, s := range c.subs {
			s.push(ch)
		}
	}
	observers := c.observers
	c.mu.Unlock()
	if ok {
		for _, fn := range observers {
			fn(ch)
		}
	}
}

// Apply stores an entry if it is newer than what the cache holds and tells
// subscribers. Writers call it with what they wrote.
func (c *Cache[T]) Apply(e Entry[T]) {
	c.mu.Lock()
	old, ok := c.entries[e.Key]
	if (ok && old.Revision >= e.Revision) || c.gone[e.Key] >= e.Revision {
		c.mu.Unlock()
		return
	}
	delete(c.gone, e.Key)
	if b, isBad := c.bad[e.Key]; isBad && b.Revision < e.Revision {
		delete(c.bad, e.Key)
	}
	ne := &e
	c.entries[e.Key] = ne
	ch := Change[T]{Key: e.Key, New: ne, Revision: e.Revision}
	if ok {
		ch.Old = old
	}
	// Queued under the lock, so that every subscriber sees the changes of
	// a key in the order the cache made them (two writers applying at once
	// could otherwise queue an older revision after a newer one).
	for _, s := range c.subs {
		s.push(ch)
	}
	observers := c.observers
	c.mu.Unlock()
	for _, fn := range observers {
		fn(ch)
	}
}

// Observe calls fn for every record now in the cache (as a creation) and
// then for every change, synchronously, from whichever goroutine makes the
// change: fn must be quick and safe for concurrent use. It suits running
// totals that must include a write as soon as Apply returns.
func (c *Cache[T]) Observe(fn func(Change[T])) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		fn(Change[T]{Key: e.Key, New: e, Revision: e.Revision})
	}
	c.observers = append(c.observers, fn)
}

// BadRecords returns the records that do not decode, as the watch last
// saw them.
func (c *Cache[T]) BadRecords() []BadRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]BadRecord, 0, len(c.bad))
	for _, b := range c.bad {
		out = append(out, b)
	}
	return out
}

// Get returns the cached record of a key.
func (c *Cache[T]) Get(key string) (Entry[T], bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.entries[key]
	if !ok {
		return Entry[T]{}, false
	}
	return *e, true
}

// Has reports whether a key is cached.
func (c *Cache[T]) Has(key string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.entries[key]
	return ok
}

// Len is the number of cached records.
func (c *Cache[T]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// Range calls fn for each cached record until it returns false. The entries
// must not be changed.
func (c *Cache[T]) Range(fn func(*Entry[T]) bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, e := range c.entries {
		if !fn(e) {
			return
		}
	}
}

// Subscribe returns a queue of every change from now on. The current content
// is delivered first, as creations.
func (c *Cache[T]) Subscribe() *Subscription[T] {
	s := &Subscription[T]{signal: make(chan struct{}, 1)}
	c.mu.Lock()
	for _, e := range c.entries {
		s.queue = append(s.queue, Change[T]{Key: e.Key, New: e, Revision: e.Revision})
	}
	c.subs = append(c.subs, s)
	c.mu.Unlock()
	s.notify()
	return s
}

// Changes returns a channel that receives a value after the cache changed
// (once at first), without the changes themselves (Subscribe has them),
// and the function that stops it: for a reader that looks at the whole
// cache again whatever changed.
func (c *Cache[T]) Changes() (changed <-chan struct{}, stop func()) {
	s := &Subscription[T]{signal: make(chan struct{}, 1), signalOnly: true}
	c.mu.Lock()
	c.subs = append(c.subs, s)
	c.mu.Unlock()
	s.notify()
	return s.signal, func() { c.Unsubscribe(s) }
}

// Unsubscribe stops delivering changes to s.
func (c *Cache[T]) Unsubscribe(s *Subscription[T]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.subs {
		if x == s {
			c.subs = append(c.subs[:i:i], c.subs[i+1:]...)
			return
		}
	}
}

// ForgetDeleted drops the memory of deletions older than rev (called now and
// then to bound memory).
func (c *Cache[T]) ForgetDeleted(rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, r := range c.gone {
		if r < rev {
			delete(c.gone, k)
		}
	}
}

// Subscription is an unbounded queue of changes; C signals that Drain has
// something.
type Subscription[T any] struct {
	mu     sync.Mutex
	queue  []Change[T]
	signal chan struct{}
	// signalOnly keeps no changes (Changes).
	signalOnly bool
}

func (s *Subscription[T]) push(ch Change[T]) {
	if !s.signalOnly {
		s.mu.Lock()
		s.queue = append(s.queue, ch)
		s.mu.Unlock()
	}
	s.notify()
}

func (s *Subscription[T]) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// C receives a value when changes are waiting.
func (s *Subscription[T]) C() <-chan struct{} { return s.signal }

// Drain takes every waiting change.
func (s *Subscription[T]) Drain() []Change[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

// List reads every record of the bucket once (without keeping a watch).
// With the store's JetStream context it pulls the last message of every
// key from the bucket's stream in large batches, and decodes each batch on
// every core while the next one comes (a watch, pushed with flow control
// and decoded one at a time, read 100,000 records in about 3 s); without,
// it watches.
func (s *Store[T]) List(ctx context.Context) ([]Entry[T], error) {
	out, err := list(ctx, s, listBatch, func(r *rawRecord, v T) Entry[T] { return Entry[T]{Key: r.key, Value: v, Revision: r.rev} })
	s.noteGone(err)
	return out, err
}

// Values lists the records as List does, without their keys and
// revisions: what a table of them needs, in one copy less.
func (s *Store[T]) Values(ctx context.Context) ([]T, error) {
	out, err := list(ctx, s, listBatch, func(_ *rawRecord, v T) T { return v })
	s.noteGone(err)
	return out, err
}

// list reads every record of a store, each made into an E, pulling
// batches of batchSize.
func list[T, E any](ctx context.Context, s *Store[T], batchSize int, as func(*rawRecord, T) E) ([]E, error) {
	if s.js == nil {
		raws, err := s.watchList(ctx)
		if err != nil {
			return nil, err
		}
		return decodeAll(raws, as), nil
	}
	var (
		parts []*[]E
		err   error
	)
	// A cluster between two leaders, or a server that has just started,
	// may fail a listing ("no responders"): it is made again from the
	// start, as an operator would run `nodepool list` again.
	for failures := 0; ; failures++ {
		var wg sync.WaitGroup
		parts = nil
		err = s.pullLast(ctx, batchSize, func(batch []rawRecord) {
			part := new([]E)
			parts = append(parts, part)
			wg.Go(func() { *part = decodeAll(batch, as) })
		})
		wg.Wait()
		if err == nil || !natsretry.Transient(err) || ctx.Err() != nil || failures+1 >= listTries {
			break
		}
		if !wait.Sleep(ctx, wait.Backoff(failures)) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if len(parts) == 1 {
		return *parts[0], nil
	}
	n := 0
	for _, p := range parts {
		n += len(*p)
	}
	out := make([]E, 0, n)
	for _, p := range parts {
		out = append(out, *p...)
	}
	return out, nil
}

// rawRecord is a record as the stream holds it, not decoded yet.
type rawRecord struct {
	key  string
	data []byte
	rev  uint64
}

// listTries is how many times a listing that failed for a passing
// reason (natsretry.Transient) is made, listBatch how many messages one
// pull of List asks for, listIdle how
// long the server keeps the consumer of a pull that stopped,
// listResets how many times a pull may make its consumer again (every
// fetch does once), and listFetchWait how long one fetch, of messages
// that are all there, may take.
const (
	listTries     = 5
	listBatch     = 10000
	listIdle      = 30 * time.Second
	listResets    = 3
	listFetchWait = 20 * time.Second
)

// pullLast reads the last value of every key of the store, deletions left
// out, in the stream's order, and hands them to each as they come, one
// fetch of at most batchSize messages at a time (a batch is each's to
// keep).
func (s *Store[T]) pullLast(ctx context.Context, batchSize int, each func([]rawRecord)) error {
	bucket := s.kv.Bucket()
	prefix := "$KV." + bucket + "."
	cons, err := s.js.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + cmp.Or(s.keys, ">")}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		// Deleted once the records are read; the server forgets one left
		// behind (a process killed meanwhile) after this.
		InactiveThreshold: listIdle,
		// An ordered consumer makes a new server-side consumer for every
		// fetch, and by default retries that forever (whatever the
		// context says): a stream without a leader would hang the list.
		MaxResetAttempts: listResets,
	})
	if err != nil {
		return fmt.Errorf("listing %s: %w", bucket, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("listing %s: %w", bucket, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = s.js.DeleteConsumer(dctx, "KV_"+bucket, cons.CachedInfo().Name)
	}()
	left := info.NumPending
	for left > 0 {
		fctx, cancel := context.WithTimeout(ctx, listFetchWait)
		batch, err := cons.Fetch(int(min(left, uint64(batchSize))), jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return fmt.Errorf("listing %s: %w", bucket, err)
		}
		out := make([]rawRecord, 0, min(left, uint64(batchSize)))
		for m := range batch.Messages() {
			left--
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if md.NumPending == 0 {
				left = 0 // the last key's (keys deleted since the start are not counted)
			}
			if m.Headers().Get(kvOperationHeader) != "" {
				continue // a deletion or a purge
			}
			out = append(out, rawRecord{key: strings.TrimPrefix(m.Subject(), prefix), data: m.Data(), rev: md.Sequence.Stream})
		}
		cancel()
		if err := batch.Error(); err != nil {
			return fmt.Errorf("listing %s: %w", bucket, err)
		}
		each(out)
	}
	return nil
}

// kvOperationHeader marks a bucket's deletions and purges.
const kvOperationHeader = "KV-Operation"

// watchList reads the records with a watch.
func (s *Store[T]) watchList(ctx context.Context) ([]rawRecord, error) {
	w, err := s.watch(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []rawRecord
	for {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return out, errors.New("watch closed before listing finished")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, rawRecord{key: e.Key(), data: e.Value(), rev: e.Revision()})
		}
	}
}

// decodeAll decodes records on every core, in their order, each made
// into an E; a record that does not decode is left out (the watches
// report those).
func decodeAll[T, E any](raws []rawRecord, as func(*rawRecord, T) E) []E {
	out := make([]E, len(raws))
	ok := make([]bool, len(raws))
	workers := min(runtime.GOMAXPROCS(0), max(1, len(raws)/1000))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(raws); i += workers {
				r := &raws[i]
				v, err := Decode[T](r.key, r.data)
				if err != nil {
					continue
				}
				out[i], ok[i] = as(r, v), true
			}
		})
	}
	wg.Wait()
	n := 0
	for i := range out {
		if ok[i] {
			out[n] = out[i]
			n++
		}
	}
	clear(out[n:])
	return out[:n]
}

// Modify changes a record like Store.Modify, but starts from the cached
// revision (saving a read when the cache is current) and applies the result
// to the cache. fn gets a private copy it may change freely. When fn refuses
// the cached copy, it is asked again with a fresh read, as the cache may be
// behind.
func (c *Cache[T]) Modify(ctx context.Context, key string, fn func(*T) error) (Entry[T], error) {
	if cached, ok := c.Get(key); ok {
		v, err := clone(&cached.Value)
		if err != nil {
			return cached, err
		}
		if fn(v) != nil {
			return c.modifyFresh(ctx, key, fn)
		}
		rev, err := c.store.Update(ctx, key, v, cached.Revision)
		if err == nil {
			e := Entry[T]{Key: key, Value: *v, Revision: rev}
			c.Apply(e)
			return e, nil
		}
		if !errors.Is(err, ErrConflict) {
			return cached, err
		}
	}
	return c.modifyFresh(ctx, key, fn)
}

func (c *Cache[T]) modifyFresh(ctx context.Context, key string, fn func(*T) error) (Entry[T], error) {
	e, err := c.store.Modify(ctx, key, fn)
	if err == nil {
		c.Apply(e)
	}
	return e, err
}

// Create writes a new record and applies it to the cache.
func (c *Cache[T]) Create(ctx context.Context, key string, v *T) (Entry[T], error) {
	rev, err := c.store.Create(ctx, key, v)
	return c.wrote(key, v, rev, err)
}

// CreateNew writes a record like Store.CreateNew (a key that was deleted
// lately counts as existing) and applies it to the cache.
func (c *Cache[T]) CreateNew(ctx context.Context, key string, v *T) (Entry[T], error) {
	rev, err := c.store.CreateNew(ctx, key, v)
	return c.wrote(key, v, rev, err)
}

// Delete removes a record at a revision, and from the cache at once.
func (c *Cache[T]) Delete(ctx context.Context, key string, rev uint64) error {
	if err := c.store.Delete(ctx, key, rev); err != nil {
		return err
	}
	c.remove(key, rev)
	return nil
}

// Update writes a record at a revision and applies it to the cache.
func (c *Cache[T]) Update(ctx context.Context, key string, v *T, rev uint64) (Entry[T], error) {
	nrev, err := c.store.Update(ctx, key, v, rev)
	return c.wrote(key, v, nrev, err)
}

// wrote applies a write of v at revision rev to the cache, unless it
// failed with err.
func (c *Cache[T]) wrote(key string, v *T, rev uint64, err error) (Entry[T], error) {
	if err != nil {
		return Entry[T]{}, err
	}
	e := Entry[T]{Key: key, Value: *v, Revision: rev}
	c.Apply(e)
	return e, nil
}

// Cloner is implemented by records that copy themselves deeply, faster
// than the JSON round trip clone falls back to.
type Cloner[T any] interface {
	Clone() T
}

func clone[T any](v *T) (*T, error) {
	if c, ok := any(v).(Cloner[T]); ok {
		out := c.Clone()
		return &out, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := new(T)
	if err := json.Unmarshal(data, out); err != nil {
		return nil, err
	}
	return out, nil
}
