package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// limits are what the auditor holds the system to.
type limits struct {
	// quota is the cloud's instance quota; maxServers each pool's
	// max-servers.
	quota      int
	maxServers map[string]int
	// cleanup is the cleanup window: how long a leaked instance, an
	// expired hold or a node being deleted may last.
	cleanup time.Duration
	// stuck is how long a node may stay building.
	stuck time.Duration
	// vanished is how long a ready, in-use or held node may name an
	// instance the cloud does not have (the watches of the node and
	// instance buckets deliver a delete in either order).
	vanished time.Duration
}

// auditor checks the promises of the system continuously, from outside:
// on every change of the node, request and instance records and every
// quarter second, while a test runs faults. A violation is recorded with
// the time it was seen.
type auditor struct {
	t   *testing.T
	rec *records
	lim limits

	mu         sync.Mutex
	violations []string
	created    map[string]int       // instance id: creations seen
	givenTo    map[string]string    // node: the request it was fulfilled for
	inUseFor   map[string]string    // node: the request it was taken for
	since      map[string]time.Time // a condition (kind/key): when first seen
	reported   map[string]bool
	failed     map[string]string // request: reason it failed
	peak       struct{ instances, records int }
	peakPool   map[string]int
	fulfilled  int
	changes    int
	checks     int
	lastChange time.Time
}

// startAuditor audits the records that rec watches until the test ends
// or stop is called.
func startAuditor(t *testing.T, rec *records, lim limits) (a *auditor, stop func()) {
	a = &auditor{t: t, rec: rec, lim: lim, created: map[string]int{}, givenTo: map[string]string{}, inUseFor: map[string]string{},
		since: map[string]time.Time{}, reported: map[string]bool{}, failed: map[string]string{}, peakPool: map[string]int{}}
	sn, sr, si := rec.nodes.Subscribe(), rec.requests.Subscribe(), rec.instances.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer rec.nodes.Unsubscribe(sn)
		defer rec.requests.Unsubscribe(sr)
		defer rec.instances.Unsubscribe(si)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-sn.C():
			case <-sr.C():
			case <-si.C():
			case <-tick.C:
			}
			a.mu.Lock()
			for _, ch := range si.Drain() {
				a.instanceChange(ch)
			}
			for _, ch := range sn.Drain() {
				a.nodeChange(ch)
			}
			for _, ch := range sr.Drain() {
				a.requestChange(ch)
			}
			a.check(time.Now())
			a.mu.Unlock()
		}
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return a, stop
}

func (a *auditor) violate(key, format string, args ...any) {
	if a.reported[key] {
		return
	}
	a.reported[key] = true
	msg := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	a.violations = append(a.violations, msg)
	a.t.Log("VIOLATION " + msg)
}

