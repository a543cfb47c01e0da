package consumers

import (
	"context"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// term is the state of one term as the pool's leader: made when the lease
// is taken and dropped when it is lost, so that nothing one term saw or
// started (indexes, jobs in flight, the cloud's quota, the pause) can leak
// into the next.
type term struct {
	*scheduler

	// idx holds the records as this term has seen them.
	idx *poolIndex
	// jobs are the writes in flight.
	jobs *jobSet
	// cloud is the provider's quota as the cloud last reported it.
	cloud cloudQuota
	// paused: the pool waits on quota (announced in the heartbeat).
	paused bool
	// passTook records a pass's duration.
	passTook func(time.Duration)

	// The change queues the index is kept from.
	reqSub  *kv.Subscription[kv.Request]
	nodeSub *kv.Subscription[kv.Node]
}

func newTerm(s *scheduler) *term {
	return &term{
		scheduler: s,
		passTook:  s.l.metrics.PassObserver(s.prov.Name, s.pool.Name),
		idx:       newPoolIndex(s.prov.Name, s.pool.Name),
		jobs:      newJobSet(s.jobPanicked),
		cloud:     cloudQuota{limits: unlimited},
	}
}

// run is the term's loop: it applies the changes of the records, makes a
// pass, and waits for the next change, job or tick.
func (t *term) run(ctx context.Context) {
	defer t.l.setPaused(t.ref, false)
	defer t.l.setCloudQuota(t.ref, nil)
	if !t.l.syncCaches(ctx) {
		return
	}

	quotaC := t.watchQuota(ctx)
	t.subscribe()
	defer t.unsubscribe()
	compSub := t.l.components.Subscribe()
	defer t.l.components.Unsubscribe(compSub)
	imgWatch := t.l.images.watch()
	defer imgWatch.stop()
	defer t.jobs.wait()

	tick := time.NewTicker(t.l.opts.SyncInterval)
	defer tick.Stop()
	for {
		t.takeChanges()
		compSub.Drain()
		imgWatch.drain()
		start := time.Now()
		t.pass(ctx)
		t.passTook(time.Since(start))
		select {
		case <-ctx.Done():
			return
		case <-t.reqSub.C():
		case <-t.nodeSub.C():
		case <-compSub.C():
		case <-imgWatch.C():
		case <-t.jobs.doneC:
		case <-tick.C:
			t.audit()
			if len(t.unsized) > 0 {
				t.readSizes()
			}
		case q := <-quotaC:
			t.cloud = q
			t.l.setCloudQuota(t.ref, q.announced(time.Now()))
		}
	}
}

// watchQuota starts reading the cloud's view of quota, before the first
// decision, then now and then, not on every pass, and waits a little
// (firstQuotaWait) for its first answer: a cloud that does not answer is
// gone on without, with the pool's own limits, until an answer comes. A
// pool with ignore-provider-quota counts its own limits only.
func (t *term) watchQuota(ctx context.Context) chan cloudQuota {
	quotaC := make(chan cloudQuota, 1)
	if t.pool.IgnoreProviderQuota {
		return quotaC
	}
	go watchCloudQuota(ctx, t.drv, t.prov.Name, t.l.opts.SyncInterval, t.l.cloudCallTimeout(), t.log, quotaC)
	first := time.NewTimer(t.l.firstQuotaWait())
	defer first.Stop()
	select {
	case q := <-quotaC:
		t.cloud = q
		t.l.setCloudQuota(t.ref, q.announced(time.Now()))
	case <-first.C:
		t.log.Warn("the cloud has not told its quota yet; going on without it until it does", "waited", t.l.firstQuotaWait())
	case <-ctx.Done():
	}
	return quotaC
}

// takeChanges brings the pool's index up to date. Jobs apply their writes
// to the caches before they report done: collecting them first, then
// draining the change queues, means the pass sees every write of every job
// it no longer counts as in flight.
func (t *term) takeChanges() {
	for _, k := range t.jobs.collect() {
		// Look at what the job left (a key is a request or a node).
		t.idx.dirty[k] = true
		t.idx.suspects[k] = true
	}
	for _, ch := range t.reqSub.Drain() {
		t.idx.applyRequest(ch)
	}
	for _, ch := range t.nodeSub.Drain() {
		t.idx.applyNode(ch)
	}
}

// subscribe starts the change queues; each begins with every record the
// caches hold.
func (t *term) subscribe() {
	t.reqSub = t.l.requests.Subscribe()
	t.nodeSub = t.l.nodes.Subscribe()
}

func (t *term) unsubscribe() {
	t.l.requests.Unsubscribe(t.reqSub)
	t.l.nodes.Unsubscribe(t.nodeSub)
}

// audit checks the index against the caches, as a safety net under the
// incremental indexing: a change it missed heals here (poolIndex.audit).
// Every pending request and every allocated node is looked at again on
// the next pass.
func (t *term) audit() {
	t.takeChanges()
	if healed := t.idx.audit(t.l.nodes.Range, t.l.nodes.Has, t.l.requests.Range, t.l.requests.Has); healed > 0 {
		t.log.Debug("the pool's index was behind its caches; indexed again", "records", healed)
	}
	t.idx.lookAgain()
}
