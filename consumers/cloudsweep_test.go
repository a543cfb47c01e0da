package consumers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
)

// hangingList is a driver whose instance listing hangs until its caller
// gives up, as a cloud's API does when it stops answering.
type hangingList struct {
	drivers.Provider
	calls atomic.Int32
}

func (p *hangingList) Unwrap() drivers.Provider { return p.Provider }

func (p *hangingList) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	p.calls.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A provider whose cloud hangs holds up its own sweep only: another
// provider's leaked instance is still deleted, holds still expire, and the
// hung provider's sweep is not started again while its pass runs.
func TestHungCloudHoldsUpOnlyItsOwnSweep(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
labels: [{name: small}, {name: other}]
providers:
  - name: hung
    driver: fake
    pools: [{name: p, labels: [other]}]
  - name: c
    driver: fake
    pools: [{name: p, labels: [small]}]
`)
	hung := &hangingList{}
	h.wrap = func(name string, p drivers.Provider) drivers.Provider {
		if name != "hung" {
			return p
		}
		hung.Provider = p
		return hung
	}
	l := h.startLauncher("l1")
	h.until(10*time.Second, "the hung provider's listing called", func() bool { return hung.calls.Load() > 0 })

	cloud, ok := drivers.As[*fake.Provider](l.Providers["c"])
	if !ok {
		t.Fatalf("provider c is a %T", l.Providers["c"])
	}
	leaked, err := cloud.Inject(t.Context(), "npghost", map[string]string{drivers.TagProvider: "c", drivers.TagNode: "ghost"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"small"}}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Hold(t.Context(), nodes[0].ID, "debugging", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	h.until(20*time.Second, "c's leaked instance deleted and the expired hold deleted", func() bool {
		_, there := h.instances["c"].Get(leaked)
		_, held := h.nodes.Get(nodes[0].ID)
		return !there && !held
	})
	if n := hung.calls.Load(); n > 2 {
		t.Errorf("the hung provider's listing was called %d times while its first calls hung; want at most 2 (the quota reading and the sweep)", n)
	}
	// Requests of the hung provider's labels are still served: launches
	// make no listing.
	other, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"other"}}, "tester")
	if err != nil || len(other) != 1 {
		t.Fatalf("request of the hung provider's label: %v %v", other, err)
	}
}
