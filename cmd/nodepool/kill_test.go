package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// killCloud is the cloud a kill test runs against: the configuration of
// provider cloud1, what the launchers' environment adds, and the cloud's
// instances at the end (external id -> node id).
type killCloud struct {
	config    string
	env       map[string]string
	instances func(rec *records) map[string]string
	// failure is the reason a request may fail with.
	failure string
	// quiet, if set, checks the cloud once only the min-ready nodes are
	// left, while the launchers still run (after they stop, a min-ready
	// node replaced as it aged may be left half launched, as it is then
	// for the next launcher to finish).
	quiet func(t *testing.T)
}

// killUnderLoad is the kill test of a cloud driver: three launcher
// processes share one nats-server while requests flow and a random
// launcher is killed (SIGKILL) and restarted every few seconds. At the end,
// from the records and the cloud: every request is fulfilled or failed
// with a true reason, no node was given to two requests, no instance is
// left without a record and no record points to a missing instance. The
// fake cloud's kill test is TestChaos, on a cluster, with more faults.
func killUnderLoad(t *testing.T, cloud killCloud, n int) {
	srv := natstest.Start(t)
	url := srv.ClientURL()
	cfg := writeConfig(t, cloud.config)
	env := func(id string) map[string]string {
		e := map[string]string{
			"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher",
			"NODEPOOL_HTTP_ADDR": "", "NODEPOOL_LEASE_TTL": "2s", "NODEPOOL_SYNC_INTERVAL": "500ms",
		}
		for k, v := range cloud.env {
			e[k] = v
		}
		return e
	}
	ids := []string{"launcher-0", "launcher-1", "launcher-2"}
	var procsMu sync.Mutex
	procs := map[string]*proc{}
	for _, id := range ids {
		p := startRun(t, env(id), "-c", cfg)
		p.waitLog("launcher running", 60*time.Second)
		procs[id] = p
	}
	fakeCloud := ""
	if cloud.env == nil {
		fakeCloud = "cloud1"
	}
	rec := watchRecords(t, url, fakeCloud)
	_, c := connectClient(t, url)

	// Chaos: kill a random launcher every one and a half to three seconds and start it
	// again with the same id.
	chaosCtx, stopChaos := context.WithCancel(t.Context())
	chaosDone := make(chan int)
	go func() {
		kills := 0
		rng := rand.New(rand.NewPCG(7, 11))
		defer func() { chaosDone <- kills }()
		for {
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(time.Duration(1500+rng.IntN(1500)) * time.Millisecond):
			}
			id := ids[rng.IntN(len(ids))]
			procsMu.Lock()
			_ = procs[id].stop(syscall.SIGKILL, 30*time.Second)
			p := startRun(t, env(id), "-c", cfg)
			procs[id] = p
			procsMu.Unlock()
			kills++
			p.waitLog("launcher running", 60*time.Second)
		}
	}()

	// Requestors: n requests of 1 to 3 labels with mixed priorities; each
	// is taken as soon as it is fulfilled, held a moment, and given back.
	rng := rand.New(rand.NewPCG(3, 5))
	type outcome struct {
		id    string
		state kv.RequestState
		why   string
	}
	outcomes := make(chan outcome, n)
	owner := map[string]string{}
	var ownerMu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		labels := make([]string, 1+rng.IntN(3))
		for j := range labels {
			labels[j] = []string{"small", "small", "medium", "big"}[rng.IntN(4)]
		}
		prio := []int{50, 100, 100, 200}[rng.IntN(4)]
		hold := time.Duration(rng.IntN(400)) * time.Millisecond
		id := fmt.Sprintf("req-%03d", i)
		if _, err := c.Submit(t.Context(), events.RequestMessage{ID: id, Labels: labels, Priority: &prio, Requestor: "kill-test"}); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
			defer cancel()
			r, err := c.Wait(ctx, id)
			if err != nil {
				outcomes <- outcome{id, r.Value.State, err.Error()}
				_ = c.DeleteRequest(ctx, id)
				return
			}
			for _, nid := range r.Value.Nodes {
				ownerMu.Lock()
				if prev, dup := owner[nid]; dup {
					t.Errorf("node %s given to %s and to %s", nid, prev, id)
				}
				owner[nid] = id
				ownerMu.Unlock()
				if _, err := c.Take(ctx, nid, id, "kill-test", nil); err != nil {
					t.Errorf("taking node %s of fulfilled request %s: %v", nid, id, err)
				}
			}
			if err := c.DeleteRequest(ctx, id); err != nil {
				t.Errorf("deleting request %s: %v", id, err)
			}
			time.Sleep(hold) // the job runs on its nodes
			for _, nid := range r.Value.Nodes {
				if err := c.Return(ctx, nid); err != nil {
					t.Errorf("returning node %s: %v", nid, err)
				}
			}
			outcomes <- outcome{id, kv.RequestFulfilled, ""}
		})
	}
	wg.Wait()
	stopChaos()
	kills := <-chaosDone
	close(outcomes)

	fulfilled, failed := 0, 0
	for o := range outcomes {
		switch {
		case o.state == kv.RequestFulfilled:
			fulfilled++
		case o.state == kv.RequestFailed && cloud.failure != "" && strings.Contains(o.why, cloud.failure):
			failed++
		default:
			t.Errorf("request %s ended %s: %s", o.id, o.state, o.why)
		}
	}
	t.Logf("%d requests: %d fulfilled, %d failed after three launch attempts; %d launchers killed", n, fulfilled, failed, kills)
	if kills == 0 {
		t.Error("no launcher was killed")
	}

	// Quiet again: only the min-ready nodes are left, each with its
	// instance, and every instance has its record.
	var insts map[string]string
	rec.until(90*time.Second, "only the min-ready nodes left", func() bool {
		insts = cloud.instances(rec)
		if rec.nodes.Len() != 2 || len(insts) != 2 {
			return false
		}
		ok := true
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			_, there := insts[e.Value.ExternalID]
			ok = ok && e.Value.State == kv.NodeReady && there
			return ok
		})
		return ok
	})
	for ext, nid := range insts {
		// A node still building owns the instance its create made, even
		// before it records the id (min-ready replaces aged nodes).
		if n, ok := rec.nodes.Get(nid); !ok || (n.Value.ExternalID != ext && n.Value.State != kv.NodeBuilding) {
			t.Errorf("instance %s (node %q) has no record naming it", ext, nid)
		}
	}
	// Requestors deleted their requests; only min-ready ones may remain.
	rec.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if e.Value.Requestor != "NodePool:min-ready" {
			t.Errorf("request %s left %s", e.Key, e.Value.State)
		}
		return true
	})
	if cloud.quiet != nil {
		cloud.quiet(t)
	}
	procsMu.Lock()
	for _, p := range procs {
		_ = p.stop(syscall.SIGTERM, 30*time.Second)
	}
	procsMu.Unlock()
}
