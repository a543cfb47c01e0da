package web_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/web"
)

// clock is a settable clock for the history.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func nodeChange(old, cur *kv.Node) kv.Change[kv.Node] {
	ch := kv.Change[kv.Node]{}
	if old != nil {
		ch.Old = &kv.Entry[kv.Node]{Key: old.ID, Value: *old}
	}
	if cur != nil {
		ch.New = &kv.Entry[kv.Node]{Key: cur.ID, Value: *cur}
	}
	return ch
}

func requestChange(old, cur *kv.Request) kv.Change[kv.Request] {
	ch := kv.Change[kv.Request]{}
	if old != nil {
		ch.Old = &kv.Entry[kv.Request]{Key: old.ID, Value: *old}
	}
	if cur != nil {
		ch.New = &kv.Entry[kv.Request]{Key: cur.ID, Value: *cur}
	}
	return ch
}

// The history counts each event once, in the minute it happened: a
// launch that ended ready or failed, each failed attempt, a request
// fulfilled (with its latency) or failed; per provider too. What is older
// than an hour is gone, and records seen again (a node that stays ready,
// a restart's first look) do not count twice.
func TestHistoryCountsEachEventInItsMinute(t *testing.T) {
	start := time.Date(2030, 1, 2, 10, 0, 30, 0, time.UTC)
	c := &clock{t: start}
	h := web.NewHistory(c.now)

	// A launch: building (attempt 1), retried (attempt 2), ready.
	b1 := kv.Node{ID: "n1", State: kv.NodeBuilding, Provider: "east", Attempt: 1, StateTime: start}
	h.ObserveNode(nodeChange(nil, &b1))
	b2 := b1
	b2.Attempt, b2.Reason = 2, "instance went to ERROR"
	c.t = start.Add(10 * time.Second)
	h.ObserveNode(nodeChange(&b1, &b2))
	ready := b2
	ready.State, ready.StateTime = kv.NodeReady, start.Add(20*time.Second)
	h.ObserveNode(nodeChange(&b2, &ready))
	// Seen again (a change of another field) and in use: no launch.
	again := ready
	again.Comment = "x"
	h.ObserveNode(nodeChange(&ready, &again))
	inUse := again
	inUse.State = kv.NodeInUse
	h.ObserveNode(nodeChange(&again, &inUse))

	// A launch that fails for good in the next minute.
	c.t = start.Add(60 * time.Second)
	f1 := kv.Node{ID: "n2", State: kv.NodeBuilding, Provider: "west", Attempt: 1, StateTime: start}
	f2 := f1
	f2.State, f2.StateTime, f2.Reason = kv.NodeFailed, c.t, "launch failed after 1 attempt(s): quota"
	h.ObserveNode(nodeChange(&f1, &f2))
	// A node found failed at the start is not a launch failure: it may
	// have failed after its launch.
	h.ObserveNode(nodeChange(nil, &kv.Node{ID: "n3", State: kv.NodeFailed, Provider: "west", StateTime: c.t}))

	// Requests: one fulfilled after 4 s, one failed; a record seen again
	// in the same state does not count again.
	req := kv.Request{ID: "r1", State: kv.RequestPending, Provider: "east", Created: start.Add(60 * time.Second)}
	done := req
	done.State, done.StateTime = kv.RequestFulfilled, start.Add(64*time.Second)
	h.ObserveRequest(requestChange(&req, &done))
	h.ObserveRequest(requestChange(&done, &done))
	bad := kv.Request{ID: "r2", State: kv.RequestFailed, Provider: "west", Reason: "launch failed", StateTime: start.Add(65 * time.Second)}
	h.ObserveRequest(requestChange(nil, &bad))

	r := h.Report()
	if len(r.Minutes) != 60 {
		t.Fatalf("%d minutes; want 60", len(r.Minutes))
	}
	last, prev := r.Minutes[59], r.Minutes[58]
	if !last.Start.Equal(time.Date(2030, 1, 2, 10, 1, 0, 0, time.UTC)) {
		t.Errorf("the last minute starts at %s", last.Start)
	}
	if prev.Launches != 1 || prev.AttemptsFailed != 1 || prev.LaunchFailures != 0 {
		t.Errorf("minute 10:00: %+v; want 1 launch, 1 failed attempt", prev)
	}
	if last.LaunchFailures != 1 || last.AttemptsFailed != 1 || last.RequestsFulfilled != 1 || last.RequestsFailed != 1 {
		t.Errorf("minute 10:01: %+v; want 1 launch failure (its attempt), 1 request fulfilled, 1 failed", last)
	}
	if last.LatencyP50 != 4 || last.LatencyMax != 4 || r.LatencyP95 != 4 {
		t.Errorf("latency: minute p50 %v max %v, hour p95 %v; want 4 s", last.LatencyP50, last.LatencyMax, r.LatencyP95)
	}
	if r.Hour.Launches != 1 || r.Hour.LaunchFailures != 1 || r.Hour.AttemptsFailed != 2 || r.Hour.RequestsFailed != 1 {
		t.Errorf("hour: %+v", r.Hour)
	}
	byName := map[string]web.ProviderReport{}
	for _, p := range r.Providers {
		byName[p.Name] = p
	}
	if e := byName["east"]; e.Launches != 1 || e.AttemptsFailed != 1 || e.LastFailure != "instance went to ERROR" {
		t.Errorf("east: %+v", e)
	}
	if w := byName["west"]; w.LaunchFailures != 1 || w.RequestsFailed != 1 || w.LastFailure != "launch failed" {
		t.Errorf("west: %+v; want its last failure the request's", w)
	}

	// An hour on, all of it is gone.
	c.t = start.Add(61 * time.Minute)
	r = h.Report()
	if r.Hour != (web.HistoryReport{}).Hour || len(r.Providers) != 0 {
		t.Errorf("an hour later: %+v, %+v; want nothing", r.Hour, r.Providers)
	}
	// An event older than the window is not counted, one from the
	// future (a wrong clock) is not either.
	h.ObserveNode(nodeChange(nil, &kv.Node{ID: "old", State: kv.NodeReady, StateTime: c.t.Add(-2 * time.Hour)}))
	h.ObserveNode(nodeChange(nil, &kv.Node{ID: "future", State: kv.NodeReady, StateTime: c.t.Add(time.Hour)}))
	if r := h.Report(); r.Hour.Launches != 0 {
		t.Errorf("%d launches counted from outside the hour", r.Hour.Launches)
	}
}

