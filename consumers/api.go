package consumers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/kv"
)

// APIQueue is the queue group of the requestor's endpoints: every
// launcher process answers its share.
const APIQueue = "nodepool-api"

// apiWorkers is how many calls a process answers at once.
const apiWorkers = 16

// api answers the requestor's endpoints (events.APISubjects): a requestor
// acts on its own requests and the nodes they got, and on nothing else.
// Its identity is the <owner> token of the subject, which nats.conf ties
// to its user. Every change is a revision-checked update of the record as
// it is now (read from the bucket, not a cache), and every verb is
// idempotent: a call made again after its answer was lost finds what the
// first one did and answers the same.
type api struct {
	b   *kv.Buckets
	log *slog.Logger
	now func() time.Time
}

// apiError is a refusal with its kind (events.API*).
type apiError struct {
	code string
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func refuse(code, format string, args ...any) error {
	return &apiError{code: code, msg: fmt.Sprintf(format, args...)}
}

// startAPI subscribes to the endpoints in the API's queue group.
func (l *Launcher) startAPI(ctx context.Context) (stoppable, error) {
	a := &api{b: l.b, log: l.log.With("worker", "api"), now: l.clock.Now}
	nc := l.js.Conn()
	msgs := make(chan *nats.Msg, 256)
	sub, err := nc.ChanQueueSubscribe(events.APISubjects, APIQueue, msgs)
	if err != nil {
		return nil, fmt.Errorf("subscribing to the requestor's endpoints: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	s := &apiServer{sub: sub, msgs: msgs}
	for range apiWorkers {
		s.wg.Go(func() {
			for m := range msgs {
				a.serve(ctx, m)
			}
		})
	}
	return s, nil
}

type apiServer struct {
	sub  *nats.Subscription
	msgs chan *nats.Msg
	wg   sync.WaitGroup
	once sync.Once
}

// Stop stops taking calls and waits for those in progress.
func (s *apiServer) Stop() {
	s.once.Do(func() {
		_ = s.sub.Unsubscribe()
		close(s.msgs)
		s.wg.Wait()
	})
}

// serve answers one call. A call that panics is answered with the reason;
// the process goes on.
func (a *api) serve(ctx context.Context, m *nats.Msg) {
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("an endpoint panicked (a bug, please report it)", "subject", m.Subject, "panic", p, "stack", string(debug.Stack()))
			a.reply(m, events.APIReply{Error: fmt.Sprintf("internal error (a bug, please report it): %v", p), Code: events.APIInternal})
		}
	}()
	owner, verb, ok := events.ParseAPISubject(m.Subject)
	if !ok {
		a.reply(m, events.APIReply{Error: fmt.Sprintf("%s: not an endpoint; expected nodepool.api.<owner>.<verb>, verb one of %v", m.Subject, events.APIVerbs), Code: events.APIBadCall})
		return
	}
	call, err := events.ParseAPICall(verb, m.Data)
	if err != nil {
		a.reply(m, events.APIReply{Error: err.Error(), Code: events.APIBadCall})
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out events.APIReply
	switch verb {
	case events.APITake:
		out, err = a.take(cctx, owner, call)
	case events.APIRenew:
		out, err = a.renew(cctx, owner, call)
	case events.APIReturn:
		out, err = a.giveBack(cctx, owner, call)
	case events.APIHold:
		out, err = a.hold(cctx, owner, call)
	case events.APIDeleteRequest:
		out, err = a.deleteRequest(cctx, owner, call)
	case events.APIRenewRequest:
		out, err = a.renewRequest(cctx, owner, call)
	}
	if err != nil {
		var ae *apiError
		switch {
		case errors.As(err, &ae):
			out = events.APIReply{Error: ae.msg, Code: ae.code}
		case natsretry.Transient(err):
			out = events.APIReply{Error: err.Error(), Code: events.APIUnavailable}
		default:
			a.log.Warn("an endpoint failed", "subject", m.Subject, "err", err)
			out = events.APIReply{Error: err.Error(), Code: events.APIInternal}
		}
	}
	a.reply(m, out)
}

func (a *api) reply(m *nats.Msg, r events.APIReply) {
	if m.Reply == "" {
		return
	}
	data, err := json.Marshal(r)
	if err != nil {
		data = []byte(`{"error": "internal error: the answer could not be encoded", "code": "internal"}`)
	}
	_ = m.Respond(data)
}

func nodeReply(e kv.Entry[kv.Node]) events.APIReply {
	data, _ := json.Marshal(e.Value)
	return events.APIReply{Node: data}
}

// ownRequest reads a request and checks it is the owner's.
func (a *api) ownRequest(ctx context.Context, owner, id string) (kv.Entry[kv.Request], error) {
	e, err := natsretry.Do(ctx, func(ctx context.Context) (kv.Entry[kv.Request], error) { return a.b.Requests.Get(ctx, id) })
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return e, refuse(events.APINotFound, "request %s does not exist", id)
	case errors.Is(err, kv.ErrBadRecord):
		return e, refuse(events.APIState, "request %s is not a valid record", id)
	case err != nil:
		return e, err
	}
	if e.Value.Owner != owner {
		return e, refuse(events.APINotYours, "request %s is not %s's", id, owner)
	}
	return e, nil
}

// modifyNode changes a node through fn, which may refuse (an *apiError).
func (a *api) modifyNode(ctx context.Context, id string, fn func(n *kv.Node) error) (kv.Entry[kv.Node], error) {
	e, err := natsretry.Do(ctx, func(ctx context.Context) (kv.Entry[kv.Node], error) { return a.b.Nodes.Modify(ctx, id, fn) })
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return e, refuse(events.APINotFound, "node %s does not exist", id)
	case errors.Is(err, kv.ErrBadRecord):
		return e, refuse(events.APIState, "node %s is not a valid record", id)
	}
	return e, err
}

