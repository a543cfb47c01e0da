// Package client speaks the requestor protocol for Go programs: submit a
// node request, wait for it, take the nodes, give them back. It uses only
// the public contract, as any other client would: it publishes requests on
// its identity's subject (nodepool.requests.<owner>.new), reads and
// watches the nodepool-requests and nodepool-nodes buckets, and acts on
// its requests and nodes through the requestor's endpoints
// (nodepool.api.<owner>.<verb>). Operators' commands that act on anyone's
// nodes (a forced return, a delete) write the records directly, which
// only the service's and operators' credentials may do.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Errors of the requestor protocol.
var (
	// ErrRequestFailed: the request ended in state failed; the error says why.
	ErrRequestFailed = errors.New("request failed")
	// ErrRequestDeleted: the request record disappeared while waiting.
	ErrRequestDeleted = errors.New("request was deleted")
	// ErrNotReady: the node is not ready (and allocated as expected).
	ErrNotReady = errors.New("node is not ready for this request")
	// ErrNotYours: the request or node is another requestor's.
	ErrNotYours = errors.New("not this requestor's")
	// ErrIDTaken: the request's id is another requestor's request's.
	ErrIDTaken = errors.New("request id taken by another requestor")
)

// Client is a connection to nodepool's NATS server.
type Client struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	b     *kv.Buckets
	owned bool

	// Owner is the client's identity: its requests are published on
	// nodepool.requests.<Owner>.new and it acts through
	// nodepool.api.<Owner>.<verb> (nats.conf ties each requestor user to
	// its own). Connect sets it from the settings (NODEPOOL_OWNER, else
	// the user of NODEPOOL_NATS_URL); New from the connection's user; both
	// default to events.Anonymous.
	Owner string

	// RequestLease is the lease Request gives the requests it makes: the
	// request carries lease_until that far ahead, renewed every third of
	// it while Request runs, so a requestor that vanishes (killed, cut
	// off) frees its nodes once the lease runs out. 0 means
	// DefaultRequestLease; a negative value makes requests without a
	// lease, which live until deleted.
	RequestLease time.Duration
}

// DefaultRequestLease is the lease of a request made by Request.
const DefaultRequestLease = time.Minute

// abandonWait bounds how long a requestor that gives up waits for its
// request to be recorded (and deleted).
const abandonWait = 5 * time.Second

// ConnectOptions builds nats.Options from the process settings: URL, creds
// and TLS. With no URL it points at the embedded server's address.
func ConnectOptions(s config.Settings, name string) (string, []nats.Option) {
	url := s.NatsURL
	if url == "" {
		url = "nats://" + s.NatsListen
	}
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond)}
	if s.NatsCreds != "" {
		opts = append(opts, nats.UserCredentials(s.NatsCreds))
	}
	if s.NatsTLSCA != "" {
		opts = append(opts, nats.RootCAs(s.NatsTLSCA))
	}
	if s.NatsTLSCert != "" || s.NatsTLSKey != "" {
		opts = append(opts, nats.ClientCert(s.NatsTLSCert, s.NatsTLSKey))
	}
	return url, opts
}

// Connect connects with the process settings.
func Connect(ctx context.Context, s config.Settings) (*Client, error) {
	url, opts := ConnectOptions(s, "nodepool-client")
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(2))...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s (is `nodepool run` up, or NODEPOOL_NATS_URL set?): %w", config.RedactURLs(url), err)
	}
	c, err := New(ctx, nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.owned = true
	if owner := s.RequestorIdentity(); owner != "" {
		c.Owner = owner
	}
	return c, nil
}

// New uses an existing connection; the buckets must exist (a launcher
// creates them).
func New(ctx context.Context, nc *nats.Conn) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	b, err := kv.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	return &Client{nc: nc, js: js, b: b, Owner: connUser(nc)}, nil
}

// connUser is the user a connection authenticated as, when it names one
// that can be an identity (options, or the URL's user:password), else
// events.Anonymous.
func connUser(nc *nats.Conn) string {
	if events.ValidOwner(nc.Opts.User) {
		return nc.Opts.User
	}
	for _, raw := range append([]string{nc.ConnectedUrl()}, nc.Opts.Servers...) {
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			continue
		}
		if _, hasPassword := u.User.Password(); hasPassword && events.ValidOwner(u.User.Username()) {
			return u.User.Username()
		}
	}
	if u, err := url.Parse(nc.Opts.Url); err == nil && u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword && events.ValidOwner(u.User.Username()) {
			return u.User.Username()
		}
	}
	return events.Anonymous
}

