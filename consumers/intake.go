package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// IntakeConsumer is the durable consumer (worker group) that turns request
// messages into request records (events.IntakeConsumer).
const IntakeConsumer = events.IntakeConsumer

// stoppable is a running consumer.
type stoppable interface{ Stop() }

// workerPool runs message handlers on a fixed number of goroutines; messages
// with the same key go to the same goroutine, in order.
type workerPool struct {
	queues []chan jetstream.Msg
	wg     sync.WaitGroup
	cons   *durable.Consumer
}

// A pull lives pullExpiry on the server that leads the consumer, which
// sends a heartbeat every pullHeartbeat while it has nothing to deliver.
// When that server goes away, the pull goes with it; the client notices
// after two missed heartbeats and pulls again from the new leader. The
// library's heartbeat (15 s) would leave a worker group idle for half a
// minute after every leader change of a cluster; its expiry (30 s) is
// kept: the heartbeats, not the expiry, notice a lost pull, and an idle
// worker group pulls twice a minute.
const (
	pullExpiry    = 30 * time.Second
	pullHeartbeat = time.Second
)

// startWorkers consumes a worker group's durable consumer (made again if
// it is deleted, see internal/durable) with n workers.
func startWorkers(ctx context.Context, cons *durable.Consumer, n int, expiry time.Duration, key func(jetstream.Msg) string, handle func(context.Context, jetstream.Msg)) (*workerPool, error) {
	wp := &workerPool{queues: make([]chan jetstream.Msg, n), cons: cons}
	for i := range wp.queues {
		q := make(chan jetstream.Msg, 64)
		wp.queues[i] = q
		wp.wg.Go(func() {
			for msg := range q {
				handle(ctx, msg)
			}
		})
	}
	err := cons.Consume(func(msg jetstream.Msg) {
		h := fnv.New32a()
		h.Write([]byte(key(msg)))
		wp.queues[h.Sum32()%uint32(n)] <- msg
	}, jetstream.PullMaxMessages(512), jetstream.PullExpiry(expiry), jetstream.PullHeartbeat(pullHeartbeat))
	if err != nil {
		cons.Stop()
		wp.close()
		return nil, err
	}
	return wp, nil
}

func (wp *workerPool) close() {
	for _, q := range wp.queues {
		close(q)
	}
	wp.wg.Wait()
}

// Stop stops taking messages and waits for the handlers in progress.
func (wp *workerPool) Stop() {
	wp.cons.Stop()
	wp.close()
}

// openIntake opens the intake's durable consumer of the requests stream.
func (l *Launcher) openIntake(ctx context.Context) (*durable.Consumer, error) {
	// A consumer made again after a deletion starts after the last
	// message the old one acknowledged: from the start of the stream,
	// messages whose requests were served and deleted long ago (their
	// delete markers purged) would be recorded again.
	cons, err := durable.Open(ctx, l.js, durable.Options{
		Stream:  events.RequestsStream,
		Config:  intakeConsumer(),
		Missing: l.b.ReportMissing,
		Resume:  true,
		// A consumer made again delivers again what was acknowledged
		// since the floor was read: the handler finds those requests
		// recorded (their records, or their delete markers, are there).
		FloorEvery: 6 * l.opts.SyncInterval,
		Log:        l.log,
	})
	if err != nil {
		return nil, fmt.Errorf("creating intake consumer: %w", err)
	}
	return cons, nil
}

// intakeConsumer is the configuration of the intake's durable consumer.
// Its ack wait is the same for every delivery (no BackOff), as the work
// consumers' is (workAckWait says why): with a BackOff of 10 s, 30 s, 1
// min and 2 min, a request message given back with 2 s on its second
// delivery came back after 22 s, and the deliveries of a request that
// could not be recorded spread over about 16 minutes, not the 4 that
// intakeDelay's delays add up to. TestIntakeNAKDelayHoldsOnLaterDeliveries
// holds it.
func intakeConsumer() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        IntakeConsumer,
		Description:    "records node requests",
		FilterSubjects: []string{events.NewRequestSubject, events.OwnedRequestSubjects},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        intakeAckWait,
		MaxDeliver:     intakeMaxDeliver,
		MaxAckPending:  10000,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
}

