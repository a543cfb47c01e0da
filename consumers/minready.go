package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// minReadyRetry is how long a failed min-ready request stays before it is
// removed and tried again, so a label that cannot launch does not spin.
const minReadyRetry = 10 * time.Second

// minReady keeps min-ready unallocated nodes per label. It runs in the one
// process holding the min-ready lease and works as Nodepool does: it files
// node requests (requestor NodePool:min-ready) that the pools serve after
// every real request, and deletes them once fulfilled, which leaves their
// nodes ready and unallocated.
//
// Each label has min-ready request slots with fixed ids
// (min-ready-<label>-<n>); a slot is taken while its request exists, so two
// leaders in a row can never file the same slot twice.
type minReady struct {
	l *Launcher
}

func newMinReady(l *Launcher) *minReady { return &minReady{l: l} }

func (m *minReady) wanted() bool {
	for _, lb := range m.l.config().Labels {
		if lb.MinReady > 0 {
			return true
		}
	}
	return false
}

func (m *minReady) run(ctx context.Context) {
	// A reload may add min-ready to a label: look again now and then.
	for !m.wanted() {
		if !wait.Sleep(ctx, m.l.opts.SyncInterval) {
			return
		}
	}
	if !m.l.syncCaches(ctx) {
		return
	}
	nodeSub := m.l.nodes.Subscribe()
	defer m.l.nodes.Unsubscribe(nodeSub)
	reqSub := m.l.requests.Subscribe()
	defer m.l.requests.Unsubscribe(reqSub)
	tick := time.NewTicker(m.l.opts.SyncInterval)
	defer tick.Stop()
	for {
		nodeSub.Drain()
		reqSub.Drain()
		start := time.Now()
		m.pass(ctx)
		took := time.Since(start)
		select {
		case <-ctx.Done():
			return
		case <-nodeSub.C():
		case <-reqSub.C():
		case <-tick.C:
		}
		// Let a burst of changes settle into one pass; a pass looks at
		// every node, so with many nodes passes are spaced to keep it
		// under a tenth of a core.
		if !wait.Sleep(ctx, max(20*time.Millisecond, 10*took)) {
			return
		}
	}
}

// MinReadyID is the id of min-ready request slot n of a label.
func MinReadyID(label string, n int) string { return fmt.Sprintf("min-ready-%s-%d", label, n) }

func (m *minReady) pass(ctx context.Context) {
	done, taken := m.requestSlots(m.l.clock.Now())
	have := m.readyCount(done)
	for _, e := range done {
		m.remove(ctx, e)
	}
	for _, lb := range m.l.config().Labels {
		m.fill(ctx, lb.Name, lb.MinReady, lb.MinReady-have[lb.Name]-taken[lb.Name], done)
	}
}

// requestSlots sorts the min-ready requests into those finished, to take
// down, and the count per label of those still in use.
func (m *minReady) requestSlots(now time.Time) (done map[string]kv.Entry[kv.Request], taken map[string]int) {
	done, taken = map[string]kv.Entry[kv.Request]{}, map[string]int{}
	m.l.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := &e.Value
		if r.Requestor != MinReadyRequestor || len(r.Labels) == 0 {
			return true
		}
		switch {
		case r.State == kv.RequestFulfilled:
			// Its nodes are ready: let them go, and the slot with them.
			done[e.Key] = *e
		case r.State == kv.RequestFailed && now.Sub(r.StateTime) > minReadyRetry:
			done[e.Key] = *e
		default:
			taken[r.Labels[0]]++
		}
		return true
	})
	return done, taken
}

// readyCount counts per label the nodes that are, or are about to be,
// ready and unallocated (or allocated to a min-ready request taken down).
// Nodes of a removed provider, pool or label are being deleted: they do
// not count (drain.go).
func (m *minReady) readyCount(done map[string]kv.Entry[kv.Request]) map[string]int {
	l := m.l
	have := map[string]int{}
	removed := l.removals()
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if len(n.Labels) == 0 || (n.State != kv.NodeReady && n.State != kv.NodeBuilding && n.State != kv.NodeInit) || removed(n) != nil {
			return true
		}
		_, released := done[n.AllocatedTo]
		if n.AllocatedTo == "" || released || !l.requests.Has(n.AllocatedTo) {
			have[n.Labels[0]]++
		}
		return true
	})
	return have
}

// fill files min-ready requests for the missing nodes of a label, in the
// free slots among its minReady ones.
func (m *minReady) fill(ctx context.Context, label string, minReady, missing int, done map[string]kv.Entry[kv.Request]) {
	for i := 0; missing > 0 && i < minReady; i++ {
		id := MinReadyID(label, i)
		if _, released := done[id]; released || m.l.requests.Has(id) {
			continue
		}
		if m.file(ctx, label, i) {
			missing--
		}
	}
}

func (m *minReady) remove(ctx context.Context, e kv.Entry[kv.Request]) {
	if err := m.l.b.Requests.Delete(ctx, e.Key, e.Revision); err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) {
		m.l.log.Warn("could not remove min-ready request", "request", e.Key, "err", err)
	}
}

// file creates a min-ready request record directly (as Nodepool does);
// it reports whether the slot now holds a request.
func (m *minReady) file(ctx context.Context, label string, n int) bool {
	now := m.l.clock.Now().UTC()
	id := MinReadyID(label, n)
	r := &kv.Request{
		ID: id, State: kv.RequestRequested, Labels: []string{label}, Nodes: []string{}, DeclinedBy: []string{},
		Requestor: MinReadyRequestor, Priority: events.DefaultPriority, Reuse: false,
		RequestorData: json.RawMessage("{}"), Created: now, StateTime: now,
	}
	_, err := m.l.requests.Create(ctx, id, r)
	if err != nil && !errors.Is(err, kv.ErrExists) {
		if ctx.Err() == nil {
			m.l.log.Warn("could not file min-ready request", "request", id, "err", err)
		}
		return false
	}
	return true
}