// Close closes the connection if Connect opened it.
func (c *Client) Close() {
	if c.owned {
		c.nc.Close()
	}
}

// Buckets gives access to the stores, for tools that need more.
func (c *Client) Buckets() *kv.Buckets { return c.b }

// JetStream is the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// Conn is the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Submit publishes a request and returns its id. The publish is
// acknowledged by the stream, and tried again with the same Nats-Msg-Id
// while the cluster elects a leader, until ctx ends.
func (c *Client) Submit(ctx context.Context, m events.RequestMessage) (string, error) {
	return events.PublishOwnedRequest(ctx, c.js, c.owner(), m)
}

func (c *Client) owner() string {
	if c.Owner == "" {
		return events.Anonymous
	}
	return c.Owner
}

// APIError is a refusal of the requestor's endpoints.
type APIError struct {
	Verb, Code, Message string
}

func (e *APIError) Error() string { return e.Message }

// Unwrap maps the refusal's kind to the package's errors.
func (e *APIError) Unwrap() error {
	switch e.Code {
	case events.APINotYours:
		return ErrNotYours
	case events.APIState:
		return ErrNotReady
	case events.APINotFound:
		return kv.ErrNotFound
	}
	return nil
}

// call makes a call to a requestor's endpoint, trying again through
// elections and restarts (the endpoints are idempotent).
func (c *Client) call(ctx context.Context, verb string, body events.APICall) (events.APIReply, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return events.APIReply{}, err
	}
	subject := events.APISubject(c.owner(), verb)
	return natsretry.Do(ctx, func(ctx context.Context) (events.APIReply, error) {
		msg, err := c.nc.RequestWithContext(ctx, subject, data)
		if err != nil {
			return events.APIReply{}, fmt.Errorf("%s (is a launcher running, and may this user use %s?): %w", verb, subject, err)
		}
		var r events.APIReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			return events.APIReply{}, fmt.Errorf("%s: the answer is not valid: %w", verb, err)
		}
		if r.Error != "" {
			if r.Code == events.APIUnavailable {
				return r, fmt.Errorf("%s: %s: %w", verb, r.Error, nats.ErrTimeout) // made again
			}
			return r, &APIError{Verb: verb, Code: r.Code, Message: r.Error}
		}
		return r, nil
	})
}

// nodeOf decodes the node of an answer.
func nodeOf(r events.APIReply, id string) (kv.Entry[kv.Node], error) {
	if len(r.Node) == 0 {
		return kv.Entry[kv.Node]{Key: id}, nil
	}
	n, err := kv.Decode[kv.Node](id, r.Node)
	return kv.Entry[kv.Node]{Key: id, Value: n}, err
}

// Wait watches a request until it is fulfilled or failed. A failed request
// is returned with an error wrapping ErrRequestFailed. A watch that ends
// (its server went away) is started again: it begins with the record as
// it is now.
func (c *Client) Wait(ctx context.Context, id string) (kv.Entry[kv.Request], error) {
	seen := false
	for {
		e, done, err := c.waitOnce(ctx, id, &seen)
		if done || ctx.Err() != nil {
			return e, err
		}
		if !wait.Sleep(ctx, 100*time.Millisecond) {
			return e, fmt.Errorf("waiting for request %s: %w", id, ctx.Err())
		}
	}
}

// waitOnce runs one watch of a request; done is false when the watch
// could not start or ended before the request did.
func (c *Client) waitOnce(ctx context.Context, id string, seen *bool) (kv.Entry[kv.Request], bool, error) {
	w, err := c.b.Requests.WatchKeys(ctx, id)
	if err != nil {
		if natsretry.Transient(err) {
			return kv.Entry[kv.Request]{}, false, err
		}
		return kv.Entry[kv.Request]{}, true, err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return kv.Entry[kv.Request]{}, true, fmt.Errorf("waiting for request %s: %w", id, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				// The watch ends with ctx too: say which ended first.
				if ctx.Err() != nil {
					return kv.Entry[kv.Request]{}, true, fmt.Errorf("waiting for request %s: %w", id, ctx.Err())
				}
				return kv.Entry[kv.Request]{}, false, fmt.Errorf("waiting for request %s: watch closed", id)
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				if *seen {
					return kv.Entry[kv.Request]{}, true, fmt.Errorf("request %s: %w", id, ErrRequestDeleted)
				}
				continue
			}
			*seen = true
			r, err := kv.Decode[kv.Request](id, e.Value())
			if err != nil {
				return kv.Entry[kv.Request]{}, true, err
			}
			entry := kv.Entry[kv.Request]{Key: id, Value: r, Revision: e.Revision()}
			if r.Owner != "" && r.Owner != c.owner() {
				return entry, true, fmt.Errorf("request %s: %w (%s's); the stream's answer to the publish gives the sequence under which this request was recorded, failed", id, ErrIDTaken, r.Owner)
			}
			switch r.State {
			case kv.RequestFulfilled:
				return entry, true, nil
			case kv.RequestFailed:
				return entry, true, fmt.Errorf("request %s: %w: %s", id, ErrRequestFailed, r.Reason)
			}
		}
	}
}

