package consumers

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// errLost means the node is no longer this process's to change.
var errLost = errors.New("node no longer owned by this launcher")

// lifecycle runs the create and delete state machines of nodes. The
// launches and deletes nodes need arrive on the work stream (work.go); a
// node is claimed with a revision-checked update that names this process
// as its launcher, and the message is acknowledged once the claim is
// committed. The claim lives as long as this process's heartbeat: when it
// stops, cleanup hands the node to another process, which resumes the
// machine from the node's driver_data.
//
// A change that takes a node from a machine running here (an operator's
// delete, a hand-over), seen by the process's watch, stops that machine
// before the node's next owner is recorded; a process that cannot renew
// its heartbeat in time stops every machine and claims nothing (fencing,
// see fence.go).
type lifecycle struct {
	l *Launcher

	mu       sync.Mutex
	runs     map[string]*run
	wg       sync.WaitGroup
	ctx      context.Context
	stopRuns context.CancelFunc

	semsMu sync.Mutex
	sems   map[string]*slots // launch slots per provider (slots.go)

	// panicked holds nodes whose machine panicked here, and when
	// (recover.go); guarded by mu.
	panicked map[string]time.Time

	// following and followAgain: nodes of machines running here being
	// looked at after a change, and those changed again meanwhile
	// (work.go, follow); guarded by mu.
	following, followAgain map[string]bool
}

// run is a machine running for a node.
type run struct {
	state kv.NodeState // the state the machine drives the node from
	// wrote is the state of the machine's latest write of the record,
	// noted before the write is sent (guarded by lifecycle.mu): a change
	// to it is the machine's own doing, not the node taken from it.
	wrote  kv.NodeState
	cancel context.CancelFunc
	// done is closed once the machine returned and the node was looked
	// at again.
	done chan struct{}
	// orphan is the instance a stopped create made, which the node may
	// not record; set before done is closed.
	orphan string
}

// machineStopWait is how long a handler waits for a machine it stopped
// before letting the change come back later.
const machineStopWait = 5 * time.Second

func newLifecycle(l *Launcher) *lifecycle {
	lc := &lifecycle{l: l, runs: map[string]*run{}, panicked: map[string]time.Time{}, sems: map[string]*slots{},
		following: map[string]bool{}, followAgain: map[string]bool{}}
	lc.ctx, lc.stopRuns = context.WithCancel(context.Background())
	return lc
}

// stop cancels the machines in flight and waits for them: each stops after
// persisting its current step.
func (lc *lifecycle) stop() {
	lc.stopRuns()
	lc.wg.Wait()
}

func (lc *lifecycle) ack(msg jetstream.Msg) {
	if err := msg.Ack(); err != nil {
		lc.l.log.Debug("ack failed; the change will be delivered again", "err", err)
	}
}

// errNotMine: the node needs work from a launcher that has its provider.
var errNotMine = errors.New("provider not configured here")

// errQuarantined: the node's machine panicked here a moment ago.
var errQuarantined = errors.New("the node's machine panicked here lately")

// errMachineStopping: a machine that lost its node has not stopped yet.
var errMachineStopping = errors.New("a machine of this node is still stopping")

// needsWork reports whether a node in this state needs a launcher's work
// (a create or a delete) that no live process does.
func (l *Launcher) needsWork(n *kv.Node) bool {
	switch n.State {
	case kv.NodeUsed, kv.NodeFailed, kv.NodeAborted:
		return true
	case kv.NodeBuilding, kv.NodeDeleting:
		return n.Launcher == "" || n.Launcher == l.opts.ID || !l.alive(n.Launcher)
	}
	return false
}

// reconcile starts whatever work a node in this state needs from this
// process, but a launch: a node waiting for a launcher is launched from
// its message on the work stream (work.go). See reconcileWith.
func (lc *lifecycle) reconcile(ctx context.Context, e kv.Entry[kv.Node], orphan string) error {
	return lc.reconcileWith(ctx, e, orphan, false)
}

