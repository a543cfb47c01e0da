// Package zkbridge serves Zuul over ZooKeeper: to Zuul (and to the Python
// Nodepool launchers beside it in the ensemble) it is a Nodepool launcher,
// one registered pool per provider pool of nodepool.yaml. It turns each
// request Zuul writes under /nodepool/requests into a request of the NATS
// pipeline, so that Zuul's requests and NATS clients' share pools, quota,
// priority and min-ready; it writes the fulfilled request and its nodes
// back to ZooKeeper as Nodepool does, and follows what Zuul does with the
// nodes (their locks, in-use, used, hold) back into the node records.
//
// There is no transaction across ZooKeeper and NATS. Every decision is
// made by one idempotent reconciliation of a record (a request, a node)
// from both sides as they are now, run on every change and by a periodic
// sweep; ZooKeeper's kazoo-compatible locks and version checks guard the
// Zuul-facing writes, and revision checks the NATS ones. So any number of
// bridge processes may run at once, and any may be killed at any instant:
// the others (or it, restarted) carry on from the records.
package zkbridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Options configure a bridge.
type Options struct {
	// ID is this process's identity (NODEPOOL_ID).
	ID string
	// Config is the loaded nodepool.yaml; it must name zookeeper-servers.
	Config *config.Config
	// Views are the process's caches of nodes, requests and components,
	// shared with its other roles; nil: the bridge keeps caches of its
	// own.
	Views *kv.Views
	// SyncInterval is the period of the reconciliation sweep.
	SyncInterval time.Duration
	// Version is reported in the pool registrations.
	Version string
	Log     *slog.Logger
	// Workers is how many records are reconciled at once (default 32).
	Workers int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Bridge is one process's share of serving Zuul over ZooKeeper.
type Bridge struct {
	opts Options
	b    *kv.Buckets
	log  *slog.Logger
	cfg  atomic.Pointer[config.Config]

	nodes      *kv.Cache[kv.Node]
	requests   *kv.Cache[kv.Request]
	components *kv.Cache[kv.Component]

	queue *queue
	tree  *tree
	pools *registry

	// identifier is the data of this process's lock contenders: a bridge
	// process knows another one's locks by it.
	identifier string
	hostname   string

	mu     sync.Mutex
	conn   *Conn
	runCtx context.Context
	held   map[string]*Lock // request locks this process holds, by request id
	wg     sync.WaitGroup

	// reported remembers records already reported as unusable (by key
	// and version), so that the log says so once.
	reported sync.Map
	// foreignNodes remembers node znodes of other launchers' providers.
	foreignNodes sync.Map
	// sightings counts, by key, what the sweep found that may be left
	// over by a process that died (acted on at the second sighting).
	sightings map[string]int
	// retries counts, by key, the reconciliations in a row that asked to
	// be tried again (errRetry), so that one that keeps asking is logged.
	retries sync.Map

	running atomic.Bool
	reload  chan struct{}
}

// LockIdentifierPrefix begins the data of every lock contender of a
// bridge process.
const LockIdentifierPrefix = "nodepool-nats "

// New prepares a bridge; Run starts it.
func New(b *kv.Buckets, opts Options) (*Bridge, error) {
	if opts.ID == "" {
		return nil, errors.New("zookeeper bridge needs an id")
	}
	if opts.Config == nil || opts.Config.ZooKeeper() == nil {
		return nil, errors.New("zookeeper bridge needs a configuration naming zookeeper-servers")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = 5 * time.Second
	}
	if opts.Workers <= 0 {
		opts.Workers = 32
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "nodepool"
	}
	log := opts.Log.With("role", config.RoleZooKeeper)
	br := &Bridge{
		opts: opts, b: b, log: log,
		nodes:      opts.Views.Nodes(b, log),
		requests:   opts.Views.Requests(b, log),
		components: opts.Views.Components(b, log),
		queue:      newQueue(), tree: newTree(), pools: newRegistry(),
		identifier: LockIdentifierPrefix + opts.ID, hostname: host,
		held: map[string]*Lock{}, sightings: map[string]int{},
		reload: make(chan struct{}, 1),
	}
	br.cfg.Store(opts.Config)
	return br, nil
}

// Nodes is the bridge's view of the nodes bucket.
func (br *Bridge) Nodes() *kv.Cache[kv.Node] { return br.nodes }

// Requests is the bridge's view of the requests bucket.
func (br *Bridge) Requests() *kv.Cache[kv.Request] { return br.requests }

// Components is the bridge's view of the components bucket.
func (br *Bridge) Components() *kv.Cache[kv.Component] { return br.components }

// Running reports whether the bridge has a ZooKeeper session and serves.
func (br *Bridge) Running() bool { return br.running.Load() }

// config is the configuration in force.
func (br *Bridge) config() *config.Config { return br.cfg.Load() }

// Reload makes a new configuration the bridge's: its pools are registered
// again as they now are; another ensemble (zookeeper-servers, TLS,
// timeout) makes it start a new session there.
func (br *Bridge) Reload(cfg *config.Config) error {
	if cfg.ZooKeeper() == nil {
		return errors.New("the zookeeper role is running and the new configuration names no zookeeper-servers; restart nodepool with other roles to stop serving Zuul")
	}
	br.cfg.Store(cfg)
	select {
	case br.reload <- struct{}{}:
	default:
	}
	return nil
}

// Run serves Zuul until ctx ends. It keeps a ZooKeeper session (dialled
// again after a reload that names another ensemble); a clean stop
// releases every lock and registration at once by closing the session.
func (br *Bridge) Run(ctx context.Context) error {
	// The process's views may be shared with its other roles
	// (Options.Views).
	for _, stop := range []func(){br.nodes.Start(), br.requests.Start(), br.components.Start()} {
		defer stop()
	}
	for _, c := range []interface{ WaitSynced(context.Context) error }{br.nodes, br.requests, br.components} {
		if err := c.WaitSynced(ctx); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return err
		}
	}
	for ctx.Err() == nil {
		zkc := br.config().ZooKeeper()
		conn, err := br.dial(ctx, zkc)
		if err != nil {
			return err
		}
		again := br.serve(ctx, conn, zkc)
		if !again {
			break
		}
		br.log.Info("zookeeper-servers changed; connecting to the new ensemble")
	}
	return nil
}