// modifyNode changes a node record, trying again through elections (see
// natsretry): fn must accept the record an earlier try that landed left.
func (c *Client) modifyNode(ctx context.Context, nodeID string, fn func(*kv.Node) error) (kv.Entry[kv.Node], error) {
	return natsretry.Do(ctx, func(ctx context.Context) (kv.Entry[kv.Node], error) {
		return c.b.Nodes.Modify(ctx, nodeID, fn)
	})
}

// giveUpNode is modifyNode for a change that ends with the node deleted
// (a return, a delete): a node gone after an earlier try is no error, as
// that try landed and nodepool has deleted the node since.
func (c *Client) giveUpNode(ctx context.Context, nodeID string, fn func(*kv.Node) error) error {
	tried := false
	_, err := natsretry.Do(ctx, func(ctx context.Context) (kv.Entry[kv.Node], error) {
		e, err := c.b.Nodes.Modify(ctx, nodeID, fn)
		if tried && errors.Is(err, kv.ErrNotFound) {
			return e, kv.ErrSkip
		}
		tried = true
		return e, err
	})
	return err
}

// Take moves a node allocated to one of the client's requests from ready
// to in-use, held by holder (through the take endpoint). A non-nil
// leaseUntil makes the holder responsible for renewing it (Renew): an
// in-use node whose lease ran out is deleted. Taking a node this holder
// already took for this request is a no-op.
func (c *Client) Take(ctx context.Context, nodeID, requestID, holder string, leaseUntil *time.Time) (kv.Entry[kv.Node], error) {
	r, err := c.call(ctx, events.APITake, events.APICall{Node: nodeID, Request: requestID, Holder: holder, LeaseUntil: leaseUntil})
	if err != nil {
		return kv.Entry[kv.Node]{Key: nodeID}, fmt.Errorf("taking node %s: %w", nodeID, err)
	}
	return nodeOf(r, nodeID)
}

// Renew extends the lease of a node the client has in use.
func (c *Client) Renew(ctx context.Context, nodeID, holder string, leaseUntil time.Time) error {
	_, err := c.call(ctx, events.APIRenew, events.APICall{Node: nodeID, LeaseUntil: &leaseUntil})
	if err != nil {
		return fmt.Errorf("renewing node %s: %w", nodeID, err)
	}
	return nil
}

// Return gives back a node the client took (state used, through the
// return endpoint); nodepool then deletes it. A node already given back,
// or gone, is no error.
func (c *Client) Return(ctx context.Context, nodeID string) error {
	if _, err := c.call(ctx, events.APIReturn, events.APICall{Node: nodeID}); err != nil {
		return fmt.Errorf("returning node %s: %w", nodeID, err)
	}
	return nil
}

// ReturnAs gives a node back on behalf of g.Holder: it refuses a node held
// by someone else, allocated to a request, or on hold, unless g.Force.
// Without g.Force, the node goes back through the return endpoint (it must
// be one the client took); with it, the node's record is written directly,
// whoever's it is (operators' credentials only).
func (c *Client) ReturnAs(ctx context.Context, nodeID string, g Guard) error {
	if !g.Force {
		e, err := natsretry.Do(ctx, func(ctx context.Context) (kv.Entry[kv.Node], error) { return c.b.Nodes.Get(ctx, nodeID) })
		if err != nil {
			return err
		}
		if err := g.check(ctx, &e.Value, c.b.Requests); err != nil {
			return err
		}
		return c.Return(ctx, nodeID)
	}
	err := c.giveUpNode(ctx, nodeID, func(n *kv.Node) error {
		switch n.State {
		case kv.NodeInUse, kv.NodeReady, kv.NodeHold:
		case kv.NodeUsed, kv.NodeDeleting:
			return kv.ErrSkip
		default:
			return fmt.Errorf("node %s is %s; only in-use, ready or held nodes can be returned", nodeID, n.State)
		}
		if err := g.check(ctx, n, c.b.Requests); err != nil {
			return err
		}
		n.SetState(kv.NodeUsed, time.Now().UTC())
		return nil
	})
	if errors.Is(err, kv.ErrSkip) {
		return nil
	}
	return err
}

