package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// statusAddr is the address of a launcher's status API, from its log.
func statusAddr(t *testing.T, p *proc) string {
	t.Helper()
	p.waitLog("status API listening", 30*time.Second)
	m := regexp.MustCompile(`msg="status API listening".* addr=(\S+)`).FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("no status API address in the log:\n%s", p.output())
	}
	return m[1]
}

// launcherStatus is what /api/status says.
type launcherStatus struct {
	NatsConnected bool                 `json:"nats_connected"`
	Nodes         map[kv.NodeState]int `json:"nodes"`
	Requests      int                  `json:"requests"`
}

func getStatus(addr string) (launcherStatus, error) {
	var st launcherStatus
	resp, err := http.Get("http://" + addr + "/api/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// The nats-server under two running launchers is stopped and started
// again on its store and port, with requests in flight and more submitted
// while it is down. The launchers reconnect and resume: their watches
// (their caches match the buckets again, through /api/status), their
// worker groups (every request is served, every returned node deleted),
// their heartbeats and leases (min-ready is kept).
func TestServerRestartUnderLaunchers(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	srv := natstest.StartAt(t, store, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	url := srv.ClientURL()
	cfg := writeConfig(t, fmt.Sprintf(cliConfig, "0.2"))
	env := func(id string) map[string]string {
		return map[string]string{
			"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher",
			"NODEPOOL_HTTP_ADDR": "127.0.0.1:0", "NODEPOOL_LEASE_TTL": "2s", "NODEPOOL_SYNC_INTERVAL": "500ms",
		}
	}
	ids := []string{"launcher-a", "launcher-b"}
	fl := startFleet(t, cfg, env, ids...)
	addrs := map[string]string{}
	for _, id := range ids {
		addrs[id] = statusAddr(t, fl.get(id))
	}
	rec := watchRecords(t, url, "cloud1")
	audit, stopAudit := startAuditor(t, rec, limits{
		maxServers: map[string]int{"main": 20},
		cleanup:    20 * time.Second, stuck: 60 * time.Second, vanished: 5 * time.Second,
	})
	req := newRequestor(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	outcomes := make(chan outcome, 40)
	submit := func(from, n int, hold time.Duration) {
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("r%02d", i)
			labels := []string{"small", "big"}[i%2 : i%2+1]
			wg.Go(func() { outcomes <- req.run(ctx, id, labels, 100, hold) })
		}
	}
	// Requests in flight when the server stops: some held across the
	// outage, whose return comes after it.
	submit(0, 20, 0)
	rec.until(60*time.Second, "a first share of the requests fulfilled", func() bool { return audit.fulfilledCount() >= 5 })
	submit(20, 4, 4*time.Second)

	srv.Shutdown()
	srv.WaitForShutdown()
	// The launchers notice (their status says they are not connected).
	for _, id := range ids {
		waitfor.UntilErr(t, 30*time.Second, id+" to report no connection to the stopped server", func(context.Context) (bool, error) {
			st, err := getStatus(addrs[id])
			return err == nil && !st.NatsConnected, err
		}, waitfor.Every(50*time.Millisecond))
	}
	// More requests while the server is down: the client tries again
	// until it is back.
	submit(24, 10, 0)
	natstest.StartAt(t, store, port) // stopped by the test's cleanup
	t.Log("nats-server restarted on its store")

	wg.Wait()
	close(outcomes)
	for o := range outcomes {
		if o.err != nil || o.state != kv.RequestFulfilled {
			t.Errorf("request %s ended %s: %v", o.id, o.state, o.err)
		}
	}
	rec.until(60*time.Second, "only the min-ready node left, with its instance", func() bool { return quiet(rec, 1) })
	// Every launcher's caches resumed: each sees what the buckets hold.
	for _, id := range ids {
		var st launcherStatus
		var err error
		waitfor.Until(t, 30*time.Second, id+"'s view to come back to the buckets' (1 ready node, the requests they hold)", func() bool {
			st, err = getStatus(addrs[id])
			return err == nil && st.NatsConnected && st.Nodes[kv.NodeReady] == 1 && len(st.Nodes) == 1 && st.Requests == rec.requests.Len()
		}, waitfor.Every(50*time.Millisecond), waitfor.Detail(func() string {
			return fmt.Sprintf("the buckets hold %d requests; %s's view: %+v %v", rec.requests.Len(), id, st, err)
		}))
	}
	stopAudit()
	violations, summary := audit.report()
	t.Log(summary)
	for _, v := range violations {
		t.Error(v)
	}
	fl.stop()
}