// Latencies are sampled (a bounded number per minute), and the hour's
// percentiles weigh each minute by its requests: a minute of many fast
// requests is not outweighed by one slow one.
func TestHistoryLatencyIsBoundedAndWeighted(t *testing.T) {
	start := time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)
	c := &clock{t: start.Add(90 * time.Second)}
	h := web.NewHistory(c.now)
	fulfil := func(id string, at time.Time, took time.Duration) {
		h.ObserveRequest(requestChange(nil, &kv.Request{ID: id, State: kv.RequestFulfilled, Provider: "p", Created: at.Add(-took), StateTime: at}))
	}
	for i := range 1000 {
		fulfil(fmt.Sprint("fast", i), start.Add(10*time.Second), time.Second)
	}
	for i := range 10 {
		fulfil(fmt.Sprint("slow", i), start.Add(70*time.Second), time.Minute)
	}
	r := h.Report()
	if r.Hour.RequestsFulfilled != 1010 {
		t.Fatalf("%d fulfilled; want 1010", r.Hour.RequestsFulfilled)
	}
	if r.LatencyP50 != 1 || r.LatencyP95 != 1 || r.LatencyMax != 60 {
		t.Errorf("hour: p50 %v, p95 %v, max %v; want 1, 1, 60", r.LatencyP50, r.LatencyP95, r.LatencyMax)
	}
	if m := r.Minutes[59]; m.LatencyP50 != 60 || m.RequestsFulfilled != 10 {
		t.Errorf("last minute: %+v", m)
	}
}

// A minute counts a bounded number of providers by name: names come from
// records, which anyone may write.
func TestHistoryBoundsProviders(t *testing.T) {
	now := time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)
	h := web.NewHistory(func() time.Time { return now })
	for i := range 500 {
		h.ObserveNode(nodeChange(nil, &kv.Node{ID: fmt.Sprint(i), State: kv.NodeReady, Provider: fmt.Sprint("p", i), StateTime: now}))
	}
	r := h.Report()
	if len(r.Providers) > 65 || r.Hour.Launches != 500 {
		t.Errorf("%d providers, %d launches; want at most 65 and 500", len(r.Providers), r.Hour.Launches)
	}
}
