package consumers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/kv"
)

// Fencing. A launch or delete is owned by the process its node's launcher
// field names, for as long as that process's heartbeat record lives; the
// record expires a lease TTL after its last renewal, and cleanup then hands
// the node to another process. So that two processes never drive one
// machine, a process that has not renewed its heartbeat for two thirds of
// the TTL (it renews every quarter) stops driving: it cancels every machine, claims nothing and makes no
// cloud call for a node until a renewal succeeds again. It stops well
// before the record can expire (and any other process may take over);
// once it renews again it resumes the nodes that still name it, and a node
// taken over meanwhile is the new owner's: every write of the old owner is
// revision-checked against a record that now names another launcher (or
// another attempt), and before any cloud call a machine checks that the
// node is still its own.

// errFenced: this process has not renewed its heartbeat in time and drives
// nothing until it does.
var errFenced = errors.New("heartbeat not renewed in time; not driving machines")

// fenceAfter is how long without a successful heartbeat makes a process
// stop driving machines: two thirds of the lease TTL, which leaves a third
// (3 s of the default 10 s) between the moment it stops and the earliest
// moment its heartbeat record can expire.
func (l *Launcher) fenceAfter() time.Duration { return l.opts.LeaseTTL * 2 / 3 }

// beatEvery is the heartbeat's period: a quarter of the lease TTL, so that
// two renewals in a row may fail or be slow before the process fences
// itself.
func (l *Launcher) beatEvery() time.Duration { return l.opts.LeaseTTL / 4 }

// elapsed is the time of this process on its clock, from its birth
// (monotonic on the real clock).
func (l *Launcher) elapsed() time.Duration { return l.clock.Since(l.born) }

// beaten records a heartbeat that succeeded; sent is when it was sent
// (the record lives a TTL from when the server stored it, which is later).
func (l *Launcher) beaten(sent time.Duration) {
	for {
		prev := l.lastBeat.Load()
		if int64(sent) <= prev {
			return
		}
		if l.lastBeat.CompareAndSwap(prev, int64(sent)) {
			l.renewedMu.Lock()
			close(l.renewed)
			l.renewed = make(chan struct{})
			l.renewedMu.Unlock()
			return
		}
	}
}

// awaitUnfenced waits until this process is not fenced (at once when it
// is not) or ctx ends, and reports which. A fenced process pulls no
// work: a launch or a delete waits in the stream for a process that can
// drive it, instead of being handed to this one to be given back (under
// load, every launcher of a cluster fenced in turn, and a delete handed
// round among them waited seconds each time for its ack wait). Only a
// heartbeat ends fencing, so it waits for one. work names what is not
// pulled meanwhile, for the log.
func (l *Launcher) awaitUnfenced(ctx context.Context, work string) bool {
	for said := false; ; said = true {
		l.renewedMu.Lock()
		renewed := l.renewed
		l.renewedMu.Unlock()
		if !l.fenced() {
			return true
		}
		if !said {
			l.log.Debug("fenced: pulling no work until a heartbeat renews this process", "work", work)
		}
		select {
		case <-ctx.Done():
			return false
		case <-renewed:
		}
	}
}

// unansweredBeats are the last heartbeats whose answer did not come in
// time. On a loaded cluster a write often lands after its caller gave up
// (the answer comes after the heartbeat's timeout): the record is renewed,
// other processes see this one alive and leave its nodes to it, yet it
// fenced itself, and its nodes waited for as long as that lasted (a
// restarted launcher of TestChaos fenced for 20 s while each of its
// heartbeats landed). The next heartbeat reads the record before writing
// it: one of these found there landed, and counts from when it was sent,
// as an answered one does (the record lives a TTL from when the server
// stored it, which is later).
type unansweredBeats struct {
	mu   sync.Mutex
	sent map[int64]time.Duration // the heartbeat's time (UnixNano): when it was sent
}

// maxUnanswered bounds the heartbeats remembered: older ones would be
// past fenceAfter anyway.
const maxUnanswered = 8

func (u *unansweredBeats) add(beat time.Time, sent time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sent == nil {
		u.sent = map[int64]time.Duration{}
	}
	if len(u.sent) >= maxUnanswered {
		oldest, at := int64(0), time.Duration(0)
		for k, s := range u.sent {
			if oldest == 0 || s < at {
				oldest, at = k, s
			}
		}
		delete(u.sent, oldest)
	}
	u.sent[beat.UnixNano()] = sent
}

// landed counts the heartbeat found in the record, if it is one of these.
func (u *unansweredBeats) landed(l *Launcher, beat time.Time) {
	u.mu.Lock()
	sent, ok := u.sent[beat.UnixNano()]
	u.mu.Unlock()
	if ok {
		l.beaten(sent)
	}
}