// take: a node allocated to the owner's request, ready, becomes in-use,
// the owner's, held by holder.
func (a *api) take(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	if _, err := a.ownRequest(ctx, owner, c.Request); err != nil {
		return events.APIReply{}, err
	}
	holder := c.Holder
	if holder == "" {
		holder = owner
	}
	var already bool
	e, err := a.modifyNode(ctx, c.Node, func(n *kv.Node) error {
		if n.State == kv.NodeInUse && n.AllocatedTo == c.Request && n.Owner == owner && n.Holder == holder {
			already = true // taken by an earlier call whose answer was lost
			return kv.ErrSkip
		}
		if n.AllocatedTo != c.Request {
			return refuse(events.APINotYours, "node %s is not allocated to request %s", c.Node, c.Request)
		}
		if n.State != kv.NodeReady {
			return refuse(events.APIState, "node %s is %s; only a ready node can be taken", c.Node, n.State)
		}
		n.SetState(kv.NodeInUse, a.now().UTC())
		n.Holder, n.Owner, n.LeaseUntil = holder, owner, utc(c.LeaseUntil)
		return nil
	})
	if already {
		return nodeReply(e), nil
	}
	if err != nil {
		return events.APIReply{}, err
	}
	return nodeReply(e), nil
}

// ownNode checks that a node is the owner's (it took it).
func ownNode(n *kv.Node, id, owner string) error {
	if n.Owner != owner {
		return refuse(events.APINotYours, "node %s is not %s's", id, owner)
	}
	return nil
}

// renew extends the lease of the owner's in-use node.
func (a *api) renew(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	e, err := a.modifyNode(ctx, c.Node, func(n *kv.Node) error {
		if err := ownNode(n, c.Node, owner); err != nil {
			return err
		}
		if n.State != kv.NodeInUse {
			return refuse(events.APIState, "node %s is %s; only an in-use node has a lease", c.Node, n.State)
		}
		n.LeaseUntil = utc(c.LeaseUntil)
		return nil
	})
	if err != nil {
		return events.APIReply{}, err
	}
	return nodeReply(e), nil
}

