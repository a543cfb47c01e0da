package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Work arrives once (docs/work-queue.md). A node that needs a launcher's
// work (a launch: building with no launcher; a delete: used, failed,
// aborted, or deleting with no launcher) is a message on the work stream,
// asked for by every launcher that has its provider, from its watch of
// the nodes bucket: the server keeps one message per node, kind and
// revision (Nats-Msg-Id) and per node and kind (one message per subject).
// Each launcher of a provider pulls launches from the provider's durable
// consumer only as many at a time as it has free launch slots: launches
// beyond max-concurrency wait in the stream, delivered to nobody. Deletes
// free capacity and are not held back behind launches: every launcher
// takes them from one durable consumer as they come, as many at a time as
// it has delete slots. A fenced process pulls neither (awaitUnfenced). A
// message is acknowledged once the claim of its node is written; from
// then on the node's record is the work (a launcher that dies is handed
// back by cleanup, which makes a new revision and so a new message). A
// node's own writes are no work: a node's life is two deliveries, its
// launch and its delete.

// A work message is acknowledged once its claim is written, a moment
// after it came, so its ack wait is short; and a pull lasts workPullExpiry
// at most (pullWait). A process cut off from NATS (a partition: the server still sees
// its pulls) takes what comes to its pulls until they expire, and that
// comes back only after the ack wait: both bound how long work waits for
// a process that cannot do it (about 10 s). The cost is an idle process
// pulling twelve times a minute per work consumer.
//
// The ack wait is the same for every delivery (no BackOff). With a
// BackOff, the server honours a NAK's delay only on a first delivery: it
// sets the delivery's time to now, less the consumer's AckWait, plus the
// delay (nats-server's processNak), then waits the BackOff of the
// delivery count from that time (checkPending). With 5 s then 10 s, a
// delete given back with a delay of 0.3 s on its second or later delivery
// came back 5.3 s later: a delete handed round launchers that fenced in
// turn waited seconds each time (TestChaos under load, 11 s in one).
// TestNAKDelayHoldsOnLaterDeliveries holds it. Earlier, the wait grew
// to 30 s and a minute: a message NAKed a few times, then delivered to a
// process that died, waited that long.
const workAckWait = 5 * time.Second

// workConsumer is the configuration of a durable consumer of the work
// stream: the work consumers' ack wait and delivery bound.
func workConsumer(name, description, subjects string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       name,
		Description:   description,
		FilterSubject: subjects,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       workAckWait,
		MaxDeliver:    lifecycleMaxDeliver,
	}
}

const workPullExpiry = 5 * time.Second

// maxPull bounds the messages one pull asks for when the provider has no
// max-concurrency.
const maxPull = 64

// askBatch bounds the work asked for before waiting for the server's
// acknowledgements, and askAnswerWait how long they are waited for.
const (
	askBatch      = 1000
	askAnswerWait = 10 * time.Second
)

// asked is work asked for a node: what its message names, not the whole
// record (a copy of each record that waited for work, kept for as long
// as the slice, was 8 MB of a launcher's 80 MB live heap with 20,000
// nodes).
type asked struct {
	kind, node, provider string
	rev                  uint64
}

func askFor(kind string, e *kv.Entry[kv.Node]) asked {
	return asked{kind: kind, node: e.Key, provider: e.Value.Provider, rev: e.Revision}
}

// wantsWork is the kind of work this process asks for a node ("" for
// none): a launch of a node waiting for a launcher that this process
// could launch, a delete of a node waiting for one whose provider this
// process has (or drains).
func (lc *lifecycle) wantsWork(n *kv.Node) string {
	switch n.State {
	case kv.NodeBuilding:
		if n.Launcher != "" {
			return ""
		}
		if _, draining, ok := lc.l.driverOf(n.Provider); ok && !draining && lc.l.launchable(n) {
			return events.KindLaunch
		}
	case kv.NodeDeleting, kv.NodeUsed, kv.NodeFailed, kv.NodeAborted:
		if n.State == kv.NodeDeleting && n.Launcher != "" {
			return ""
		}
		if _, _, ok := lc.l.driverOf(n.Provider); ok {
			return events.KindDelete
		}
	}
	return ""
}

