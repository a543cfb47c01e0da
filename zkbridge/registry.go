package zkbridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// registry holds the pools registered under /nodepool/components/pool
// (every launcher's, this one's included), and this process's own
// registrations.
type registry struct {
	mu   sync.Mutex
	all  map[string]PoolComponent // by child name
	read bool                     // listed at least once
	// mine are this process's registrations, by pool id: the child it
	// created and what it wrote there.
	mine    map[string]ownRegistration
	session int64
	dirty   chan struct{}
	// regMu is held while registrations are written, so that a
	// registration being made is not taken for a leftover.
	regMu sync.Mutex
}

type ownRegistration struct {
	path string
	data []byte
}

func newRegistry() *registry {
	return &registry{all: map[string]PoolComponent{}, mine: map[string]ownRegistration{}, dirty: make(chan struct{}, 1)}
}

// changed asks for the registrations to be written again as they should
// be now.
func (r *registry) changed() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// ids lists the ids of every registered pool.
func (r *registry) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, pc := range r.all {
		if !slices.Contains(out, pc.ID) {
			out = append(out, pc.ID)
		}
	}
	return out
}

// others lists the pools registered by other launchers (not this
// installation's, whose ids are in ours).
func (r *registry) others(ours map[string]bool) []PoolComponent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []PoolComponent
	for _, pc := range r.all {
		if !ours[pc.ID] {
			out = append(out, pc)
		}
	}
	return out
}

// ourPool is a provider pool of this file as the bridge registers it.
type ourPool struct {
	id       string
	provider string
	pool     string
	labels   []string
	priority int
}

// PoolID is the id under which every bridge process registers a provider
// pool: the same in every process, so that one decline of the
// installation counts for all of them, as one Nodepool launcher's does.
func PoolID(provider, pool string) string {
	return fmt.Sprintf("nodepool-nats-PoolWorker.%s-%s", provider, pool)
}

// ourPools lists the pools this bridge registers: every pool of the file
// that takes requests, with its labels that may be launched (a pool
// disabled with max-servers 0 and a label with min-ready -1 take none).
func (br *Bridge) ourPools() []ourPool {
	cfg := br.config()
	var out []ourPool
	for _, p := range cfg.Providers {
		for _, pool := range p.Pools {
			if pool.Disabled() {
				continue
			}
			op := ourPool{id: PoolID(p.Name, pool.Name), provider: p.Name, pool: pool.Name, priority: pool.Priority}
			for _, l := range poolLabels(cfg, &p, &pool) {
				if lb, ok := cfg.Label(l); ok && lb.Disabled() {
					continue
				}
				op.labels = append(op.labels, l)
			}
			if len(op.labels) > 0 {
				out = append(out, op)
			}
		}
	}
	return out
}