// giveBack: the owner's node becomes used (it is deleted). A node gone
// or already given back is no error (an earlier call landed).
func (a *api) giveBack(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	var done bool
	e, err := a.modifyNode(ctx, c.Node, func(n *kv.Node) error {
		if err := ownNode(n, c.Node, owner); err != nil {
			return err
		}
		switch n.State {
		case kv.NodeUsed, kv.NodeDeleting:
			done = true
			return kv.ErrSkip
		case kv.NodeInUse, kv.NodeHold:
		default:
			return refuse(events.APIState, "node %s is %s; only an in-use or held node can be given back", c.Node, n.State)
		}
		n.SetState(kv.NodeUsed, a.now().UTC())
		return nil
	})
	var ae *apiError
	switch {
	case done:
		return nodeReply(e), nil
	case errors.As(err, &ae) && ae.code == events.APINotFound:
		return events.APIReply{Gone: true}, nil
	case err != nil:
		return events.APIReply{}, err
	}
	return nodeReply(e), nil
}

// hold keeps the owner's node out of service (as Zuul's autohold does)
// until its expiry, max-hold-age, or it is given back.
func (a *api) hold(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	e, err := a.modifyNode(ctx, c.Node, func(n *kv.Node) error {
		if err := ownNode(n, c.Node, owner); err != nil {
			return err
		}
		if n.State != kv.NodeInUse && n.State != kv.NodeHold {
			return refuse(events.APIState, "node %s is %s; only an in-use or held node can be held", c.Node, n.State)
		}
		now := a.now().UTC()
		n.SetState(kv.NodeHold, now)
		n.Comment = c.Reason
		n.HoldExpiration = nil
		if c.Expire != nil && *c.Expire > 0 {
			until := now.Add(time.Duration(*c.Expire))
			n.HoldExpiration = &until
		}
		return nil
	})
	if err != nil {
		return events.APIReply{}, err
	}
	return nodeReply(e), nil
}

// deleteRequest deletes the owner's request (its nodes not taken go back
// to the pool). A request gone is no error.
func (a *api) deleteRequest(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	for attempt := 0; ; attempt++ {
		e, err := a.ownRequest(ctx, owner, c.Request)
		var ae *apiError
		if errors.As(err, &ae) && ae.code == events.APINotFound {
			return events.APIReply{Gone: true}, nil
		}
		if err != nil {
			return events.APIReply{}, err
		}
		err = a.b.Requests.Delete(ctx, c.Request, e.Revision)
		if err == nil || errors.Is(err, kv.ErrNotFound) {
			return events.APIReply{Gone: true}, nil
		}
		if !errors.Is(err, kv.ErrConflict) || attempt >= 50 || ctx.Err() != nil {
			return events.APIReply{}, err
		}
	}
}

// renewRequest extends the lease of the owner's request.
func (a *api) renewRequest(ctx context.Context, owner string, c events.APICall) (events.APIReply, error) {
	if _, err := a.ownRequest(ctx, owner, c.Request); err != nil {
		return events.APIReply{}, err
	}
	e, err := a.b.Requests.Modify(ctx, c.Request, func(r *kv.Request) error {
		if r.Owner != owner {
			return refuse(events.APINotYours, "request %s is not %s's", c.Request, owner)
		}
		r.LeaseUntil = utc(c.LeaseUntil)
		return nil
	})
	if errors.Is(err, kv.ErrNotFound) {
		return events.APIReply{}, refuse(events.APINotFound, "request %s does not exist", c.Request)
	}
	if err != nil {
		return events.APIReply{}, err
	}
	data, _ := json.Marshal(e.Value)
	return events.APIReply{Request: data}, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