// askWork asks for the work of every node that waits for some, then of
// each node a change makes wait, until ctx ends. Work asked for more than
// once (by each launcher of the provider, or again after a restart) makes
// one message.
func (lc *lifecycle) askWork(ctx context.Context) {
	sub := lc.l.nodes.Subscribe()
	defer lc.l.nodes.Unsubscribe(sub)
	var due []asked
	lc.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if kind := lc.wantsWork(&e.Value); kind != "" {
			due = append(due, askFor(kind, e))
		}
		return true
	})
	for {
		lc.ask(ctx, due)
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
		}
		// A burst (every node of a restart) leaves no large slice behind.
		if cap(due) > askBatch {
			due = nil
		}
		due = due[:0]
		for _, ch := range sub.Drain() {
			if ch.New == nil {
				continue
			}
			if kind := lc.wantsWork(&ch.New.Value); kind != "" {
				due = append(due, askFor(kind, ch.New))
			}
		}
	}
}

// ask publishes the work of nodes, askBatch at a time. A publish that
// fails is logged: cleanup's revisit sweep finds the node waiting, with no
// message queued, and writes it again (a new revision asks again).
func (lc *lifecycle) ask(ctx context.Context, due []asked) {
	for len(due) > 0 && ctx.Err() == nil {
		batch := due[:min(len(due), askBatch)]
		due = due[len(batch):]
		acks := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, a := range batch {
			f, err := lc.l.js.PublishMsgAsync(events.WorkMsg(a.kind, a.provider, a.node, a.rev))
			if err != nil {
				lc.l.log.Warn("could not ask for a node's work; cleanup asks again", "node", a.node, "work", a.kind, "err", err)
				continue
			}
			acks = append(acks, f)
		}
		// A publish whose answer never comes (the stream deleted while it
		// was on its way) must not hold up the work asked after it.
		answered := time.NewTimer(askAnswerWait)
	waiting:
		for i, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if !events.Queued(err) {
					lc.l.log.Warn("could not ask for a node's work; cleanup asks again", "node", f.Msg().Header.Get(events.HeaderNode), "subject", f.Msg().Subject, "err", err)
				}
			case <-answered.C:
				lc.l.log.Warn("the server did not answer asks for work; cleanup asks again for what was lost", "unanswered", len(acks)-i, "wait", askAnswerWait)
				break waiting
			case <-ctx.Done():
				answered.Stop()
				return
			}
		}
		answered.Stop()
	}
}

// pullLaunches takes a provider's launches from the work stream, as many
// at a time as the provider has free launch slots here, until ctx ends.
func (lc *lifecycle) pullLaunches(ctx context.Context, provider string) {
	cons, err := lc.openLaunches(ctx, provider)
	if err != nil {
		return // ctx ended
	}
	defer cons.Stop()
	lc.pullWork(ctx, cons, lc.slotsOf(provider), maxPull, "launches of provider "+provider, func(m jetstream.Msg) {
		lc.wg.Go(func() { lc.handleWork(ctx, m, events.KindLaunch, provider) })
	})
}

// pullWork pulls cons until ctx ends, as many messages at a time as s
// has free slots (most at most), and only while the process is not
// fenced (awaitUnfenced). handle gets each message with a slot it must
// give back; what names the work, for the log.
func (lc *lifecycle) pullWork(ctx context.Context, cons *durable.Consumer, s *slots, most int, what string, handle func(jetstream.Msg)) {
	for failures := 0; ctx.Err() == nil; {
		if !lc.l.awaitUnfenced(ctx, what) || !s.take(ctx) {
			return
		}
		n := 1
		for n < most && s.tryTake() {
			n++
		}
		got, err := cons.Fetch(ctx, n, lc.l.pullWait(), handle)
		for range n - got {
			s.give()
		}
		if err == nil {
			failures = 0
			continue
		}
		if !errors.Is(err, durable.ErrUnavailable) && ctx.Err() == nil {
			lc.l.log.Warn("could not pull work; trying again", "work", what, "err", err)
		}
		wait.Sleep(ctx, wait.Backoff(failures))
		failures++
	}
}