// answered forgets the heartbeats sent up to an answered one, sent at
// sent (a later one may still be on its way, or unanswered).
func (u *unansweredBeats) answered(sent time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k, s := range u.sent {
		if s <= sent {
			delete(u.sent, k)
		}
	}
}

// fenced reports whether this process must not drive machines now: its
// last successful heartbeat was sent more than fenceAfter ago.
func (l *Launcher) fenced() bool {
	return l.elapsed()-time.Duration(l.lastBeat.Load()) > l.fenceAfter()
}

// untilFenced is how long until this process fences itself without a
// heartbeat.
func (l *Launcher) untilFenced() time.Duration {
	return time.Duration(l.lastBeat.Load()) + l.fenceAfter() - l.elapsed()
}

// pullWait is how long a pull of work may wait for messages: at most
// until this process would fence itself without another heartbeat (a
// fenced process does not pull; awaitUnfenced), and no less than
// minPullWait.
func (l *Launcher) pullWait() time.Duration {
	return max(min(workPullExpiry, l.untilFenced()), minPullWait)
}

// minPullWait is the shortest pull of work: a process about to fence
// itself without a heartbeat (one on its way renews it) pulls this long.
const minPullWait = time.Second

// stopMachines cancels every machine running here; they stop at once,
// without another cloud call. Their nodes keep naming this process: it
// resumes them if it renews its heartbeat before cleanup hands them over.
func (lc *lifecycle) stopMachines() {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, r := range lc.runs {
		r.cancel()
	}
}

// mayDrive reports whether this process may make a cloud call for a node it
// drives from a state: it is not fenced and, as far as it has seen, the
// node is still its own in that state (its own writes are seen at once;
// another's a moment later, and then the machine is stopped anyway).
func (lc *lifecycle) mayDrive(id string, state kv.NodeState) bool {
	if lc.l.fenced() {
		return false
	}
	e, ok := lc.l.nodes.Get(id)
	return ok && e.Value.State == state && e.Value.Launcher == lc.l.opts.ID
}

// keepHeartbeat renews the heartbeat every quarter of the TTL (and at once
// when a pool's pause changes); once a renewal succeeds after the process
// fenced itself, it resumes the nodes that still name this process. A
// heartbeat waits for its answer until the process would fence itself (one
// that lands late still renews the record), and the next is sent a period
// later all the same (the answer may have been lost with the connection:
// the client does not fail a request when it reconnects).
func (l *Launcher) keepHeartbeat(ctx context.Context) {
	t := l.clock.NewTicker(l.beatEvery())
	defer t.Stop()
	var beats sync.WaitGroup
	defer beats.Wait()
	slots := make(chan struct{}, maxBeats)
	beat := func() {
		select {
		case slots <- struct{}{}:
		default:
			return // the last ones are still on their way
		}
		timeout := max(l.beatEvery(), l.untilFenced())
		beats.Go(func() {
			defer func() { <-slots }()
			hctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := l.heartbeat(hctx); err != nil && ctx.Err() == nil {
				l.log.Warn("heartbeat failed", "err", err, "fenced_in", max(0, l.untilFenced()).Round(time.Millisecond))
			}
			// Renewed: this heartbeat, or an earlier one whose answer was
			// late (unansweredBeats).
			if !l.fenced() && l.fencedOff.CompareAndSwap(true, false) {
				l.log.Warn("heartbeat renewed again; resuming the nodes that still name this process")
				// The caches may be as old as the moment NATS was lost (a
				// watch silent meanwhile): nodes another process took over
				// since must not look like ours.
				l.lifecycle.wg.Go(func() {
					if l.syncCaches(ctx) {
						l.lifecycle.resumeOwn(ctx)
					}
				})
			}
		})
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.beat:
			beat()
		case <-t.C():
			beat()
		}
	}
}

// maxBeats is how many heartbeats may be on their way at once: one a
// period, each waiting at most until the process would fence itself (two
// thirds of the TTL, less than three periods).
const maxBeats = 3

// watchFence stops every machine as soon as the process is fenced, and
// says so once per time.
func (l *Launcher) watchFence(ctx context.Context) {
	for clock.Sleep(ctx, l.clock, max(l.untilFenced(), time.Millisecond)) {
		if !l.fenced() || l.fencedOff.Swap(true) {
			if l.fenced() {
				clock.Sleep(ctx, l.clock, l.beatEvery()) // already fenced: look again later
			}
			continue
		}
		l.log.Error("heartbeat not renewed for two thirds of the lease TTL; stopping every machine until it is",
			"lease_ttl", l.opts.LeaseTTL)
		l.lifecycle.stopMachines()
	}
}