// Hold keeps a node the client took out of service (through the hold
// endpoint) until it is given back, its expiry passes, or max-hold-age
// does. expire 0 means no expiry of its own.
func (c *Client) Hold(ctx context.Context, nodeID, reason string, expire time.Duration) (kv.Entry[kv.Node], error) {
	call := events.APICall{Node: nodeID, Reason: reason}
	if expire > 0 {
		d := events.Duration(expire)
		call.Expire = &d
	}
	r, err := c.call(ctx, events.APIHold, call)
	if err != nil {
		return kv.Entry[kv.Node]{Key: nodeID}, fmt.Errorf("holding node %s: %w", nodeID, err)
	}
	return nodeOf(r, nodeID)
}

// HoldAny holds any ready, in-use or used node, as an operator's
// `nodepool hold` (Nodepool's command): the record is written directly
// (operators' credentials only).
func (c *Client) HoldAny(ctx context.Context, nodeID, reason string, expire time.Duration) (kv.Entry[kv.Node], error) {
	return c.modifyNode(ctx, nodeID, func(n *kv.Node) error {
		switch n.State {
		case kv.NodeReady, kv.NodeInUse, kv.NodeUsed, kv.NodeHold:
		default:
			return fmt.Errorf("node %s is %s; only ready, in-use or used nodes can be held", nodeID, n.State)
		}
		now := time.Now().UTC()
		n.SetState(kv.NodeHold, now)
		n.Comment = reason
		n.HoldExpiration = nil
		if expire > 0 {
			until := now.Add(expire)
			n.HoldExpiration = &until
		}
		return nil
	})
}

// DeleteNode asks for a node to be deleted whatever its state (an
// operator's `nodepool delete --force`).
func (c *Client) DeleteNode(ctx context.Context, nodeID string) error {
	return c.DeleteNodeAs(ctx, nodeID, Guard{Force: true})
}

// DeleteNodeAs asks for a node to be deleted on behalf of g.Holder: it
// refuses a node held by someone else, allocated to a request, or on hold,
// unless g.Force.
func (c *Client) DeleteNodeAs(ctx context.Context, nodeID string, g Guard) error {
	err := c.giveUpNode(ctx, nodeID, func(n *kv.Node) error {
		if n.State == kv.NodeDeleting {
			return kv.ErrSkip
		}
		if err := g.check(ctx, n, c.b.Requests); err != nil {
			return err
		}
		n.SetState(kv.NodeDeleting, time.Now().UTC())
		n.Launcher = ""
		n.DriverData = nil
		return nil
	})
	if errors.Is(err, kv.ErrSkip) {
		return nil
	}
	return err
}

// DeleteRequest deletes one of the client's requests (through the
// delete-request endpoint); nodes allocated to it and not yet taken go
// back to the pool. A request already gone is no error.
func (c *Client) DeleteRequest(ctx context.Context, id string) error {
	if _, err := c.call(ctx, events.APIDeleteRequest, events.APICall{Request: id}); err != nil {
		return fmt.Errorf("deleting request %s: %w", id, err)
	}
	return nil
}

// DeleteAnyRequest deletes any request, as an operator's
// `nodepool request-delete` (Nodepool's command): the record is deleted
// directly (operators' credentials only).
func (c *Client) DeleteAnyRequest(ctx context.Context, id string) error {
	first := true
	_, err := natsretry.Do(ctx, func(ctx context.Context) (struct{}, error) {
		for {
			again := !first
			first = false
			e, err := c.b.Requests.Get(ctx, id)
			if errors.Is(err, kv.ErrNotFound) && again {
				return struct{}{}, nil
			}
			if err != nil && !errors.Is(err, kv.ErrBadRecord) {
				return struct{}{}, err
			}
			err = c.b.Requests.Delete(ctx, id, e.Revision)
			if !errors.Is(err, kv.ErrConflict) || ctx.Err() != nil {
				return struct{}{}, err
			}
		}
	})
	return err
}

// RenewRequest extends the lease of one of the client's requests.
func (c *Client) RenewRequest(ctx context.Context, id string, until time.Time) error {
	until = until.UTC()
	if _, err := c.call(ctx, events.APIRenewRequest, events.APICall{Request: id, LeaseUntil: &until}); err != nil {
		return fmt.Errorf("renewing request %s: %w", id, err)
	}
	return nil
}