// openLaunches opens a provider's launch consumer, trying again until
// ctx ends.
func (lc *lifecycle) openLaunches(ctx context.Context, provider string) (*durable.Consumer, error) {
	for failures := 0; ; failures++ {
		cons, err := lc.openWork(ctx, events.LaunchConsumer(provider), "launches of provider "+provider, events.WorkSubjects(events.KindLaunch, provider))
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		lc.l.log.Warn("could not open the launch consumer; trying again", "provider", provider, "err", err)
		if !wait.Sleep(ctx, wait.Backoff(failures)) {
			return nil, ctx.Err()
		}
	}
}

// openWork opens a durable consumer of the work stream (made again if it
// is deleted), with the work consumers' ack wait and delivery bound.
func (lc *lifecycle) openWork(ctx context.Context, name, description, subjects string) (*durable.Consumer, error) {
	return durable.Open(ctx, lc.l.js, durable.Options{
		Stream:  events.WorkStream,
		Config:  workConsumer(name, description, subjects),
		Missing: lc.l.b.ReportMissing,
		Log:     lc.l.log,
	})
}

// handleDelete claims the node of a delete message.
func (lc *lifecycle) handleDelete(ctx context.Context, msg jetstream.Msg) {
	lc.handleWork(ctx, msg, events.KindDelete, "")
}

// handleWork claims the node of a work message of a kind, and
// acknowledges the message once the claim is written or the node needs
// no such work from anyone; otherwise the message comes back. A launch
// holds a slot of provider, which is given back or passed to the launch.
func (lc *lifecycle) handleWork(ctx context.Context, msg jetstream.Msg, kind, provider string) {
	held := kind == events.KindLaunch
	var w events.Work
	defer func() {
		if p := recover(); p != nil {
			lc.handlerPanicked(w.Node, msg, p)
		}
		if held {
			lc.release(provider)
		}
	}()
	w, err := events.ParseWork(msg.Subject(), msg.Headers())
	if err == nil && w.Kind != kind {
		err = fmt.Errorf("work message on %s: a %s on the consumer of %s work", msg.Subject(), w.Kind, kind)
	}
	if err != nil {
		lc.l.log.Error("work message is not valid; dropping it", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	if lc.l.log.Enabled(ctx, slog.LevelDebug) {
		lc.l.log.Debug("work came", "node", w.Node, "work", kind, "revision", w.Revision, "delivered", deliveries(msg))
	}
	e, err := lc.workRecord(ctx, w)
	if err == nil {
		slot := held
		held = false // reconcile gives the slot back or passes it on
		err = lc.reconcileWith(ctx, e, "", slot)
	}
	switch {
	case err == nil:
		lc.ack(msg)
	case errors.Is(err, kv.ErrNotFound):
		lc.ack(msg) // the node is gone
	case errors.Is(err, kv.ErrBadRecord):
		lc.l.log.Error("node record is not valid; leaving it alone", "node", w.Node, "err", err)
		lc.ack(msg)
	default:
		// Not claimed here (this process is fenced or stopping, lacks the
		// node's provider, pool or label, a machine of the node is still
		// stopping, or the server did not answer): this or another
		// process has it again.
		delivered := deliveries(msg)
		delay := redeliveryDelay(delivered)
		lc.l.log.Debug("work not taken here; it comes back", "node", w.Node, "work", kind, "delivered", delivered, "in", delay, "err", err)
		if err := msg.NakWithDelay(delay); err != nil {
			lc.l.log.Debug("nak failed; the work will be delivered again", "err", err)
		}
	}
}

// deliveries is how many times a message was delivered, this time
// included (1 when its metadata cannot be read). Read only where it is
// used: parsing it for every message costs the hot path.
func deliveries(msg jetstream.Msg) uint64 {
	if meta, err := msg.Metadata(); err == nil {
		return meta.NumDelivered
	}
	return 1
}

// openDeletes opens the consumer of every provider's deletes.
func (lc *lifecycle) openDeletes(ctx context.Context) (*durable.Consumer, error) {
	cons, err := lc.openWork(ctx, events.DeleteConsumer, "deletes of nodes", events.WorkSubjects(events.KindDelete, ""))
	if err != nil {
		return nil, fmt.Errorf("creating the delete consumer: %w", err)
	}
	return cons, nil
}

// deleteSlots bounds the deletes a process takes at once: a delete's
// handler only claims the node (its machine runs apart), so this bounds
// claims in flight, not machines.
const deleteSlots = 64

// startDeletes takes the deletes of the delete consumer as they come, as
// many at a time as it has free delete slots, while the process is not
// fenced (awaitUnfenced): a delete pulled by a process that cannot drive
// it would be given back, and one waiting behind a busy handler would
// wait out its ack wait before anyone else had it.
func (lc *lifecycle) startDeletes(ctx context.Context, cons *durable.Consumer) (stoppable, error) {
	pullCtx, cancel := context.WithCancel(ctx)
	p := &deletePuller{cons: cons, cancel: cancel, slots: newSlots(deleteSlots)}
	p.loop.Go(func() { lc.pullDeletes(pullCtx, ctx, p) })
	return p, nil
}

// deletePuller is the loop that pulls deletes, and the handlers it
// started.
type deletePuller struct {
	cons     *durable.Consumer
	cancel   context.CancelFunc
	slots    *slots
	loop     sync.WaitGroup
	handlers sync.WaitGroup
}

// Stop stops pulling and waits for the handlers in progress; what was
// taken and not acknowledged is delivered again.
func (p *deletePuller) Stop() {
	p.cancel()
	p.loop.Wait()
	p.handlers.Wait()
	p.cons.Stop()
}

// pullDeletes pulls until ctx ends; the handlers run with runCtx (the
// launcher's), which Stop does not cancel: it waits for them.
func (lc *lifecycle) pullDeletes(ctx, runCtx context.Context, p *deletePuller) {
	lc.pullWork(ctx, p.cons, p.slots, deleteSlots, "deletes", func(m jetstream.Msg) {
		p.handlers.Go(func() {
			defer p.slots.give()
			lc.handleDelete(runCtx, m)
		})
	})
}

// followMachines looks at each change of a node whose machine runs here
// and that the machine did not write itself (an operator deleted the node
// under its create, cleanup handed it to another process, the launch
// ended): the machine is stopped before anything else happens to the
// node, and the node taken up again (reconcile).
func (lc *lifecycle) followMachines(ctx context.Context) {
	sub := lc.l.nodes.Subscribe()
	defer lc.l.nodes.Unsubscribe(sub)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
		}
		for _, ch := range sub.Drain() {
			if ch.New == nil {
				continue
			}
			if r := lc.running(ch.Key); r != nil && !lc.ownWrite(r, &ch.New.Value) {
				lc.follow(ctx, ch.Key)
			}
		}
	}
}

