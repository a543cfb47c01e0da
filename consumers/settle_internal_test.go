package consumers

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// A fulfilment whose answer never came is settled before its nodes are
// given back: landed, it counts; not landed, the request is written again
// at the revision it is read at, so that the write in doubt, coming late,
// is refused; a request that is gone needs nothing.
func TestSettleRequestClosesTheDoorOnALateWrite(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, _ := logtest.New(t)
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1}, log)
	if err != nil {
		t.Fatal(err)
	}
	cache := kv.NewCache(b.Requests, log)
	defer cache.Start()()
	lists := func(r *kv.Request) bool {
		return r.State == kv.RequestFulfilled && slices.Equal(r.Nodes, []string{"n1"})
	}
	now := time.Now().UTC()
	for _, tc := range []struct {
		name   string
		landed bool // the fulfilment in doubt landed
		gone   bool // the request was deleted meanwhile
	}{
		{name: "landed", landed: true},
		{name: "not landed"},
		{name: "gone", gone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			id := "settle-" + tc.name[:3]
			r := &kv.Request{ID: id, State: kv.RequestRequested, Labels: []string{"small"}, Requestor: "tester", Created: now, StateTime: now}
			rev, err := b.Requests.Create(ctx, id, r)
			if err != nil {
				t.Fatal(err)
			}
			fulfilled := *r
			fulfilled.State, fulfilled.Nodes = kv.RequestFulfilled, []string{"n1"}
			switch {
			case tc.landed:
				if rev, err = b.Requests.Update(ctx, id, &fulfilled, rev); err != nil {
					t.Fatal(err)
				}
			case tc.gone:
				if err := b.Requests.Delete(ctx, id, rev); err != nil {
					t.Fatal(err)
				}
			}
			landed, err := settleRequest(ctx, b.Requests, cache, id, lists)
			if err != nil || landed != tc.landed {
				t.Fatalf("settled: landed %v (%v), want %v", landed, err, tc.landed)
			}
			if tc.landed || tc.gone {
				if e, err := b.Requests.Get(ctx, id); err == nil && e.Revision != rev {
					t.Errorf("the request was written again (revision %d, was %d)", e.Revision, rev)
				}
				return
			}
			// The write in doubt, coming now, finds the door closed.
			if _, err := b.Requests.Update(ctx, id, &fulfilled, rev); !errors.Is(err, kv.ErrConflict) {
				t.Fatalf("a late fulfilment at revision %d: %v, want a conflict", rev, err)
			}
			if e, err := b.Requests.Get(ctx, id); err != nil || e.Value.State != kv.RequestRequested {
				t.Fatalf("request after the late write: %+v %v", e.Value, err)
			}
		})
	}
}