// reconcileWith starts whatever work a node in this state needs from this
// process; held says that the caller took a launch slot of the node's
// provider for it (a launch message), which is given back or passed to
// the launch. It returns errNotMine when this process lacks the node's
// provider, and another error when a claim it should have written was not
// (the change must be looked at again). orphan, if set, is an instance a
// create machine of this process made for the node, which the record may
// not name yet: a delete claimed here records it, so it is deleted too.
func (lc *lifecycle) reconcileWith(ctx context.Context, e kv.Entry[kv.Node], orphan string, held bool) error {
	slot := held // a launch slot taken for this node
	defer func() {
		if slot {
			lc.release(e.Value.Provider)
		}
	}()
	// Act on the newest record this process has seen: the change may be
	// older than what the cache already holds.
	e = lc.newest(e)
	if r := lc.running(e.Key); r != nil {
		if lc.ownWrite(r, &e.Value) {
			// The machine's own write (ending the launch, say: it looks
			// at the node again when it returns), or nothing it must know.
			return nil
		}
		if err := lc.stopMachine(ctx, r); err != nil {
			return err
		}
		e = lc.newest(e)
		orphan = cmp.Or(orphan, r.orphan)
	}
	n := &e.Value
	if n.State == kv.NodeBuilding && n.Launcher != lc.l.opts.ID && !slot {
		// A launch is claimed with a slot taken first, so that a process
		// never claims more launches than it runs: its message brings it.
		return nil
	}
	drv, draining, err := lc.mayClaim(ctx, e)
	if err != nil || drv == nil {
		return err
	}
	if reg, ok := drivers.As[drivers.Registrar](drv); ok && n.State == kv.NodeUsed && !draining {
		return lc.reregister(ctx, e.Key, reg)
	}
	claimed, err := lc.claim(ctx, e, orphan)
	if err != nil || claimed == nil {
		return err
	}
	// The slot goes with a launch; a node that moved on to a delete
	// meanwhile gives it back.
	pass := slot && claimed.Value.State == kv.NodeBuilding
	lc.launch(*claimed, pass)
	slot = slot && !pass
	return nil
}

// newest is the newer of a node's change and what the cache holds.
func (lc *lifecycle) newest(e kv.Entry[kv.Node]) kv.Entry[kv.Node] {
	if cur, ok := lc.l.nodes.Get(e.Key); ok && cur.Revision > e.Revision {
		return cur
	}
	return e
}

// ownWrite tells whether a change of a node is its running machine's own
// doing, or nothing the machine must know.
func (lc *lifecycle) ownWrite(r *run, n *kv.Node) bool {
	return n.Launcher == lc.l.opts.ID && (n.State == r.state || n.State == lc.wrote(r))
}

