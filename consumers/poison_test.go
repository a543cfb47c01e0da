package consumers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// A request message whose record would be bigger than the server's max
// payload (its requestor_data fits in the message, not in the record) is
// recorded failed without its requestor_data, saying so, instead of being
// delivered again for ever.
func TestOversizedRequestIsRecordedFailed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	h.startLauncher("l1")
	nc, _ := h.srv.Connect(t)
	max := int(nc.MaxPayload())
	msg := func(id string, size int) []byte {
		data, _ := json.Marshal(map[string]any{"id": id, "labels": []string{"small"}, "requestor_data": map[string]string{"blob": strings.Repeat("x", size)}})
		return data
	}
	// As big as a message may be: the record adds its own fields.
	big := msg("big", max-len(msg("big", 0))-8)
	if _, err := h.js.Publish(t.Context(), events.NewRequestSubject, big); err != nil {
		t.Fatal(err)
	}
	small := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(30*time.Second, "big", small)
	r, _ := h.request("big")
	if r.State != kv.RequestFailed || !strings.Contains(r.Reason, "max payload") || !strings.Contains(r.Reason, "without requestor_data") {
		t.Errorf("oversized request: %s, %q", r.State, r.Reason)
	}
	if string(r.RequestorData) != "{}" {
		t.Errorf("oversized request kept %d bytes of requestor_data", len(r.RequestorData))
	}
	if r, _ := h.request(small); r.State != kv.RequestFulfilled {
		t.Errorf("the request behind it: %s (%s)", r.State, r.Reason)
	}
}

// panicky is a driver whose create machines panic for one label, as a
// driver bug or bad driver data would make them.
type panicky struct {
	drivers.Provider
	label string
}

func (p *panicky) Unwrap() drivers.Provider { return p.Provider }

func (p *panicky) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	sm, err := p.Provider.Create(req, state)
	if err != nil || req.Label != p.label {
		return sm, err
	}
	return &panickyMachine{StateMachine: sm}, nil
}

type panickyMachine struct{ drivers.StateMachine }

func (m *panickyMachine) Advance(ctx context.Context) (drivers.Step, error) {
	var slots []int
	return drivers.Step{}, fmt.Errorf("unreachable %d", slots[len(slots)-1]) // index out of range
}

// A machine that panics fails its node and its request with the reason,
// and the launcher goes on serving the others.
func TestPanickingLaunchFailsOneRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}, {name: boom}]
providers:
  - name: c
    driver: fake
    pools: [{name: p, labels: [small, boom]}]
`)
	h.wrap = func(_ string, p drivers.Provider) drivers.Provider { return &panicky{Provider: p, label: "boom"} }
	h.startLauncher("l1")
	boom := h.submit(events.RequestMessage{Labels: []string{"boom"}})
	h.waitDone(20*time.Second, boom)
	if r, _ := h.request(boom); r.State != kv.RequestFailed || !strings.Contains(r.Reason, "internal error") {
		t.Errorf("request %s: %s (%q)", boom, r.State, r.Reason)
	}
	ok := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(20*time.Second, ok)
	if r, _ := h.request(ok); r.State != kv.RequestFulfilled {
		t.Errorf("request after the panic: %s (%s)", r.State, r.Reason)
	}
	h.until(20*time.Second, "the failed node deleted", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.HasLabel("boom") }) == 0
	})
}