// keepRequest renews a request's lease every third of it until ctx ends. A
// request not recorded yet is renewed once it is.
func (c *Client) keepRequest(ctx context.Context, id string, lease time.Duration) {
	t := time.NewTicker(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.RenewRequest(ctx, id, time.Now().Add(lease)) // Wait sees a request that went
		}
	}
}

// Abandon deletes a request its requestor gives up on, freeing the nodes
// allocated to it and not taken. A request published but not recorded yet
// is waited for, up to the deadline of ctx, and deleted once it is.
func (c *Client) Abandon(ctx context.Context, id string) error {
	w, err := c.b.Requests.WatchKeys(ctx, id)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("request %s was not recorded in time to be deleted: %w", id, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return fmt.Errorf("request %s was not recorded in time to be deleted: %w", id, ctx.Err())
				}
				return fmt.Errorf("abandoning request %s: watch closed", id)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				if e != nil {
					return nil // deleted already
				}
				continue
			}
			return c.DeleteRequest(ctx, id)
		}
	}
}

func (c *Client) requestLease() time.Duration {
	if c.RequestLease == 0 {
		return DefaultRequestLease
	}
	return c.RequestLease
}

// Request runs the whole requestor protocol: submit, wait, take every node
// for holder, delete the request. It returns the nodes in label order.
// The request carries a lease (RequestLease), renewed while Request runs.
// Whatever ends it early (ctx cancelled or past its deadline, a failed
// request, an error), the nodes already taken are given back and the
// request is deleted, so nothing stays allocated to a requestor that gave
// up.
func (c *Client) Request(ctx context.Context, m events.RequestMessage, holder string) (nodes []kv.Node, err error) {
	lease := c.requestLease()
	if lease > 0 && m.LeaseUntil == nil {
		until := time.Now().Add(lease).UTC()
		m.LeaseUntil = &until
	}
	id, err := c.Submit(ctx, m)
	if err != nil {
		// The message may have been stored all the same (the answer was
		// lost, or ctx ended while waiting for it): a request with an id
		// of its own is withdrawn; one without is freed by its lease.
		if m.ID != "" {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonWait)
			defer cancel()
			_ = c.Abandon(actx, m.ID)
		}
		return nil, err
	}
	done := false
	defer func() {
		if done {
			return
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonWait)
		defer cancel()
		for _, n := range nodes {
			_ = c.Return(actx, n.ID)
		}
		nodes = nil
		if aerr := c.Abandon(actx, id); aerr != nil {
			err = fmt.Errorf("%w (and the request could not be deleted: %v; its lease, if any, frees it)", err, aerr)
		}
	}()
	if lease > 0 {
		kctx, stop := context.WithCancel(ctx)
		renewed := make(chan struct{})
		go func() {
			defer close(renewed)
			c.keepRequest(kctx, id, lease)
		}()
		defer func() {
			stop()
			<-renewed
		}()
	}
	r, err := c.Wait(ctx, id)
	if err != nil {
		return nil, err
	}
	nodes = make([]kv.Node, 0, len(r.Value.Nodes))
	for _, nid := range r.Value.Nodes {
		e, err := c.Take(ctx, nid, id, holder, nil)
		if err != nil {
			return nodes, fmt.Errorf("taking node %s of request %s: %w", nid, id, err)
		}
		nodes = append(nodes, e.Value)
	}
	// The nodes are the requestor's now, whatever happens to the request
	// (its lease, if any, deletes it if this cannot).
	done = true
	if err := c.DeleteRequest(ctx, id); err != nil && !errors.Is(err, kv.ErrNotFound) {
		return nodes, fmt.Errorf("deleting request %s after taking its nodes: %w", id, err)
	}
	return nodes, nil
}

// Nodes lists every node record.
func (c *Client) Nodes(ctx context.Context) ([]kv.Entry[kv.Node], error) { return c.b.Nodes.List(ctx) }

// Requests lists every request record.
func (c *Client) Requests(ctx context.Context) ([]kv.Entry[kv.Request], error) {
	return c.b.Requests.List(ctx)
}

// Components lists the live launchers and builders.
func (c *Client) Components(ctx context.Context) ([]kv.Entry[kv.Component], error) {
	return c.b.Components.List(ctx)
}

// Holder is a default holder name for people: user@host.
func Holder(user, host string) string {
	return strings.TrimSpace(user) + "@" + strings.TrimSpace(host)
}