// launchWork says where the launch of a node stuck building waits on the
// work stream, for a reader of a violation: its message (or none), and
// whether the provider's launch consumer delivered it.
func (a *auditor) launchWork(id string, n *kv.Node) string {
	if a.rec.js == nil || a.reported["stuck/"+id+"/"+string(kv.NodeBuilding)] {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := a.rec.js.Stream(ctx, events.WorkStream)
	if err != nil {
		return fmt.Sprintf("; work stream: %v", err)
	}
	out := ""
	msg, err := st.GetLastMsgForSubject(ctx, events.WorkSubjectOf(events.KindLaunch, n.Provider, id))
	switch {
	case err != nil:
		out += fmt.Sprintf("; no launch message (%v)", err)
	default:
		out += fmt.Sprintf("; launch message seq %d for revision %s", msg.Sequence, msg.Header.Get(events.HeaderRevision))
	}
	cons, err := st.Consumer(ctx, events.LaunchConsumer(n.Provider))
	if err != nil {
		return out + fmt.Sprintf("; launch consumer: %v", err)
	}
	info := cons.CachedInfo()
	leader := ""
	if info.Cluster != nil {
		leader = info.Cluster.Leader
	}
	return out + fmt.Sprintf("; consumer delivered up to seq %d, ack floor %d, %d awaiting ack, %d undelivered, %d pulls waiting, %d redelivered, leader %s",
		info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending, info.NumPending, info.NumWaiting, info.NumRedelivered, leader)
}

// instanceChange: no instance is created twice (the fake derives an
// instance's id from its node and attempt, so a second creation of one
// id is a second create for one attempt).
func (a *auditor) instanceChange(ch kv.Change[fake.InstanceRecord]) {
	a.changes++
	a.lastChange = time.Now()
	if ch.Old != nil || ch.New == nil {
		return
	}
	a.created[ch.Key]++
	if a.created[ch.Key] > 1 {
		a.violate("twice/"+ch.Key, "instance %s (token %s) created %d times", ch.Key, ch.New.Value.Token, a.created[ch.Key])
	}
}

// requestChange: no node is given to two requests.
func (a *auditor) requestChange(ch kv.Change[kv.Request]) {
	a.changes++
	a.lastChange = time.Now()
	if ch.New == nil {
		return
	}
	r := &ch.New.Value
	was := kv.RequestState("")
	if ch.Old != nil {
		was = ch.Old.Value.State
	}
	switch {
	case r.State == kv.RequestFulfilled && was != kv.RequestFulfilled && strings.HasPrefix(r.Requestor, "NodePool:"):
		// min-ready's own requests leave their nodes ready for others.
	case r.State == kv.RequestFulfilled && was != kv.RequestFulfilled:
		a.fulfilled++
		for _, nid := range r.Nodes {
			// A request deleted before its nodes were taken frees them.
			if prev, ok := a.givenTo[nid]; ok && prev != r.ID && a.holds(prev, nid) {
				a.violate("two/"+nid, "node %s given to request %s, which still holds it, and to request %s", nid, prev, r.ID)
			}
			a.givenTo[nid] = r.ID
		}
	case r.State == kv.RequestFailed && was != kv.RequestFailed:
		a.failed[r.ID] = r.Reason
	}
}

// holds reports whether a request still exists, fulfilled with a node.
func (a *auditor) holds(request, node string) bool {
	e, ok := a.rec.requests.Get(request)
	return ok && e.Value.State == kv.RequestFulfilled && slices.Contains(e.Value.Nodes, node)
}

// nodeChange: a node is taken (in use) for one request only.
func (a *auditor) nodeChange(ch kv.Change[kv.Node]) {
	a.changes++
	if ch.New == nil || ch.New.Value.State != kv.NodeInUse || (ch.Old != nil && ch.Old.Value.State == kv.NodeInUse) {
		return
	}
	n := &ch.New.Value
	if prev, ok := a.inUseFor[ch.Key]; ok && prev != n.AllocatedTo {
		a.violate("taken-twice/"+ch.Key, "node %s taken for request %s and for request %s", ch.Key, prev, n.AllocatedTo)
	}
	a.inUseFor[ch.Key] = n.AllocatedTo
}

// lasting reports whether a condition has held for longer than d; hold
// false clears it.
func (a *auditor) lasting(key string, hold bool, now time.Time, d time.Duration) bool {
	if !hold {
		delete(a.since, key)
		return false
	}
	s, ok := a.since[key]
	if !ok {
		a.since[key] = now
		return false
	}
	return now.Sub(s) > d
}

// vanishedForSure asks the server, not the watches, whether a node still
// names an instance the cloud does not have: on a loaded machine one of
// the two watches may lag the other by more than the vanished limit
// (seen once at a load average of 22, with a stream's leader killed).
func (a *auditor) vanishedForSure(id, ext string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := a.rec.client.Buckets().Nodes.Get(ctx, id)
	if err != nil || n.Value.ExternalID != ext ||
		(n.Value.State != kv.NodeReady && n.Value.State != kv.NodeInUse && n.Value.State != kv.NodeHold) {
		return false // gone, changed, or not known now: the watches tell next
	}
	_, err = a.rec.instanceStore.Get(ctx, ext)
	return errors.Is(err, kv.ErrNotFound)
}

// check looks at the whole picture at one moment.
func (a *auditor) check(now time.Time) {
	a.checks++
	rec := a.rec
	live := map[string]bool{}
	// Instances: within quota and max-servers; none leaked for longer
	// than the cleanup window.
	total := 0
	perPool := map[string]int{}
	rec.instances.Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		total++
		inst := &e.Value
		key := "leak/" + e.Key
		live[key] = true
		leaked := leakedInstance(inst, rec.nodes.Get)
		if !leaked {
			// A leaked instance is no node's: nodepool counts nodes
			// against max-servers (the leak check bounds the others).
			perPool[inst.Tags[drivers.TagPool]]++
		}
		if a.lasting(key, leaked, now, a.lim.cleanup) {
			a.violate(key, "instance %s (node %s) leaked for longer than %s", e.Key, inst.Tags[drivers.TagNode], a.lim.cleanup)
		}
		return true
	})
	a.peak.instances = max(a.peak.instances, total)
	if a.lim.quota > 0 && total > a.lim.quota {
		a.violate(fmt.Sprintf("quota/%d", total), "%d instances in the cloud, quota %d", total, a.lim.quota)
	}
	for pool, n := range perPool {
		if limit, ok := a.lim.maxServers[pool]; ok && n > limit {
			a.violate(fmt.Sprintf("pool-instances/%s/%d", pool, n), "%d instances of nodes of pool %s, max-servers %d:\n%s", n, pool, limit, a.poolNodes(pool))
		}
	}
	// Node records: within max-servers; none stuck; none ready, in use
	// or held without its instance; no hold past its expiry.
	records := 0
	nodesPerPool := map[string]int{}
	rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		records++
		nodesPerPool[n.Pool]++
		vanishedKey := "vanished/" + e.Key
		live[vanishedKey] = true
		// Only the watched cloud's instances are known here: a node of
		// another provider (cloud2 of TestFencingCutOffLauncher) has
		// its instance elsewhere, and one in use for 3 s under load was
		// taken for a node whose instance had vanished.
		_, has := rec.instances.Get(n.ExternalID)
		has = has || n.Provider != rec.cloud
		if a.lasting(vanishedKey, (n.State == kv.NodeReady || n.State == kv.NodeInUse || n.State == kv.NodeHold) && !has, now, a.lim.vanished) &&
			a.vanishedForSure(e.Key, n.ExternalID) {
			a.violate(vanishedKey, "node %s is %s but its instance %q is gone", e.Key, n.State, n.ExternalID)
		}
		stuckKey := fmt.Sprintf("stuck/%s/%s", e.Key, n.State)
		live[stuckKey] = true
		switch n.State {
		case kv.NodeBuilding:
			if a.lasting(stuckKey, true, now, a.lim.stuck) {
				a.violate(stuckKey, "node %s building for longer than %s (launcher %q, attempt %d)%s", e.Key, a.lim.stuck, n.Launcher, n.Attempt, a.launchWork(e.Key, n))
			}
		case kv.NodeDeleting, kv.NodeUsed, kv.NodeFailed:
			if a.lasting(stuckKey, true, now, a.lim.cleanup) {
				a.violate(stuckKey, "node %s %s for longer than %s (launcher %q)", e.Key, n.State, a.lim.cleanup, n.Launcher)
			}
		case kv.NodeHold:
			expired := n.HoldExpiration != nil && now.After(*n.HoldExpiration)
			if a.lasting(stuckKey, expired, now, a.lim.cleanup) {
				a.violate(stuckKey, "node %s held past its expiry for longer than %s", e.Key, a.lim.cleanup)
			}
		}
		return true
	})
	a.peak.records = max(a.peak.records, records)
	for pool, n := range nodesPerPool {
		a.peakPool[pool] = max(a.peakPool[pool], n)
		if limit, ok := a.lim.maxServers[pool]; ok && n > limit {
			a.violate(fmt.Sprintf("pool-nodes/%s/%d", pool, n), "%d nodes of pool %s, max-servers %d:\n%s", n, pool, limit, a.poolNodes(pool))
		}
	}
	for key := range a.since {
		if !live[key] {
			delete(a.since, key)
		}
	}
}