// startIntake records the requests of the intake's consumer as they come.
func (l *Launcher) startIntake(ctx context.Context, cons *durable.Consumer) (stoppable, error) {
	return startWorkers(ctx, cons, 32, pullExpiry, func(m jetstream.Msg) string { return m.Reply() }, l.handleRequestMessage)
}

// handleRequestMessage records one request message. Whatever the message
// holds, a record results (failed, with a reason, if the message is not a
// valid request); the message is acknowledged once the record exists. A
// record that cannot be written is tried again with a growing delay; a
// record too big for the server is written without its requestor_data,
// failed, saying so; and on the last delivery the consumer allows, a
// record that still cannot be written is written failed, with the reason
// and without requestor_data. A handler that panics does the same.
func (l *Launcher) handleRequestMessage(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		l.log.Error("request message without metadata; dropping it", "err", err)
		_ = msg.Term()
		return
	}
	defer func() {
		if p := recover(); p != nil {
			l.log.Error("recording a request panicked; recording it failed", "seq", meta.Sequence.Stream, "panic", p, "stack", string(debug.Stack()))
			l.recordUnhandled(ctx, msg, meta, panicReason(p))
		}
	}()
	rec := l.requestRecord(ctx, msg.Data(), meta)
	rec.Owner, _ = events.OwnerOfRequestSubject(msg.Subject())
	err = l.recordRequest(ctx, rec, meta)
	if errors.Is(err, nats.ErrMaxPayload) {
		size := len(rec.RequestorData)
		rec.RequestorData = json.RawMessage("{}")
		if rec.State != kv.RequestFailed {
			rec.State = kv.RequestFailed
			rec.Reason = fmt.Sprintf("the request's record is bigger than the NATS server's max payload (%d bytes) with its requestor_data of %d bytes; recorded without requestor_data", l.maxPayload(), size)
		} else {
			rec.Reason += fmt.Sprintf("; requestor_data (%d bytes) left out: the record would be bigger than the NATS server's max payload", size)
		}
		err = l.recordRequest(ctx, rec, meta)
	}
	switch {
	case err == nil:
		l.metrics.RequestReceived()
		if rec.State == kv.RequestFailed {
			l.metrics.Request("", "", metrics.RequestFailed, 0)
			l.log.Info("request not valid", "request", rec.ID, "reason", rec.Reason)
		}
	case errors.Is(err, kv.ErrExists):
		// Delivered again after a crash, or a resubmission of an id
		// already recorded: either way there is nothing to do.
		l.log.Debug("request already recorded", "request", rec.ID, "seq", meta.Sequence.Stream)
	case meta.NumDelivered >= intakeMaxDeliver:
		l.log.Error("could not record request; this was its last delivery", "request", rec.ID, "deliveries", meta.NumDelivered, "err", err)
		l.recordUnhandled(ctx, msg, meta, fmt.Sprintf("could not be recorded in %d deliveries: %v", meta.NumDelivered, err))
		return
	default:
		delay := intakeDelay(meta.NumDelivered)
		l.log.Warn("could not record request; it will be delivered again", "request", rec.ID, "in", delay, "err", err)
		_ = msg.NakWithDelay(delay)
		return
	}
	if err := msg.Ack(); err != nil {
		l.log.Debug("ack failed; the message will be delivered again", "err", err)
	}
}

// recordRequest writes the record of a request message. A message
// delivered again may have made its record already, and the requestor may
// have deleted it since: then only a key that never existed may be
// created. An id the stream assigned is unique, so its key is never
// created twice either. A client may reuse its own id after deleting a
// request: a message published after the deletion makes the record again.
// Its delivery count does not tell a redelivery from a new message (it
// starts again at one when the consumer's state is lost with a server of
// the cluster, and a request resurrected so would pin its nodes), but
// when it was published does.
func (l *Launcher) recordRequest(ctx context.Context, rec *kv.Request, meta *jetstream.MsgMetadata) error {
	_, err := l.createNewRequest(ctx, rec.ID, rec)
	if errors.Is(err, kv.ErrExists) && rec.ID != events.RequestID(meta.Sequence.Stream) {
		if taken, terr := l.takenByOther(ctx, rec); terr != nil {
			return terr
		} else if taken != nil {
			return l.recordTaken(ctx, rec, taken, meta)
		}
	}
	if !errors.Is(err, kv.ErrExists) || meta.NumDelivered > 1 || rec.ID == events.RequestID(meta.Sequence.Stream) {
		return err
	}
	deleted, at, rev, err := l.b.Requests.LastDeletion(ctx, rec.ID)
	switch {
	case err != nil:
		return err
	case !deleted:
		return kv.ErrExists // recorded and not deleted
	case !meta.Timestamp.After(at):
		return kv.ErrExists // recorded, and deleted after this message was published
	}
	_, err = l.requests.Update(ctx, rec.ID, rec, rev)
	if errors.Is(err, kv.ErrConflict) {
		return kv.ErrExists // made again meanwhile, by another delivery
	}
	return err
}

