package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// killLabels are the labels of the kill and chaos tests: a min-ready one,
// and ready nodes that age out soon, so that the cleanup runs under the
// faults too.
const killLabels = `
labels:
  - name: small
    min-ready: 2
    max-ready-age: 5
  - name: medium
    max-ready-age: 2
  - name: big
    max-ready-age: 2
`

const chaosConfig = killLabels + `
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.3
    delete-delay: 0.1
    api-delay: 0.005
    failure-rate: 0.05
    launch-retries: 3
    quota: {instances: 45}
    pools:
      - name: main
        max-servers: 30
        labels: [small, medium, big]
      - name: spare
        priority: 200
        max-servers: 10
        labels: [small, medium]
`

// chaosFailureRate and chaosRetries are the fake cloud's failure rate and
// the launch retries of chaosConfig.
const (
	chaosFailureRate = 0.05
	chaosRetries     = 3
)

// The chaos test: four `nodepool run` launchers on a three-server R3
// cluster serve a steady stream of requests while, every few seconds, one
// to three launchers are killed at once (SIGKILL) and started again, a NATS
// server of the cluster is killed (often the leader of a stream the
// launchers live on) and started again on its store, and an operator
// deletes nodes and holds others, with the CLI and the Go client. An
// auditor checks the promises continuously, on every change of the
// records and every quarter second: never more nodes than max-servers,
// nor instances than the cloud's quota; each instance created once (its
// id is its node's and attempt's); no node given to two requests; no
// leaked instance, expired hold or node being deleted left longer than
// the cleanup window; no node ready or in use without its instance. At
// the end every request was fulfilled, or failed for a reason the fake's
// failure rate or the operator explains, and only the min-ready nodes are
// left.
//
// It runs for 75 s of faults; NODEPOOL_CHAOS_DURATION (a Go duration)
// makes it a soak.
func TestChaos(t *testing.T) {
	t.Parallel()
	duration := 75 * time.Second
	if d := os.Getenv("NODEPOOL_CHAOS_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("NODEPOOL_CHAOS_DURATION: %v", err)
		}
	}
	c := natstest.StartCluster(t, 3)
	cfg := writeConfig(t, chaosConfig)
	ids := []string{"launcher-0", "launcher-1", "launcher-2", "launcher-3"}
	fl := startFleet(t, cfg, clusterEnv(c, ids), ids...)
	rec := watchRecords(t, c.URLs(0), "cloud1")
	audit, stopAudit := startAuditor(t, rec, limits{
		quota: 45, maxServers: map[string]int{"main": 30, "spare": 10},
		cleanup: 30 * time.Second, stuck: 90 * time.Second, vanished: 5 * time.Second,
	})
	cli := map[string]string{"NODEPOOL_NATS_URL": c.URLs(2)}

	// The operator's deletes and holds: a request whose node the operator
	// took may fail, or its requestor may not get the node.
	var touchedMu sync.Mutex
	touched := map[string]bool{}
	touchedAny := func(nodes []string) bool {
		touchedMu.Lock()
		defer touchedMu.Unlock()
		return slices.ContainsFunc(nodes, func(id string) bool { return touched[id] })
	}

	// Requestors: a steady stream until the faults end. They are all
	// connected before the faults' time starts: on a loaded machine,
	// connecting 30 of them took longer than the faults' whole time once,
	// and no fault happened.
	const requestors = 30
	reqs := make([]*requestor, requestors)
	for r := range reqs {
		reqs[r] = newRequestor(t, c.URLs(r%3))
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	load, stopLoad := context.WithTimeout(ctx, duration)
	defer stopLoad()
	var (
		wg                      sync.WaitGroup
		outMu                   sync.Mutex
		outcomes                []outcome
		submitted, launchFailed atomic.Int64
	)
	for r, req := range reqs {
		rng := rand.New(rand.NewPCG(uint64(r), 99))
		wg.Go(func() {
			for i := 0; load.Err() == nil; i++ {
				labels := make([]string, 1+rng.IntN(3))
				for j := range labels {
					labels[j] = []string{"small", "small", "medium", "big"}[rng.IntN(4)]
				}
				prio := []int{50, 100, 100, 200}[rng.IntN(4)]
				hold := time.Duration(rng.IntN(400)) * time.Millisecond
				submitted.Add(1)
				rctx, rcancel := context.WithTimeout(ctx, 4*time.Minute)
				o := req.run(rctx, fmt.Sprintf("req-%02d-%04d", r, i), labels, prio, hold)
				rcancel()
				outMu.Lock()
				outcomes = append(outcomes, o)
				outMu.Unlock()
			}
		})
	}

	// The faults.
	var (
		launcherKills, serverKills, deletes, holds atomic.Int64
		faults                                     sync.WaitGroup
		serverDown                                 atomic.Bool
		downMu                                     sync.Mutex
		down                                       = map[string]bool{} // launchers killed and not yet running again
	)
	streams := []string{"KV_" + kv.BucketNodes, "KV_" + kv.BucketRequests, "KV_" + kv.BucketLocks,
		"KV_" + kv.BucketComponents, events.RequestsStream, "KV_fakecloud-cloud1"}
	rng := rand.New(rand.NewPCG(7, 11))
	errs := make(chan error, 100)
	for load.Err() == nil {
		select {
		case <-load.Done():
		case <-time.After(time.Duration(1500+rng.IntN(1500)) * time.Millisecond):
		}
		if load.Err() != nil {
			break
		}
		switch x := rng.IntN(100); {
		case x < 35: // one to three of the four launchers at once
			downMu.Lock()
			var victims []string
			for _, id := range ids {
				if !down[id] {
					victims = append(victims, id)
				}
			}
			rng.Shuffle(len(victims), func(i, j int) { victims[i], victims[j] = victims[j], victims[i] })
			victims = victims[:min(len(victims), 1+rng.IntN(3))]
			for _, id := range victims {
				down[id] = true
			}
			downMu.Unlock()
			if len(victims) == 0 {
				continue
			}
			fl.kill(victims...)
			launcherKills.Add(int64(len(victims)))
			t.Logf("%s killed %v", time.Now().Format("15:04:05.000"), victims)
			pause := time.Duration(rng.IntN(1500)) * time.Millisecond
			for _, id := range victims {
				faults.Go(func() {
					time.Sleep(pause) // down for a while, as a crashed pod is
					if err := fl.restart(id); err != nil {
						errs <- fmt.Errorf("restarting %s: %w", id, err)
					}
					downMu.Lock()
					delete(down, id)
					downMu.Unlock()
				})
			}
		case x < 60: // a server of the cluster, often a stream's leader
			if ok, _ := c.Healthy(); !ok || serverDown.Load() {
				continue
			}
			victim := rng.IntN(c.Size())
			what := "a follower"
			if rng.IntN(3) > 0 {
				s := streams[rng.IntN(len(streams))]
				if l := c.StreamLeader(s); l >= 0 {
					victim, what = l, "the leader of "+s
				}
			}
			serverDown.Store(true)
			c.Stop(victim)
			serverKills.Add(1)
			t.Logf("%s killed %s, %s", time.Now().Format("15:04:05.000"), c.Name(victim), what)
			outage := time.Duration(2000+rng.IntN(3000)) * time.Millisecond
			faults.Go(func() {
				time.Sleep(outage) // the outage's length
				if err := c.Restart(victim); err != nil {
					errs <- err
				}
				serverDown.Store(false)
			})
		default: // the operator: holds a node (ready or in use), or deletes one
			hold := rng.IntN(3) == 0
			var picked *kv.Node
			rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
				n := e.Value
				switch {
				case hold && ((n.State == kv.NodeReady && n.AllocatedTo == "") || n.State == kv.NodeInUse):
				case !hold && (n.State == kv.NodeReady || n.State == kv.NodeInUse || n.State == kv.NodeBuilding):
				default:
					return true
				}
				picked = &n
				return rng.IntN(4) != 0
			})
			if picked == nil {
				continue
			}
			touchedMu.Lock()
			touched[picked.ID] = true
			touchedMu.Unlock()
			viaCLI := rng.IntN(3) == 0
			var err error
			switch {
			case hold && viaCLI:
				_, errOut, code := nodepool(t, cli, "hold", picked.ID, "--reason", "chaos", "--expire", "2s")
				if code != 0 {
					err = fmt.Errorf("nodepool hold: %s", errOut)
				}
			case hold:
				_, err = rec.client.HoldAny(ctx, picked.ID, "chaos", time.Duration(1+rng.IntN(3))*time.Second)
			case viaCLI:
				_, errOut, code := nodepool(t, cli, "delete", "--force", picked.ID)
				if code != 0 {
					err = fmt.Errorf("nodepool delete: %s", errOut)
				}
			default:
				err = rec.client.DeleteNode(ctx, picked.ID)
			}
			if hold {
				holds.Add(1)
			} else {
				deletes.Add(1)
			}
			// A node that changed meanwhile may refuse: the operator
			// would just try again.
			if err != nil && !strings.Contains(err.Error(), "only ready") && !strings.Contains(err.Error(), "no node") {
				t.Logf("operator on %s (%s): %v", picked.ID, picked.State, err)
			}
		}
	}
	t.Logf("faults over after %s: %d launchers killed, %d servers killed, %d deletes, %d holds; waiting for the requests in flight",
		duration, launcherKills.Load(), serverKills.Load(), deletes.Load(), holds.Load())
	faults.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	wg.Wait()

	// Every request fulfilled, or failed for a reason that the fake's
	// failure rate or the operator explains.
	fulfilled := 0
	for _, o := range outcomes {
		switch {
		case o.state == kv.RequestFulfilled && o.err == nil:
			fulfilled++
		case o.state == kv.RequestFailed && strings.Contains(o.err.Error(), fmt.Sprintf("launch failed after %d attempt(s)", chaosRetries)):
			launchFailed.Add(1)
		case touchedAny(o.nodes):
			// The operator deleted or held one of its nodes.
		default:
			t.Errorf("request %s ended %q: %v", o.id, o.state, o.err)
		}
	}
	// A launch fails for good when all its attempts fail.
	launches := float64(audit.instancesCreated())
	expected := launches * math.Pow(chaosFailureRate, chaosRetries)
	allowed := int64(math.Ceil(expected + 4*math.Sqrt(expected) + 2))
	if launchFailed.Load() > allowed {
		t.Errorf("%d requests failed after %d attempts; the failure rate %.2f explains about %.1f (at most %d)",
			launchFailed.Load(), chaosRetries, chaosFailureRate, expected, allowed)
	}

	c.WaitHealthy(90 * time.Second)
	rec.until(2*time.Minute, "only the min-ready nodes left, each with its instance", func() bool { return quiet(rec, 2) })
	stopAudit()
	violations, summary := audit.report()
	t.Logf("%d requests: %d fulfilled, %d failed after %d launch attempts (about %.1f expected); %d launchers and %d servers killed; %d operator deletes, %d holds",
		len(outcomes), fulfilled, launchFailed.Load(), chaosRetries, expected, launcherKills.Load(), serverKills.Load(), deletes.Load(), holds.Load())
	t.Log(summary)
	for _, v := range violations {
		t.Error(v)
	}
	if launcherKills.Load() == 0 || serverKills.Load() == 0 {
		t.Error("the faults did not happen")
	}
	for _, id := range fl.ids() {
		if p := fl.get(id); p != nil {
			_ = p.stop(syscall.SIGTERM, 30*time.Second)
		}
	}
}