// stopMachine stops a machine whose node was taken from it (an operator
// deleted it, cleanup handed it to another process, the launch ended)
// before anything else happens to the node, so that the change is
// acknowledged only once its next owner is recorded.
func (lc *lifecycle) stopMachine(ctx context.Context, r *run) error {
	r.cancel()
	select {
	case <-r.done:
		return nil
	case <-time.After(machineStopWait):
		return errMachineStopping
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mayClaim tells whether this process may claim a node for the work it
// needs, and gives the driver of its provider and whether that provider
// is draining. A nil driver and error: the node needs nothing from here.
func (lc *lifecycle) mayClaim(ctx context.Context, e kv.Entry[kv.Node]) (drivers.Provider, bool, error) {
	n := &e.Value
	if !lc.l.needsWork(n) {
		return nil, false, nil
	}
	if (n.State == kv.NodeBuilding || n.State == kv.NodeDeleting) && n.Launcher != "" && n.Launcher != lc.l.opts.ID && !lc.l.gone(ctx, n.Launcher) {
		return nil, false, nil // its launcher lives: the cache was behind
	}
	if lc.l.fenced() {
		return nil, false, errFenced
	}
	if lc.quarantined(e.Key) {
		return nil, false, errQuarantined
	}
	drv, draining, ok := lc.l.driverOf(n.Provider)
	if !ok || (n.State == kv.NodeBuilding && (draining || !lc.l.launchable(n))) {
		// Launchers may run different configurations: leave the node to
		// one that has its provider, pool and label. A removed provider's
		// driver deletes only, and a removed pool or label launches
		// nothing more (drain.go).
		return nil, false, errNotMine
	}
	return drv, draining, nil
}

// claim names this process the node's launcher with a revision-checked
// update (a used or failed node becomes deleting). It returns the claimed
// record, nil if there is nothing to claim, or the error of a claim that
// must be tried again.
func (lc *lifecycle) claim(ctx context.Context, e kv.Entry[kv.Node], orphan string) (*kv.Entry[kv.Node], error) {
	me := lc.l.opts.ID
	n := &e.Value
	state, launcher := n.State, n.Launcher
	claimed, err := lc.l.nodes.Modify(ctx, e.Key, func(cur *kv.Node) error {
		if cur.State != state || (cur.Launcher != launcher && cur.Launcher != me) {
			return kv.ErrSkip
		}
		cur.Launcher = me
		if cur.State != kv.NodeBuilding && cur.State != kv.NodeDeleting {
			cur.SetState(kv.NodeDeleting, lc.l.clock.Now().UTC())
			cur.DriverData = nil
		}
		if orphan != "" && cur.State == kv.NodeDeleting && cur.ExternalID == "" {
			cur.ExternalID, cur.DriverData = orphan, nil
		}
		return nil
	})
	switch {
	case errors.Is(err, kv.ErrSkip) && claimedEarlier(claimed.Value, me):
		// An earlier claim of this process whose answer did not come in
		// time landed all the same (a loaded cluster): the node is ours,
		// and no later change of it may come to this process to say so.
		return &claimed, nil
	case errors.Is(err, kv.ErrSkip), errors.Is(err, kv.ErrNotFound):
		return nil, nil
	case err != nil:
		lc.l.log.Warn("could not claim node", "node", e.Key, "err", err)
		if errors.Is(err, kv.ErrBadRecord) {
			return nil, nil // the change that made it so is handled on its own
		}
		return nil, err
	}
	if state == kv.NodeUsed {
		lc.l.log.Info("node returned", "node", e.Key, "provider", n.Provider, "pool", n.Pool,
			"label", createRequest(n).Label, "request", n.AllocatedTo, "holder", n.Holder)
	}
	return &claimed, nil
}

// claimedEarlier: the node is already this process's to create or delete.
func claimedEarlier(n kv.Node, me string) bool {
	return n.Launcher == me && (n.State == kv.NodeBuilding || n.State == kv.NodeDeleting)
}

// reregister puts a used node of a Registrar driver (a static host) back in
// line for service instead of deleting it.
func (lc *lifecycle) reregister(ctx context.Context, id string, reg drivers.Registrar) error {
	_, err := lc.l.nodes.Modify(ctx, id, func(n *kv.Node) error {
		if n.State != kv.NodeUsed {
			return kv.ErrSkip
		}
		reg.Reregister(n, lc.l.clock.Now().UTC())
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		lc.l.log.Warn("could not re-register node", "node", id, "err", err)
		return err
	}
	return nil
}

// noteWrite records the state a machine's write is about to give its node.
func (lc *lifecycle) noteWrite(id string, state kv.NodeState) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if r := lc.runs[id]; r != nil {
		r.wrote = state
	}
}

// wrote is the state of a machine's latest write.
func (lc *lifecycle) wrote(r *run) kv.NodeState {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return r.wrote
}

// running returns the machine running for a node, if any.
func (lc *lifecycle) running(id string) *run {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.runs[id]
}

// launch starts the machine a claimed node needs, unless one runs already.
// slot tells whether the caller already holds a launch slot for it, which
// the machine then releases.
func (lc *lifecycle) launch(e kv.Entry[kv.Node], slot bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if _, ok := lc.runs[e.Key]; ok || lc.ctx.Err() != nil || lc.l.fenced() {
		if slot {
			lc.release(e.Value.Provider)
		}
		return
	}
	ctx, cancel := context.WithCancel(lc.ctx)
	r := &run{state: e.Value.State, cancel: cancel, done: make(chan struct{})}
	lc.runs[e.Key] = r
	lc.wg.Go(func() {
		orphan := ""
		defer func() {
			lc.mu.Lock()
			delete(lc.runs, e.Key)
			lc.mu.Unlock()
			cancel()
			// Changes that arrived while the machine ran were passed
			// over; look at the node once more (a launch that failed
			// leaves it failed, to be deleted; a node deleted under its
			// create is claimed here, with the instance the create made).
			if cur, ok := lc.l.nodes.Get(e.Key); ok && lc.ctx.Err() == nil {
				if err := lc.reconcile(lc.ctx, cur, orphan); err != nil {
					lc.l.log.Debug("node left for the change to come back", "node", e.Key, "err", err)
				}
			}
			r.orphan = orphan
			close(r.done)
		}()
		defer func() {
			if p := recover(); p != nil {
				lc.machinePanicked(e, p)
			}
		}()
		if e.Value.State == kv.NodeBuilding {
			// max-concurrency bounds launches in flight; deletes free
			// capacity and are never held back.
			if !slot && !lc.acquire(ctx, e.Value.Provider) {
				return
			}
			defer lc.release(e.Value.Provider)
		}
		// The machine keeps the driver (and its configuration) it starts
		// with, whatever a reload does meanwhile.
		u, ok := lc.l.use(e.Value.Provider)
		if !ok {
			lc.handOverNode(ctx, e.Key, "provider no longer configured here; handing the node over")
			return
		}
		defer u.done()
		switch e.Value.State {
		case kv.NodeBuilding:
			orphan = lc.runCreate(ctx, e, u)
		case kv.NodeDeleting:
			lc.runDelete(ctx, e, u)
		}
	})
}

func (lc *lifecycle) acquire(ctx context.Context, provider string) bool {
	return lc.slotsOf(provider).take(ctx)
}

func (lc *lifecycle) release(provider string) {
	lc.slotsOf(provider).give()
}

// resumeOwn restarts the machines of nodes this process owned before a
// restart (same NODEPOOL_ID).
func (lc *lifecycle) resumeOwn(ctx context.Context) {
	var own []kv.Entry[kv.Node]
	lc.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Launcher == lc.l.opts.ID && (e.Value.State == kv.NodeBuilding || e.Value.State == kv.NodeDeleting) {
			own = append(own, *e)
		}
		return true
	})
	lc.resumeAll(ctx, own, func(ctx context.Context, e kv.Entry[kv.Node]) {
		if err := lc.reconcile(ctx, e, ""); err != nil {
			lc.l.log.Debug("could not resume node; its change or cleanup brings it back", "node", e.Key, "err", err)
		}
	})
}