// dial connects to ZooKeeper, trying again until ctx ends.
func (br *Bridge) dial(ctx context.Context, zkc *config.ZooKeeper) (*Conn, error) {
	if zkc.TLS == nil {
		br.log.Warn("connecting to ZooKeeper without TLS: nodepool.yaml has no zookeeper-tls (Nodepool 4 and later refuse such a connection)")
	}
	for failures := 0; ; failures++ {
		dctx, cancel := context.WithTimeout(ctx, max(zkc.Timeout, 5*time.Second))
		conn, err := Dial(dctx, zkc, br.log)
		cancel()
		if err == nil {
			br.log.Info("connected to ZooKeeper", "servers", strings.Join(zkc.Addrs(), ","), "chroot", zkc.Chroot, "tls", zkc.TLS != nil, "session", fmt.Sprintf("%#x", conn.Session()))
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		br.log.Warn("cannot connect to ZooKeeper; trying again", "err", err)
		if !wait.Sleep(ctx, min(wait.Backoff(failures), 5*time.Second)) {
			return nil, ctx.Err()
		}
	}
}

// serve runs the bridge on one connection until ctx ends (false) or the
// configuration names another ensemble (true).
func (br *Bridge) serve(ctx context.Context, conn *Conn, zkc *config.ZooKeeper) bool {
	sctx, cancel := context.WithCancel(ctx)
	br.mu.Lock()
	br.conn, br.runCtx = conn, sctx
	br.held = map[string]*Lock{}
	br.mu.Unlock()
	br.queue = newQueue()
	br.tree = newTree()
	br.pools = newRegistry()

	var workers sync.WaitGroup
	for range br.opts.Workers {
		workers.Go(func() { br.work(sctx) })
	}
	br.wg.Go(func() { br.watchRequests(sctx, conn) })
	br.wg.Go(func() { br.watchPools(sctx, conn) })
	br.wg.Go(func() { br.followNATS(sctx) })
	br.wg.Go(func() { br.keepRegistered(sctx, conn) })
	br.wg.Go(func() { br.sweepLoop(sctx) })
	br.running.Store(true)
	br.log.Info("serving Zuul over ZooKeeper", "pools", len(br.ourPools()))

	again := false
	for !again {
		select {
		case <-ctx.Done():
		case <-br.reload:
			if reflect.DeepEqual(br.config().ZooKeeper(), zkc) {
				br.pools.changed()
				continue
			}
			again = true
		}
		break
	}
	br.running.Store(false)
	cancel()
	br.queue.stop()
	workers.Wait()
	br.wg.Wait()
	// Closing the session releases this process's request locks and pool
	// registrations at once: the other bridge processes (or Nodepool's
	// launchers) take over without waiting for the session to expire.
	conn.Close()
	br.log.Info("stopped serving Zuul over ZooKeeper")
	return again && ctx.Err() == nil
}

// Keys of the work queue.
func requestKey(zkID string) string { return "r:" + zkID }
func nodeKey(natsID string) string  { return "n:" + natsID }

// work reconciles queued keys until ctx ends.
func (br *Bridge) work(ctx context.Context) {
	for {
		key, ok := br.queue.get(ctx)
		if !ok {
			return
		}
		br.process(ctx, key)
		br.queue.done(key)
	}
}

// retryDelay is how soon a reconciliation that could not finish (a lock
// held by another, a call that failed) is tried again.
const retryDelay = 250 * time.Millisecond

// process reconciles one key. A reconciliation that panics is a bug: it is
// logged with the record's key and stack, and the key is tried again later
// (the process goes on with every other record).
func (br *Bridge) process(ctx context.Context, key string) {
	defer func() {
		if p := recover(); p != nil {
			br.log.Error("reconciling a record panicked (a bug, please report it); trying it again later", "key", key, "panic", p, "stack", string(debug.Stack()))
			br.queue.addAfter(key, 30*time.Second)
		}
	}()
	var err error
	switch kind, id, _ := strings.Cut(key, ":"); kind {
	case "r":
		err = br.reconcileRequest(ctx, id)
	case "n":
		err = br.reconcileNode(ctx, id)
	case "o":
		err = br.reconcileOrphan(ctx, id)
	case "p":
		err = br.resetPending(id)
	}
	if err == nil || !errors.Is(err, errRetry) {
		br.retries.Delete(key)
	}
	if err != nil && ctx.Err() == nil {
		if errors.Is(err, errRetry) {
			br.retriedAgain(key, err)
			br.queue.addAfter(key, retryDelay)
			return
		}
		br.log.Debug("reconciliation failed; trying again", "key", key, "err", err)
		br.queue.addAfter(key, time.Second)
	}
}

// errRetry asks for a key to be looked at again shortly (a lock another
// contender holds, a record another writer changed).
var errRetry = errors.New("try again shortly")

// retriesLogged is how many retries in a row of one key (about 10 s of
// them) make a log line, and then every as many again: a record that
// keeps waiting on something is worth an operator's look.
const retriesLogged = 40

// retriedAgain counts a retry of key and logs every retriesLogged-th.
func (br *Bridge) retriedAgain(key string, err error) {
	v, _ := br.retries.LoadOrStore(key, new(atomic.Int64))
	if n := v.(*atomic.Int64).Add(1); n%retriesLogged == 0 {
		br.log.Info("a record is still waiting to be reconciled; trying again", "key", key, "tries", n, "why", err)
	}
}

// followNATS queues what changes of the NATS records concern: requests
// made for ZooKeeper requests, and nodes handed to Zuul.
func (br *Bridge) followNATS(ctx context.Context) {
	reqs := br.requests.Subscribe()
	defer br.requests.Unsubscribe(reqs)
	nodes := br.nodes.Subscribe()
	defer br.nodes.Unsubscribe(nodes)
	comps := br.components.Subscribe()
	defer br.components.Unsubscribe(comps)
	for {
		select {
		case <-ctx.Done():
			return
		case <-reqs.C():
			for _, ch := range reqs.Drain() {
				if zkID, ok := ZKRequestID(ch.Key); ok {
					br.queue.add(requestKey(zkID))
				}
			}
		case <-nodes.C():
			for _, ch := range nodes.Drain() {
				br.nodeChanged(ch)
			}
		case <-comps.C():
			comps.Drain()
			br.pools.changed() // a pool paused or resumed: registrations follow
		}
	}
}

// nodeChanged queues a NATS node that is or was Zuul's, and the request
// it is allocated to.
func (br *Bridge) nodeChanged(ch kv.Change[kv.Node]) {
	for _, e := range []*kv.Entry[kv.Node]{ch.Old, ch.New} {
		if e == nil {
			continue
		}
		if e.Value.ZooKeeperID != "" {
			br.queue.add(nodeKey(ch.Key))
			if ch.New != nil {
				br.followNode(e.Value.ZooKeeperID, ch.Key)
			}
		}
		if zkID, ok := ZKRequestID(e.Value.AllocatedTo); ok {
			br.queue.add(requestKey(zkID))
		}
	}
}

// heldLock is the lock of a request this process holds, if it is still
// valid; an invalid one (its session expired) is forgotten.
//
// A lock is forgotten only once its session is gone. While the connection
// is down too long to trust the session (Conn.Trusted), the lock is not
// used but kept: once the session is back (a ZooKeeper server's restart
// within the session timeout), its contender is still there and still
// this process's, and a process that had forgotten it would take it for
// another bridge process's and leave the request pending for as long as
// the session lives.
func (br *Bridge) heldLock(zkID string) *Lock {
	br.mu.Lock()
	defer br.mu.Unlock()
	l := br.held[zkID]
	switch {
	case l == nil:
		return nil
	case l.session != l.c.Session():
		delete(br.held, zkID)
		l.forget() // gone with its session
		return nil
	case !l.Valid():
		return nil
	}
	return l
}

func (br *Bridge) hold(zkID string, l *Lock) {
	br.mu.Lock()
	defer br.mu.Unlock()
	br.held[zkID] = l
}

// release gives a request lock up.
func (br *Bridge) release(zkID string) {
	br.mu.Lock()
	l := br.held[zkID]
	delete(br.held, zkID)
	br.mu.Unlock()
	if l != nil {
		if err := l.Release(); err != nil {
			br.log.Warn("could not release a request lock; it goes with the session", "request", zkID, "err", err)
		}
	}
}

// now is the bridge's clock.
func (br *Bridge) now() time.Time { return br.opts.Now() }

// reportOnce logs a record that cannot be used, once per version.
func (br *Bridge) reportOnce(key string, version int32, msg string, args ...any) {
	if _, dup := br.reported.LoadOrStore(fmt.Sprintf("%s@%d", key, version), true); dup {
		return
	}
	br.log.Warn(msg, args...)
}
