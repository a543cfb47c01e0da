package consumers_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

const apiConfig = `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`

// asOwner is a client of the harness's server acting as another
// requestor (on a server without users, the identity is the client's
// word; nats.conf makes it the server's: service/natsconf_test.go).
func (h *harness) asOwner(owner string) *client.Client {
	h.t.Helper()
	nc, err := nats.Connect(h.srv.ClientURL())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	c, err := client.New(h.t.Context(), nc)
	if err != nil {
		h.t.Fatal(err)
	}
	c.Owner = owner
	return c
}

// A request's owner is the identity of the subject it was published on,
// and only its owner may take its nodes, give them back, hold them,
// renew them, delete the request or renew its lease; every verb is
// idempotent.
func TestRequestorEndpointsCheckOwnership(t *testing.T) {
	t.Parallel()
	h := newHarness(t, apiConfig)
	h.startLauncher("l1")
	alice, bob := h.asOwner("alice"), h.asOwner("bob")
	ctx := t.Context()

	id, err := alice.Submit(ctx, events.RequestMessage{ID: "alice-1", Labels: []string{"small"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := alice.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Value.Owner != "alice" {
		t.Fatalf("request owner %q; want alice (from nodepool.requests.alice.new)", r.Value.Owner)
	}
	node := r.Value.Nodes[0]

	// Bob may not touch Alice's request or node.
	if _, err := bob.Take(ctx, node, id, "bob", nil); !errors.Is(err, client.ErrNotYours) {
		t.Errorf("bob took alice's node: %v", err)
	}
	if err := bob.DeleteRequest(ctx, id); !errors.Is(err, client.ErrNotYours) {
		t.Errorf("bob deleted alice's request: %v", err)
	}
	if err := bob.RenewRequest(ctx, id, time.Now().Add(time.Hour)); !errors.Is(err, client.ErrNotYours) {
		t.Errorf("bob renewed alice's request: %v", err)
	}
	// Alice takes it, twice (an answer lost: the same answer again).
	first, err := alice.Take(ctx, node, id, "alice@ci", nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := alice.Take(ctx, node, id, "alice@ci", nil)
	if err != nil || again.Value.State != kv.NodeInUse || first.Value.Owner != "alice" || again.Value.Holder != "alice@ci" {
		t.Fatalf("taking again: %+v %v", again.Value, err)
	}
	for what, err := range map[string]error{
		"return": bob.Return(ctx, node),
		"renew":  bob.Renew(ctx, node, "bob", time.Now().Add(time.Hour)),
	} {
		if !errors.Is(err, client.ErrNotYours) {
			t.Errorf("bob may %s alice's node: %v", what, err)
		}
	}
	if _, err := bob.Hold(ctx, node, "mine now", time.Hour); !errors.Is(err, client.ErrNotYours) {
		t.Errorf("bob held alice's node: %v", err)
	}
	if n, ok := h.node(node); !ok || n.State != kv.NodeInUse || n.Holder != "alice@ci" {
		t.Fatalf("alice's node after bob's tries: %+v", n)
	}
	// Alice renews, holds, deletes her request, gives the node back.
	if err := alice.Renew(ctx, node, "alice@ci", time.Now().Add(time.Hour)); err != nil {
		t.Error(err)
	}
	held, err := alice.Hold(ctx, node, "look at it", time.Hour)
	if err != nil || held.Value.State != kv.NodeHold || held.Value.HoldExpiration == nil || held.Value.Comment != "look at it" {
		t.Errorf("hold: %+v %v", held.Value, err)
	}
	if err := alice.DeleteRequest(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := alice.DeleteRequest(ctx, id); err != nil {
		t.Errorf("deleting again: %v", err)
	}
	if err := alice.Return(ctx, node); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "the node deleted", func() bool { _, ok := h.node(node); return !ok })
	if err := alice.Return(ctx, node); err != nil {
		t.Errorf("returning a node already deleted: %v", err)
	}
}

// Calls that are not valid are answered with what is wrong, and change
// nothing.
func TestRequestorEndpointsRefuseBadCalls(t *testing.T) {
	t.Parallel()
	h := newHarness(t, apiConfig)
	h.startLauncher("l1")
	for _, c := range []struct {
		subject, body, want string
	}{
		{"nodepool.api.alice.take", `{"node": "n"}`, "take: request: required"},
		{"nodepool.api.alice.take", `{"node": "n", "request": "r", "colour": "red"}`, `unknown field "colour"`},
		{"nodepool.api.alice.take", `not json`, "take: not a valid call"},
		{"nodepool.api.alice.take", ``, "the body is empty"},
		{"nodepool.api.alice.return", `{"node": "n", "lease_until": "2030-01-01T00:00:00Z"}`, "lease_until: not taken by return"},
		{"nodepool.api.alice.hold", `{"node": "n", "expire": "soon"}`, `expected a duration such as "2h"`},
		{"nodepool.api.alice.renew", `{"node": "n"}`, "lease_until: required"},
		{"nodepool.api.alice.fly", `{}`, "not an endpoint"},
		{"nodepool.api.alice.take", `{"node": "a b", "request": "r"}`, `node: "a b" is not a valid id`},
		{"nodepool.api.alice.take", `{"node": "nosuch", "request": "nosuch"}`, "request nosuch does not exist"},
	} {
		var msg *nats.Msg
		var err error
		h.until(10*time.Second, "an answer", func() bool {
			msg, err = h.nc.Request(c.subject, []byte(c.body), 5*time.Second)
			return !errors.Is(err, nats.ErrNoResponders) // the launcher is starting
		})
		if err != nil {
			t.Fatalf("%s %s: %v", c.subject, c.body, err)
		}
		var r events.APIReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.Error, c.want) {
			t.Errorf("%s %s: answered %+v; want an error containing %q", c.subject, c.body, r, c.want)
		}
	}
}

// Ids: a request may not choose an id of ten digits (those of requests
// published without one), so it cannot take one first; a request whose id
// another requestor's request holds is recorded under its own stream
// sequence, failed with the reason, and the other request is untouched.
func TestRequestIDsCannotBeSquattedOrShared(t *testing.T) {
	t.Parallel()
	h := newHarness(t, apiConfig)
	h.startLauncher("l1")
	alice, bob := h.asOwner("alice"), h.asOwner("bob")
	ctx := t.Context()

	// Publishing a ten-digit id: refused, recorded under its own sequence.
	ack, err := h.js.Publish(ctx, "nodepool.requests.bob.new", []byte(`{"id": "0000000999", "labels": ["small"]}`))
	if err != nil {
		t.Fatal(err)
	}
	seqID := events.RequestID(ack.Sequence)
	h.until(10*time.Second, "the squatting request recorded", func() bool { _, ok := h.request(seqID); return ok })
	if r, _ := h.request(seqID); r.State != kv.RequestFailed || !strings.Contains(r.Reason, "reserved") {
		t.Errorf("a ten-digit id: %+v", r)
	}
	if _, ok := h.request("0000000999"); ok {
		t.Error("a ten-digit id was recorded under that id")
	}

	// Alice has "build-1"; Bob publishes "build-1" too.
	if _, err := alice.Submit(ctx, events.RequestMessage{ID: "build-1", Labels: []string{"small"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Wait(ctx, "build-1"); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(events.RequestMessage{ID: "build-1", Labels: []string{"small", "small"}})
	ack, err = h.js.Publish(ctx, "nodepool.requests.bob.new", data)
	if err != nil {
		t.Fatal(err)
	}
	taken := events.RequestID(ack.Sequence)
	h.until(10*time.Second, "bob's request recorded", func() bool { _, ok := h.request(taken); return ok })
	if r, _ := h.request(taken); r.State != kv.RequestFailed || !strings.Contains(r.Reason, `id "build-1" is taken`) || r.Owner != "bob" {
		t.Errorf("bob's request: %+v", r)
	}
	if r, _ := h.request("build-1"); r.Owner != "alice" || len(r.Labels) != 1 {
		t.Errorf("alice's request changed: %+v", r)
	}
	// Bob's Go client, waiting on the id, says so.
	if _, err := bob.Wait(ctx, "build-1"); !errors.Is(err, client.ErrIDTaken) {
		t.Errorf("bob waiting on alice's id: %v", err)
	}
}