// resumeParallel bounds how many nodes resumeAll resumes at once.
const resumeParallel = 8

// resumeAll runs resume for each node, resumeParallel at a time, and
// returns when every one has returned: after a fence, or a cluster busy
// electing leaders, each resumption's writes may take a second, and a
// process resuming its nodes one after the other left the last of ten
// waiting ten seconds (TestClusterNodesLeaderKilled, a node deleting for
// 22 s).
func (lc *lifecycle) resumeAll(ctx context.Context, nodes []kv.Entry[kv.Node], resume func(context.Context, kv.Entry[kv.Node])) {
	sem := make(chan struct{}, resumeParallel)
	var wg sync.WaitGroup
	for _, e := range nodes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resume(ctx, e)
		})
	}
	wg.Wait()
}

// watchOwn resumes, every sync interval, the nodes that name this process
// as their launcher but have no machine running here, once seen so at one
// revision twice in a row (a follow-up that could not be written, a
// machine that ended without leaving the node).
func (lc *lifecycle) watchOwn(ctx context.Context) {
	stalled := map[string]sighting{}
	for wait.Sleep(ctx, lc.l.opts.SyncInterval) {
		if lc.l.fenced() {
			continue
		}
		var due []kv.Entry[kv.Node]
		seen := map[string]bool{}
		lc.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			n := &e.Value
			if n.Launcher != lc.l.opts.ID || (n.State != kv.NodeBuilding && n.State != kv.NodeDeleting) || lc.running(e.Key) != nil {
				return true
			}
			seen[e.Key] = true
			s := stalled[e.Key]
			if s.rev != e.Revision {
				s = sighting{rev: e.Revision}
			}
			s.n++
			stalled[e.Key] = s
			if s.n >= 2 {
				due = append(due, *e)
			}
			return true
		})
		for id := range stalled {
			if !seen[id] {
				delete(stalled, id)
			}
		}
		lc.resumeAll(ctx, due, func(ctx context.Context, e kv.Entry[kv.Node]) {
			lc.l.log.Info("resuming a node of this process that had no machine", "node", e.Key, "state", e.Value.State)
			if err := lc.reconcile(ctx, e, ""); err != nil {
				lc.l.log.Debug("could not resume node", "node", e.Key, "err", err)
			}
		})
	}
}