// poolLabels lists the labels a pool provides (a static pool's come from
// its hosts).
func poolLabels(cfg *config.Config, p *config.Provider, pool *config.Pool) []string {
	var out []string
	for _, pl := range pool.Labels {
		if !slices.Contains(out, pl.Name) {
			out = append(out, pl.Name)
		}
	}
	for _, h := range pool.Nodes {
		for _, l := range h.Labels {
			if !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// ourPoolIDs is the set of this installation's pool ids.
func (br *Bridge) ourPoolIDs() map[string]bool {
	out := map[string]bool{}
	for _, p := range br.ourPools() {
		out[p.id] = true
	}
	return out
}

// watchPools follows the registered pools until ctx ends: their children
// when they change, and every pool's data at every sweep.
func (br *Bridge) watchPools(ctx context.Context, conn *Conn) {
	tick := time.NewTicker(br.opts.SyncInterval)
	defer tick.Stop()
	for failures := 0; ctx.Err() == nil; {
		if err := conn.Ensure(PoolsPath); err != nil {
			failures++
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		children, _, ch, err := conn.ChildrenW(PoolsPath)
		if err != nil {
			failures++
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		failures = 0
		br.readPools(conn, children)
	waiting:
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				break waiting
			case <-tick.C:
				// A pool's data (its pause) changes without its children
				// changing: read them again, keeping the watch.
				if children, _, err := conn.Children(PoolsPath); err == nil {
					br.readPools(conn, children)
				}
			}
		}
	}
}

// readPools reads every registered pool. A registration of this session
// that this process does not know of (made by a create whose answer was
// lost) is deleted: it would stay for as long as the session lives.
func (br *Bridge) readPools(conn *Conn, children []string) {
	all := map[string]PoolComponent{}
	br.pools.mu.Lock()
	old := br.pools.all
	br.pools.mu.Unlock()
	br.pools.regMu.Lock()
	defer br.pools.regMu.Unlock()
	known := map[string]bool{}
	br.pools.mu.Lock()
	for _, reg := range br.pools.mine {
		known[reg.path] = true
	}
	br.pools.mu.Unlock()
	for _, ch := range children {
		data, stat, err := conn.Get(PoolsPath + "/" + ch)
		if err == nil && stat.EphemeralOwner != 0 && stat.EphemeralOwner == conn.Session() && !known[PoolsPath+"/"+ch] {
			if conn.Delete(PoolsPath+"/"+ch, -1) == nil {
				br.log.Debug("deleted a registration left by a create whose answer was lost", "path", PoolsPath+"/"+ch)
				continue
			}
		}
		if err != nil {
			if pc, ok := old[ch]; ok && !errors.Is(err, zk.ErrNoNode) {
				all[ch] = pc // keep what was known through a failed read
			}
			continue
		}
		pc, err := ParsePoolComponent(data)
		if err != nil {
			br.reportOnce("pool:"+ch, 0, "a registered pool cannot be read; ignoring it", "path", PoolsPath+"/"+ch, "err", err)
			continue
		}
		all[ch] = *pc
	}
	br.pools.mu.Lock()
	br.pools.all, br.pools.read = all, true
	br.pools.mu.Unlock()
}

// keepRegistered registers this process's pools, and writes them again
// on every new session, every change of the configuration and every
// change of a pool's pause, until ctx ends.
func (br *Bridge) keepRegistered(ctx context.Context, conn *Conn) {
	sessions := conn.SessionChanges()
	tick := time.NewTicker(br.opts.SyncInterval)
	defer tick.Stop()
	for failures := 0; ctx.Err() == nil; {
		if err := br.register(conn); err != nil {
			failures++
			br.log.Debug("cannot register pools yet", "err", err)
			wait.Sleep(ctx, min(wait.Backoff(failures), 2*time.Second))
			continue
		}
		failures = 0
		select {
		case <-ctx.Done():
			return
		case <-sessions:
			// A new session after an expiry: the registrations went with
			// the old one; the locks too.
			br.sessionChanged()
		case <-br.pools.dirty:
		case <-tick.C:
		}
	}
}

// register makes this process's registrations what they should be.
func (br *Bridge) register(conn *Conn) error {
	br.pools.regMu.Lock()
	defer br.pools.regMu.Unlock()
	session := conn.Session()
	if session == 0 {
		return errors.New("no session")
	}
	paused := br.pausedPools()
	want := map[string][]byte{}
	for _, p := range br.ourPools() {
		pc := PoolComponent{Hostname: br.hostname, Kind: "pool", State: "running", Version: br.opts.Version,
			ModelAPI: 0, ID: p.id, Name: p.pool, ProviderName: p.provider, SupportedLabels: p.labels,
			Priority: p.priority, Paused: paused[kv.PoolRef(p.provider, p.pool)]}
		want[p.id] = pc.Encode()
	}
	br.pools.mu.Lock()
	if br.pools.session != session {
		br.pools.mine = map[string]ownRegistration{}
		br.pools.session = session
	}
	mine := br.pools.mine
	br.pools.mu.Unlock()
	var errs []error
	for id, reg := range mine {
		data, ok := want[id]
		switch {
		case !ok:
			if err := conn.Delete(reg.path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				errs = append(errs, err)
				continue
			}
			br.setMine(id, nil)
		case string(data) != string(reg.data):
			if _, err := conn.Set(reg.path, data, -1); err != nil {
				if errors.Is(err, zk.ErrNoNode) {
					br.setMine(id, nil) // gone (an operator?): made again below
					continue
				}
				errs = append(errs, err)
				continue
			}
			br.setMine(id, &ownRegistration{path: reg.path, data: data})
		}
	}
	br.pools.mu.Lock()
	mine = br.pools.mine
	br.pools.mu.Unlock()
	for id, data := range want {
		if _, ok := mine[id]; ok {
			continue
		}
		path, err := conn.Create(PoolsPath+"/"+br.hostname, data, zk.FlagEphemeral|zk.FlagSequence)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		br.setMine(id, &ownRegistration{path: path, data: data})
	}
	return errors.Join(errs...)
}

func (br *Bridge) setMine(id string, reg *ownRegistration) {
	br.pools.mu.Lock()
	defer br.pools.mu.Unlock()
	if reg == nil {
		delete(br.pools.mine, id)
		return
	}
	br.pools.mine[id] = *reg
}

// pausedPools says which pools wait on quota, as their launchers announce
// it in NATS (any announcement of a pause wins).
func (br *Bridge) pausedPools() map[string]bool {
	out := map[string]bool{}
	br.components.Range(func(e *kv.Entry[kv.Component]) bool {
		for _, p := range e.Value.Pools {
			if p.Paused {
				out[kv.PoolRef(p.Provider, p.Pool)] = true
			}
		}
		return true
	})
	return out
}

// sessionChanged drops what went with the old session: the locks this
// process held (another process may hold them now) and what was read
// under it; everything is looked at again.
func (br *Bridge) sessionChanged() {
	br.dropLocksOfOtherSessions()
	for _, id := range br.tree.requestIDs() {
		br.queue.add(requestKey(id))
	}
}

// dropLocksOfOtherSessions forgets the request locks of sessions other
// than the current one. The notice of a new session comes after workers
// may already have taken locks under it (registering the pools goes
// first): those are kept. Dropping them too left their contenders marked
// as held by this process (Conn's live), so that neither this process
// (AdoptOrphan does not adopt what a step holds) nor another could take
// the lock while the session lived: after a ZooKeeper restart, requests
// stayed pending or requested for minutes in
// TestZuulKillBridgesAndZooKeeper, both bridges finding them "locked by
// another contender".
func (br *Bridge) dropLocksOfOtherSessions() {
	br.mu.Lock()
	defer br.mu.Unlock()
	for id, l := range br.held {
		if l.session != l.c.Session() {
			delete(br.held, id)
			l.forget()
		}
	}
}
