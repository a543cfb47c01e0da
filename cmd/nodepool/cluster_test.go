package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

const clusterConfig = `
labels:
  - name: small
    min-ready: 2
  - name: big
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.3
    delete-delay: 0.05
    api-delay: 0.005
    launch-retries: 3
    quota: {instances: 50}
    pools:
      - name: main
        max-servers: 35
        labels: [small, big]
      - name: spare
        priority: 200
        max-servers: 15
        labels: [small]
`

// clusterEnv is the environment of a launcher on a cluster: the URLs of
// every member, starting with the member its number picks, and R3.
func clusterEnv(c *natstest.Cluster, ids []string) func(id string) map[string]string {
	return clusterEnvTTL(c, ids, clusterLeaseTTL)
}

// clusterEnvTTL is clusterEnv with leases of ttl.
func clusterEnvTTL(c *natstest.Cluster, ids []string, ttl time.Duration) func(id string) map[string]string {
	return func(id string) map[string]string {
		first := 0
		for i, x := range ids {
			if x == id {
				first = i % c.Size()
			}
		}
		return map[string]string{
			"NODEPOOL_NATS_URL": c.URLs(first), "NODEPOOL_REPLICAS": "3",
			"NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher", "NODEPOOL_HTTP_ADDR": "",
			"NODEPOOL_LEASE_TTL": ttl.String(), "NODEPOOL_SYNC_INTERVAL": "500ms",
		}
	}
}

// clusterLeaseTTL is the launchers' lease and heartbeat TTL on a cluster:
// an R3 write waits for a second server, and on a machine loaded by the
// race detector a renewal can take longer than a third of 2 s.
const clusterLeaseTTL = 4 * time.Second

// Three launchers on a three-server R3 cluster, each connected to a
// different server, with hundreds of requests in flight; the server
// leading the nodes bucket is killed, and later started again. Every
// request is fulfilled, no node goes to two requests, no instance is
// created twice for one attempt, and nothing is left over.
func TestClusterNodesLeaderKilled(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	cfg := writeConfig(t, clusterConfig)
	ids := []string{"launcher-0", "launcher-1", "launcher-2"}
	// No launcher is killed here: leases of twice the cluster's usual
	// TTL lose nothing, and keep the launchers from fencing themselves
	// over and over while the cluster elects leaders on a loaded machine
	// (with 4 s, heartbeat writes that waited out the election at a load
	// average of 15 fenced all three for most of a minute, and returned
	// nodes waited more than the cleanup window).
	fl := startFleet(t, cfg, clusterEnvTTL(c, ids, 2*clusterLeaseTTL), ids...)
	rec := watchRecords(t, c.URLs(0), "cloud1")
	audit, stopAudit := startAuditor(t, rec, limits{
		quota: 50, maxServers: map[string]int{"main": 35, "spare": 15},
		cleanup: 20 * time.Second, stuck: 60 * time.Second, vanished: 5 * time.Second,
	})
	req := newRequestor(t, c.URLs(1))

	const n = 300
	rng := rand.New(rand.NewPCG(1, 2))
	outcomes := make(chan outcome, n)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		labels := []string{"small"}
		if rng.IntN(3) == 0 {
			labels = []string{"small", "big"}
		}
		hold := time.Duration(rng.IntN(300)) * time.Millisecond
		id := fmt.Sprintf("req-%03d", i)
		wg.Go(func() { outcomes <- req.run(ctx, id, labels, 100, hold) })
	}

	// While the requests are in flight, kill the member that leads the
	// nodes bucket; let the other two carry on without it for a while,
	// then start it again.
	const stream = "KV_" + kv.BucketNodes
	rec.until(3*time.Minute, "a first share of the requests fulfilled", func() bool { return audit.fulfilledCount() >= 40 })
	leader := c.WaitStreamLeader(stream, 30*time.Second)
	t.Logf("killing %s, leader of %s, with %d of %d requests fulfilled", c.Name(leader), stream, audit.fulfilledCount(), n)
	c.Stop(leader)
	before := audit.fulfilledCount()
	rec.until(3*time.Minute, "requests fulfilled without the killed server", func() bool { return audit.fulfilledCount() >= before+40 })
	next := c.WaitStreamLeader(stream, 30*time.Second)
	t.Logf("%s leads %s now; %d fulfilled; restarting %s", c.Name(next), stream, audit.fulfilledCount(), c.Name(leader))
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}

	wg.Wait()
	close(outcomes)
	for o := range outcomes {
		if o.err != nil || o.state != kv.RequestFulfilled {
			t.Errorf("request %s ended %s: %v", o.id, o.state, o.err)
		}
	}
	c.WaitHealthy(60 * time.Second)
	rec.until(90*time.Second, "only the min-ready nodes left, each with its instance", func() bool {
		return quiet(rec, 2)
	})
	stopAudit()
	violations, summary := audit.report()
	t.Log(summary)
	for _, v := range violations {
		t.Error(v)
	}
	if audit.instancesCreated() < n {
		t.Errorf("only %d instances created for %d requests", audit.instancesCreated(), n)
	}
	fl.stop()
}

// quiet reports whether only want ready nodes are left, each with its
// instance, every instance has its node, and only min-ready requests
// remain.
func quiet(rec *records, want int) bool {
	if rec.nodes.Len() != want || rec.instances.Len() != want {
		return false
	}
	ok := true
	rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		_, there := rec.instances.Get(e.Value.ExternalID)
		ok = ok && e.Value.State == kv.NodeReady && there
		return ok
	})
	rec.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		ok = ok && strings.HasPrefix(e.Value.Requestor, "NodePool:")
		return ok
	})
	return ok
}