// handOver gives up the nodes whose machines this process stopped, so
// another launcher resumes them at once instead of after the heartbeat
// expires.
func (lc *lifecycle) handOver(ctx context.Context) {
	var own []string
	lc.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Launcher == lc.l.opts.ID && (e.Value.State == kv.NodeBuilding || e.Value.State == kv.NodeDeleting) {
			own = append(own, e.Key)
		}
		return true
	})
	for _, id := range own {
		_, err := lc.l.nodes.Modify(ctx, id, func(n *kv.Node) error {
			if n.Launcher != lc.l.opts.ID || (n.State != kv.NodeBuilding && n.State != kv.NodeDeleting) {
				return kv.ErrSkip
			}
			n.Launcher = ""
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
			lc.l.log.Debug("could not hand over node", "node", id, "err", err)
		}
	}
}

// handOverNode gives up a node this process claimed but whose provider
// (or, for a launch, pool or label) a reload removed meanwhile, for a
// launcher that has it; the drain deletes it if none has (drain.go).
func (lc *lifecycle) handOverNode(ctx context.Context, id, why string) {
	lc.l.log.Warn(why, "node", id)
	_, err := lc.l.nodes.Modify(ctx, id, func(n *kv.Node) error {
		if n.Launcher != lc.l.opts.ID || (n.State != kv.NodeBuilding && n.State != kv.NodeDeleting) {
			return kv.ErrSkip
		}
		n.Launcher = ""
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		lc.l.log.Debug("could not hand over node", "node", id, "err", err)
	}
}

// update changes a node this process owns in a given state. It returns
// errLost if the node is not so any more, and retries passing errors until
// ctx ends (then ctx's error).
func (lc *lifecycle) update(ctx context.Context, id string, state kv.NodeState, fn func(*kv.Node)) (kv.Entry[kv.Node], error) {
	for failures := 0; ; failures++ {
		e, err := lc.l.nodes.Modify(ctx, id, func(n *kv.Node) error {
			if n.State != state || n.Launcher != lc.l.opts.ID {
				return errLost
			}
			fn(n)
			lc.noteWrite(id, n.State)
			return nil
		})
		switch {
		case err == nil, errors.Is(err, errLost):
			return e, err
		case errors.Is(err, kv.ErrNotFound):
			return e, errLost
		case ctx.Err() != nil:
			return e, ctx.Err()
		}
		lc.l.log.Warn("could not update node; retrying", "node", id, "err", err)
		if !wait.Sleep(ctx, wait.Backoff(failures)) {
			return e, ctx.Err()
		}
	}
}
