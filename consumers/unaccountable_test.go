package consumers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/kv"
)

// Records nothing accounts for pin nothing: a node record with an unknown
// state, an init record no driver owns, records that do not decode and
// resources that cannot be are ended within a few sweeps (failed with the
// reason and deleted, with any instance they name), they count against no
// quota meanwhile, and the pool they claimed serves its requests; request
// records with an unknown state or that do not decode are failed with the
// reason.
func TestUnaccountableRecordsPinNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, smallPoolOfOne)
	l := h.startLauncher("l1")
	cloud, ok := drivers.As[*fake.Provider](l.Providers["c"])
	if !ok {
		t.Fatalf("provider c is a %T", l.Providers["c"])
	}
	named, err := cloud.Inject(t.Context(), "npnamed", map[string]string{drivers.TagProvider: "c", drivers.TagNode: "named"}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	nodes := []struct {
		key, record string
		reason      string // what the failed record says, if it is failed first
	}{
		{"exploding", `{"id":"exploding","state":"exploding","provider":"c","pool":"p","labels":["small"],"created":"` + now + `","state_time":"` + now + `"}`, `unknown state "exploding"`},
		{"orphan-init", `{"id":"orphan-init","state":"init","provider":"c","pool":"p","labels":["small"],"created":"` + now + `","state_time":"` + now + `"}`, ""},
		{"negative", `{"id":"negative","state":"ready","provider":"c","pool":"p","labels":["small"],"resources":{"instances":-5},"created":"` + now + `","state_time":"` + now + `"}`, "resources below zero"},
		{"huge", `{"id":"huge","state":"ready","provider":"c","pool":"p","labels":["small"],"resources":{"instances":1000},"created":"` + now + `","state_time":"` + now + `"}`, "resources of 1000 instances"},
		{"no-labels", `{"id":"no-labels","state":"ready","provider":"c","pool":"p","labels":[],"created":"` + now + `","state_time":"` + now + `"}`, "no labels"},
		{"garbage", `this is not json`, ""},
		{"no-provider", `{"id":"no-provider","state":"ready","pool":"p","labels":["small"]}`, ""},
		{"named", `{"id":"named","state":"ready","provider":"c","pool":"p","external_id":"` + named + `","resources":"lots"}`, "did not parse"},
	}
	bucket := h.b.Nodes.Bucket()
	for _, n := range nodes {
		if _, err := bucket.Put(t.Context(), n.key, []byte(n.record)); err != nil {
			t.Fatal(err)
		}
	}
	requests := map[string]string{
		"req-exploding": `{"id":"req-exploding","state":"exploding","labels":["small"],"nodes":[]}`,
		"req-garbage":   `{"id":"req-garbage","state":["requested"],"owner":"alice"}`,
	}
	for k, v := range requests {
		if _, err := h.b.Requests.Bucket().Put(t.Context(), k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}

	// The pool of one server serves a request meanwhile.
	r := h.submit(events.RequestMessage{Labels: []string{"small"}})
	h.waitDone(30*time.Second, r)
	if got, _ := h.request(r); got.State != kv.RequestFulfilled {
		t.Errorf("request of the pinned pool: %s (%s)", got.State, got.Reason)
	}

	// Every failure the sweep writes is seen, with its reason, before the
	// record goes.
	reasons := map[string]string{}
	sub := h.nodes.Subscribe()
	defer h.nodes.Unsubscribe(sub)
	h.until(30*time.Second, "every unaccountable node record gone and the instance it named deleted", func() bool {
		for _, ch := range sub.Drain() {
			if ch.New != nil && ch.New.Value.State == kv.NodeFailed {
				reasons[ch.Key] = ch.New.Value.Reason
			}
		}
		for _, n := range nodes {
			if _, there := h.nodes.Get(n.key); there {
				return false
			}
			if raw, err := bucket.Get(t.Context(), n.key); err == nil && raw.Value() != nil {
				return false // still there, maybe not decoding
			}
		}
		_, there := h.instances["c"].Get(named)
		return !there
	})
	for _, n := range nodes {
		if n.reason == "" {
			continue
		}
		if got, seen := reasons[n.key]; seen && !strings.Contains(got, n.reason) {
			t.Errorf("node %s failed with %q; want it to say %q", n.key, got, n.reason)
		}
	}
	h.until(20*time.Second, "the bad requests failed with the reason", func() bool {
		a, okA := h.request("req-exploding")
		b, okB := h.request("req-garbage")
		return okA && okB && a.State == kv.RequestFailed && b.State == kv.RequestFailed &&
			strings.Contains(a.Reason, `unknown state "exploding"`) && strings.Contains(b.Reason, "did not parse") && b.Owner == "alice"
	})

	// And nothing is rewritten again and again: the requests keep their
	// revisions over more sweeps.
	revs := map[string]uint64{}
	h.requests.Range(func(e *kv.Entry[kv.Request]) bool { revs[e.Key] = e.Revision; return true })
	h.sweeps(clock.Real(), 4)
	h.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if revs[e.Key] != 0 && revs[e.Key] != e.Revision {
			t.Errorf("request %s rewritten (revision %d, then %d)", e.Key, revs[e.Key], e.Revision)
		}
		return true
	})
}