// follow reconciles a node whose machine runs here, once at a time per
// node: a change that comes meanwhile is looked at when it is done.
func (lc *lifecycle) follow(ctx context.Context, id string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.following[id] {
		lc.followAgain[id] = true
		return
	}
	lc.following[id] = true
	lc.wg.Go(func() {
		for {
			if e, ok := lc.l.nodes.Get(id); ok {
				if err := lc.reconcile(ctx, e, ""); err != nil && ctx.Err() == nil {
					lc.l.log.Debug("node left for its work message or cleanup", "node", id, "err", err)
				}
			}
			lc.mu.Lock()
			if !lc.followAgain[id] {
				delete(lc.following, id)
				lc.mu.Unlock()
				return
			}
			delete(lc.followAgain, id)
			lc.mu.Unlock()
		}
	})
}

// workRecord is a work message's node, at least at the revision that
// asked for the work: the process's view of the bucket, or the server's
// when the view is behind.
func (lc *lifecycle) workRecord(ctx context.Context, w events.Work) (kv.Entry[kv.Node], error) {
	if e, ok := lc.l.nodes.Get(w.Node); ok && e.Revision >= w.Revision {
		return e, nil
	}
	e, err := lc.l.b.Nodes.Get(ctx, w.Node)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return e, fmt.Errorf("reading node %s: %w", w.Node, err)
	}
	return e, err
}