// takenByOther returns the record that holds a request's id if another
// requestor's request holds it (nil if the id is free, or this owner's).
func (l *Launcher) takenByOther(ctx context.Context, rec *kv.Request) (*kv.Request, error) {
	e, err := l.b.Requests.Get(ctx, rec.ID)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil, nil
	case errors.Is(err, kv.ErrBadRecord):
		return nil, nil // not a request of anyone's: left to the sweeps
	case err != nil:
		return nil, err
	}
	if e.Value.Owner == rec.Owner {
		return nil, nil
	}
	return &e.Value, nil
}

// recordTaken records a request whose id another requestor's request
// holds under the id a request without one gets (its stream sequence, the
// Sequence of the stream's answer to the publish), failed with the
// reason, so that its requestor can read why; the other request is left
// alone. The Go client's Wait says so too (the record it finds is not
// its owner's).
func (l *Launcher) recordTaken(ctx context.Context, rec *kv.Request, holder *kv.Request, meta *jetstream.MsgMetadata) error {
	failed := *rec
	failed.ID = events.RequestID(meta.Sequence.Stream)
	failed.State = kv.RequestFailed
	failed.RequestorData = json.RawMessage("{}")
	failed.Reason = fmt.Sprintf("id %q is taken by a request of another requestor; this request (stream sequence %d) was recorded under this id instead, failed", rec.ID, meta.Sequence.Stream)
	l.log.Info("request id taken by another requestor", "id", rec.ID, "owner", rec.Owner, "holder", holder.Owner, "recorded_as", failed.ID)
	_, err := l.createNewRequest(ctx, failed.ID, &failed)
	if errors.Is(err, kv.ErrExists) {
		return nil // an earlier delivery recorded it
	}
	if err == nil {
		l.metrics.Request("", "", metrics.RequestFailed, 0)
	}
	return err
}

// recordUnhandled records, as failed with the reason and without its
// requestor_data, a request message that could not be handled, and
// acknowledges the message; if even that cannot be written, the message
// is terminated (never delivered again) with the reason in the log.
func (l *Launcher) recordUnhandled(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, reason string) {
	rec := l.minimalRecord(msg.Data(), meta)
	rec.State, rec.Reason = kv.RequestFailed, reason
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := l.recordRequest(wctx, rec, meta)
	if err == nil || errors.Is(err, kv.ErrExists) {
		if err == nil {
			l.metrics.Request("", "", metrics.RequestFailed, 0)
		}
		_ = msg.Ack()
		return
	}
	l.log.Error("request message dropped: not even its failure could be recorded", "request", rec.ID, "seq", meta.Sequence.Stream, "reason", reason, "err", err)
	_ = msg.TermWithReason(reason)
}

// minimalRecord is the record of a message with as little of the message
// as can be trusted: its id if it has a valid one, its labels if valid,
// its requestor; no requestor_data.
func (l *Launcher) minimalRecord(data []byte, meta *jetstream.MsgMetadata) (rec *kv.Request) {
	now := l.clock.Now().UTC()
	rec = &kv.Request{ID: events.RequestID(meta.Sequence.Stream), State: kv.RequestFailed, Labels: []string{}, Nodes: []string{},
		DeclinedBy: []string{}, RequestorData: json.RawMessage("{}"), Priority: events.DefaultPriority,
		Created: meta.Timestamp.UTC(), StateTime: now}
	defer func() {
		_ = recover() // a message that cannot even be read keeps the stream's id
	}()
	m, err := events.ParseRequest(data)
	if m.ID != "" && events.ValidID(m.ID) && !events.ReservedID(m.ID) {
		rec.ID = m.ID
	}
	if err == nil {
		rec.Labels, rec.Requestor, rec.Tenant = m.Labels, m.Requestor, m.Tenant
	}
	return rec
}

