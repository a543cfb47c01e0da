package web_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/web"
)

// overviewConfig has a pool with room and a cloud quota, and a pool of
// one server whose launches take long: a second request waits for its
// quota.
const overviewConfig = `
labels:
  - name: small
  - name: slow
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.2
    quota:
      instances: 30
    pools:
      - name: main
        max-servers: 10
        labels: [small]
  - name: cloud2
    driver: fake
    boot-delay: 60
    pools:
      - name: tight
        max-servers: 1
        labels: [slow]
`

func (s *site) overview() web.Overview {
	s.t.Helper()
	code, ctype, body := s.get("/dashboard/overview", "")
	if code != 200 || !strings.HasPrefix(ctype, "application/json") {
		s.t.Fatalf("/dashboard/overview: %d %s\n%s", code, ctype, body)
	}
	var o web.Overview
	if err := json.Unmarshal([]byte(body), &o); err != nil {
		s.t.Fatalf("/dashboard/overview: %v\n%s", err, body)
	}
	return o
}

func (o *Overview) pool(ref string) *web.PoolView {
	for i := range o.Pools {
		if o.Pools[i].Provider+"/"+o.Pools[i].Pool == ref {
			return &o.Pools[i]
		}
	}
	return nil
}

func (o *Overview) provider(name string) *web.ProviderView {
	for i := range o.Providers {
		if o.Providers[i].Name == name {
			return &o.Providers[i]
		}
	}
	return nil
}

// Overview wraps web.Overview with finders.
type Overview struct{ web.Overview }

// /dashboard/overview tells, per pool, what is in use against its
// max-servers, what waits in it and whether it waits for quota; per
// provider, the cloud's quota as the pool's leader read it; and the last
// hour: launches, requests fulfilled and how long they waited.
func TestOverviewCapacityQuotaAndHistory(t *testing.T) {
	t.Parallel()
	s := startSiteWith(t, true, overviewConfig)
	if _, err := s.client.Submit(t.Context(), events.RequestMessage{ID: "fast-1", Labels: []string{"small"}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"slow-1", "slow-2"} {
		if _, err := s.client.Submit(t.Context(), events.RequestMessage{ID: id, Labels: []string{"slow"}}); err != nil {
			t.Fatal(err)
		}
	}
	var o Overview
	s.waitFor(30*time.Second, "the overview to show the fulfilled request, the cloud's quota and the pool waiting for quota", func() bool {
		o = Overview{s.overview()}
		tight, p1 := o.pool("cloud2/tight"), o.provider("cloud1")
		return o.History.Hour.RequestsFulfilled >= 1 && tight != nil && tight.WaitingForQuota && tight.Waiting >= 1 &&
			p1 != nil && p1.CloudQuota != nil
	})
	main := o.pool("cloud1/main")
	if main == nil || !main.Configured || main.MaxServers == nil || *main.MaxServers != 10 {
		t.Fatalf("cloud1/main: %+v; want it configured, max-servers 10", main)
	}
	if main.Used.Instances < 1 || main.Used.Instances != sum(main.States) {
		t.Errorf("cloud1/main uses %d servers, its nodes by state %v; want one per node", main.Used.Instances, main.States)
	}
	if main.WaitingForQuota || main.Waiting != 0 || len(main.Launchers) != 1 || main.Launchers[0] != "web-test" {
		t.Errorf("cloud1/main: %+v; want nothing waiting, served by web-test", main)
	}
	tight := o.pool("cloud2/tight")
	if tight.Used.Instances != 1 || *tight.MaxServers != 1 || !strings.Contains(tight.WaitReason, "for its quota: 1 of 1 servers in use") {
		t.Errorf("cloud2/tight: %+v; want 1 of 1 servers in use, a request waiting for its quota", tight)
	}
	if q := o.provider("cloud1").CloudQuota; q.Limits["instances"] != 30 || q.Read.IsZero() {
		t.Errorf("cloud1's cloud quota: %+v; want 30 instances", q)
	}
	if p := o.provider("cloud1"); p.Used.Instances != main.Used.Instances || p.Failing != "" {
		t.Errorf("cloud1: %+v", p)
	}
	h := o.History
	if h.Hour.Launches < 1 || h.LatencyMax <= 0 || h.LatencyP50 <= 0 || len(h.Minutes) != 60 {
		t.Errorf("history: hour %+v, latency p50 %v max %v, %d minutes", h.Hour, h.LatencyP50, h.LatencyMax, len(h.Minutes))
	}
	if last := h.Minutes[59]; time.Since(last.Start) > 2*time.Minute {
		t.Errorf("the last minute starts at %s, not now", last.Start)
	}
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// The snapshot the page starts from holds every record and the overview,
// as JSON and as the script the page loads.
func TestDashboardSnapshot(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	ready := s.readyNode("small")
	code, ctype, body := s.get("/dashboard/snapshot", "")
	if code != 200 || !strings.HasPrefix(ctype, "application/json") {
		t.Fatalf("/dashboard/snapshot: %d %s", code, ctype)
	}
	var snap struct {
		Reset    bool                       `json:"reset"`
		Nodes    map[string]json.RawMessage `json:"nodes"`
		Overview *web.Overview              `json:"overview"`
	}
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatal(err)
	}
	if !snap.Reset || snap.Nodes[ready.ID] == nil || snap.Overview == nil || len(snap.Overview.Pools) != 2 {
		t.Errorf("snapshot: reset %v, node %s %s, overview %+v", snap.Reset, ready.ID, snap.Nodes[ready.ID], snap.Overview)
	}
	code, ctype, js := s.get("/dashboard/snapshot.js", "")
	if code != 200 || !strings.HasPrefix(ctype, "text/javascript") || !strings.HasPrefix(js, "nodepoolSnapshot({") || !strings.Contains(js, ready.ID) {
		t.Errorf("/dashboard/snapshot.js: %d %s %.80s", code, ctype, js)
	}
}
