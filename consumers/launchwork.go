package consumers

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Launches arrive once (docs/work-queue.md). A node that waits for a
// launcher (building, none named) is a message on the work stream, asked
// for by every launcher of its provider from its watch of the nodes
// bucket: the server keeps one message per node and revision
// (Nats-Msg-Id) and per node (one message per subject). Each launcher of
// the provider pulls from the provider's durable consumer only as many
// messages as it has free launch slots: launches beyond max-concurrency
// wait in the stream, delivered to nobody, instead of being delivered and
// refused again and again. The message is acknowledged once the claim of
// the node is written; from then on the node's record is the work, as for
// every other machine (a launcher that dies is handed back by cleanup,
// which makes a new revision and so a new message).

// maxPull bounds the messages one pull asks for when the provider has no
// max-concurrency.
const maxPull = 64

// askBatch bounds the launches asked for before waiting for the server's
// acknowledgements.
const askBatch = 1000

// wantsLaunch tells whether this process asks for a node's launch: it
// waits for a launcher, and this process could launch it.
func (lc *lifecycle) wantsLaunch(n *kv.Node) bool {
	if n.State != kv.NodeBuilding || n.Launcher != "" {
		return false
	}
	_, draining, ok := lc.l.driverOf(n.Provider)
	return ok && !draining && lc.l.launchable(n)
}

// askLaunches asks for the launch of every node that waits for one, then
// of each node a change makes wait, until ctx ends. Launches asked for
// more than once (by each launcher of the provider, or again after a
// restart) make one message.
func (lc *lifecycle) askLaunches(ctx context.Context) {
	sub := lc.l.nodes.Subscribe()
	defer lc.l.nodes.Unsubscribe(sub)
	var due []kv.Entry[kv.Node]
	lc.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if lc.wantsLaunch(&e.Value) {
			due = append(due, *e)
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
		due = due[:0]
		for _, ch := range sub.Drain() {
			if ch.New != nil && lc.wantsLaunch(&ch.New.Value) {
				due = append(due, *ch.New)
			}
		}
	}
}

// ask publishes the launches of nodes, askBatch at a time. A publish that
// fails is logged: cleanup's revisit sweep finds the node waiting, with no
// message queued, and writes it again (a new revision asks again).
func (lc *lifecycle) ask(ctx context.Context, due []kv.Entry[kv.Node]) {
	for len(due) > 0 && ctx.Err() == nil {
		batch := due[:min(len(due), askBatch)]
		due = due[len(batch):]
		acks := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, e := range batch {
			f, err := lc.l.js.PublishMsgAsync(events.LaunchMsg(e.Value.Provider, e.Key, e.Revision))
			if err != nil {
				lc.l.log.Warn("could not ask for a node's launch; cleanup asks again", "node", e.Key, "err", err)
				continue
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if !events.Queued(err) {
					lc.l.log.Warn("could not ask for a node's launch; cleanup asks again", "node", f.Msg().Header.Get(events.HeaderNode), "err", err)
				}
			case <-ctx.Done():
				return
			}
		}
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
	s := lc.slotsOf(provider)
	for failures := 0; ctx.Err() == nil; {
		if !s.take(ctx) {
			return
		}
		n := 1
		for n < maxPull && s.tryTake() {
			n++
		}
		got, err := cons.Fetch(ctx, n, pullExpiry, func(m jetstream.Msg) {
			lc.wg.Go(func() { lc.handleLaunch(ctx, provider, m) })
		})
		for range n - got {
			lc.release(provider)
		}
		if err == nil {
			failures = 0
			continue
		}
		if !errors.Is(err, durable.ErrUnavailable) && ctx.Err() == nil {
			lc.l.log.Warn("could not pull launches; trying again", "provider", provider, "err", err)
		}
		wait.Sleep(ctx, wait.Backoff(failures))
		failures++
	}
}

// openLaunches opens a provider's launch consumer, trying again until
// ctx ends.
func (lc *lifecycle) openLaunches(ctx context.Context, provider string) (*durable.Consumer, error) {
	for failures := 0; ; failures++ {
		cons, err := durable.Open(ctx, lc.l.js, durable.Options{
			Stream: events.WorkStream,
			Config: jetstream.ConsumerConfig{
				Durable:       events.LaunchConsumer(provider),
				Description:   "launches of provider " + provider,
				FilterSubject: events.LaunchSubjects(provider),
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       ackWaitBackoff[0],
				BackOff:       ackWaitBackoff,
				MaxDeliver:    lifecycleMaxDeliver,
			},
			Log: lc.l.log,
		})
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

// handleLaunch claims the node of a launch message with the launch slot
// taken for it, and acknowledges the message once the claim is written or
// the node needs no launch from anyone; otherwise the message comes back
// (the slot is given back meanwhile).
func (lc *lifecycle) handleLaunch(ctx context.Context, provider string, msg jetstream.Msg) {
	held := true
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
	if err != nil {
		lc.l.log.Error("launch message is not valid; dropping it", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	e, err := lc.launchRecord(ctx, w)
	if err == nil {
		held = false // reconcile gives the slot back or passes it on
		err = lc.reconcileWith(ctx, e, "", true)
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
		// node's pool or label, or the server did not answer): this or
		// another process has it again.
		meta, merr := msg.Metadata()
		delay := redeliveryDelay(1)
		if merr == nil {
			delay = redeliveryDelay(meta.NumDelivered)
		}
		if err := msg.NakWithDelay(delay); err != nil {
			lc.l.log.Debug("nak failed; the launch will be delivered again", "err", err)
		}
	}
}

// launchRecord is a launch message's node, at least at the revision that
// asked for the launch: the process's view of the bucket, or the server's
// when the view is behind.
func (lc *lifecycle) launchRecord(ctx context.Context, w events.Work) (kv.Entry[kv.Node], error) {
	if e, ok := lc.l.nodes.Get(w.Node); ok && e.Revision >= w.Revision {
		return e, nil
	}
	e, err := lc.l.b.Nodes.Get(ctx, w.Node)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return e, fmt.Errorf("reading node %s: %w", w.Node, err)
	}
	return e, err
}