// report stops nothing; it returns the violations seen so far and a
// summary.
func (a *auditor) report() (violations []string, summary string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pools := make([]string, 0, len(a.peakPool))
	for p, n := range a.peakPool {
		pools = append(pools, fmt.Sprintf("%s=%d", p, n))
	}
	sort.Strings(pools)
	summary = fmt.Sprintf("auditor: %d checks over %d changes; %d instances created, %d requests fulfilled, %d failed; peaks: %d instances, %d node records (%s)",
		a.checks, a.changes, len(a.created), a.fulfilled, len(a.failed), a.peak.instances, a.peak.records, strings.Join(pools, " "))
	return append([]string(nil), a.violations...), summary
}

// instancesCreated is how many instances the auditor saw created.
func (a *auditor) instancesCreated() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.created)
}

// fulfilledCount is how many requests the auditor saw fulfilled.
func (a *auditor) fulfilledCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fulfilled
}

// poolNodes describes a pool's nodes, oldest first, for a violation.
func (a *auditor) poolNodes(pool string) string {
	var nodes []kv.Node
	a.rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Pool == pool {
			nodes = append(nodes, e.Value)
		}
		return true
	})
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Created.Before(nodes[j].Created) })
	var b strings.Builder
	a.rec.instances.Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		if e.Value.Tags[drivers.TagPool] == pool {
			fmt.Fprintf(&b, "    instance %s of node %s (token %s) created %s\n", e.Key, e.Value.Tags[drivers.TagNode], e.Value.Token, e.Value.Created.Format("15:04:05.000"))
		}
		return true
	})
	for _, n := range nodes {
		listed := false
		if r, ok := a.rec.requests.Get(n.AllocatedTo); ok {
			listed = slices.Contains(r.Value.Nodes, n.ID)
		}
		fmt.Fprintf(&b, "    %s %s created %s state_time %s alloc=%q (listed %v) launcher=%q ext=%q\n", n.ID, n.State,
			n.Created.Format("15:04:05.000"), n.StateTime.Format("15:04:05.000"), n.AllocatedTo, listed, n.Launcher, n.ExternalID)
	}
	return b.String()
}