// maxPayload is the largest message the NATS server takes.
func (l *Launcher) maxPayload() int64 {
	if nc := l.js.Conn(); nc != nil {
		return nc.MaxPayload()
	}
	return 0
}

func (l *Launcher) createNewRequest(ctx context.Context, id string, r *kv.Request) (kv.Entry[kv.Request], error) {
	rev, err := l.b.Requests.CreateNew(ctx, id, r)
	if err != nil {
		return kv.Entry[kv.Request]{}, err
	}
	e := kv.Entry[kv.Request]{Key: id, Value: *r, Revision: rev}
	l.requests.Apply(e)
	return e, nil
}

// requestLeaseGrace is how long a request recorded after its lease ran
// out lives, for its requestor to renew it.
const requestLeaseGrace = time.Minute

// requestRecord builds the record of a request message: requested, or
// failed with the reason it is not a valid request.
func (l *Launcher) requestRecord(ctx context.Context, data []byte, meta *jetstream.MsgMetadata) *kv.Request {
	m, perr := events.ParseRequest(data)
	id := m.ID
	if id == "" {
		id = events.RequestID(meta.Sequence.Stream)
	}
	now := l.clock.Now().UTC()
	rec := &kv.Request{
		ID:               id,
		State:            kv.RequestRequested,
		Labels:           m.Labels,
		Nodes:            []string{},
		DeclinedBy:       []string{},
		Provider:         m.Provider,
		Requestor:        m.Requestor,
		Priority:         m.PriorityOrDefault(),
		RelativePriority: m.RelativePriority,
		Reuse:            m.ReuseOrDefault(),
		Tenant:           m.Tenant,
		EventID:          m.EventID,
		RequestorData:    m.RequestorData,
		Created:          meta.Timestamp.UTC(),
		StateTime:        now,
	}
	if m.LeaseUntil != nil {
		// A request recorded after its lease ran out (the launchers were
		// away) gets a moment more, so a requestor that is still there
		// can renew it.
		until := m.LeaseUntil.UTC()
		if until.Before(now) {
			until = now.Add(requestLeaseGrace)
		}
		rec.LeaseUntil = &until
	}
	if rec.Labels == nil {
		rec.Labels = []string{}
	}
	if len(rec.RequestorData) == 0 || string(rec.RequestorData) == "null" {
		rec.RequestorData = json.RawMessage("{}")
	}
	switch {
	case perr != nil:
		rec.State, rec.Reason = kv.RequestFailed, perr.Error()
	default:
		if unknown, known := l.unknownLabels(ctx, rec.Labels); len(unknown) > 0 {
			rec.State = kv.RequestFailed
			rec.Reason = fmt.Sprintf("unknown label(s) %s; the live launchers provide: %s",
				strings.Join(unknown, ", "), strings.Join(known, ", "))
		}
	}
	return rec
}

// unknownLabels lists the labels that neither this launcher's
// configuration nor any live launcher's pools provide (launchers may run
// different configurations), and the labels that are known. A label
// unknown to the cache is looked for once more in the components bucket
// itself: a launcher that has just started may not have reached the cache
// yet, and its labels must not be refused.
func (l *Launcher) unknownLabels(ctx context.Context, labels []string) (unknown, known []string) {
	pools := slices.Collect(maps.Values(l.livePools()))
	unknown, known = unknownIn(l.config().LabelNames(), pools, labels)
	if len(unknown) == 0 {
		return unknown, known
	}
	if comps, err := l.b.Components.List(ctx); err == nil {
		for _, c := range comps {
			pools = append(pools, c.Value.Pools...)
		}
		unknown, known = unknownIn(l.config().LabelNames(), pools, labels)
	}
	return unknown, known
}

// unknownIn lists the labels neither the configured ones nor the pools
// provide, and the labels that are known, sorted.
func unknownIn(configured []string, pools []kv.ComponentPool, labels []string) (unknown, known []string) {
	known = slices.Clone(configured)
	for _, p := range pools {
		for _, lb := range p.Labels {
			if !slices.Contains(known, lb) {
				known = append(known, lb)
			}
		}
	}
	for _, lb := range labels {
		if !slices.Contains(known, lb) && !slices.Contains(unknown, lb) {
			unknown = append(unknown, lb)
		}
	}
	slices.Sort(known)
	return unknown, known
}
