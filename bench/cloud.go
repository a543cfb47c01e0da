package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// CloudOptions set up the cloud scenario.
type CloudOptions struct {
	// Name of the cloud target (CloudTargets); "" is openstack.
	Name string
	// Latency of every API call and boot time of a server.
	Latency, Boot time.Duration
	// RateLimit is the provider's rate, in API calls per second, of the
	// runs with a rate (0: those runs are left out).
	RateLimit float64
}

// CloudTarget is a cloud on loopback the cloud scenario runs a real driver
// against. Each driver's target lives in a file of its own (cloud_<name>.go).
type CloudTarget struct {
	// Config is the nodepool.yaml for n requests, with the provider paced
	// at callsPerSecond (0: no rate), in the driver's own words.
	Config func(n int, callsPerSecond float64) string
	// Start runs the cloud, a process of nodepool-devcloud (the binary
	// devcloud), with the latency and boot time; its Env is what the
	// launchers need to find it.
	Start func(ctx context.Context, devcloud, workDir string, latency, boot time.Duration) (CloudRun, error)
}

// CloudRun is a running cloud.
type CloudRun struct {
	Env []string
	// Calls counts the API calls the cloud served and refused (rate
	// limited) so far.
	Calls func() (calls, refused int, err error)
	// Servers counts the servers that are not deleted.
	Servers func() (int, error)
	// Times are when each server (by id) was created and became ACTIVE,
	// by the cloud's clock (zero before).
	Times func() (map[string][2]time.Time, error)
	Stop  func()
}

// CloudTargets are the clouds the cloud scenario knows, by name.
var CloudTargets = map[string]CloudTarget{
	"openstack": openstackTarget,
	"aws":       awsTarget,
}

// defaultCloud is the cloud of the cloud scenario when --cloud is not
// given.
func defaultCloud() string { return "openstack" }

func cloudNames() string {
	var names []string
	for n := range CloudTargets {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// runCloud measures a driver against its cloud on loopback: N requests at
// once, with 1 and 3 launcher processes, without and with a rate. Each
// run starts a fresh cloud and a fresh system; the figures include what
// the cloud served (API calls per node, refusals) and the launcher's own
// share of a request's latency: the median latency less the cloud's floor
// (the boot time and the latency of the calls a launch waits on).
func runCloud(ctx context.Context, o Options, n int) ([]Result, error) {
	if o.URL != "" {
		return nil, errors.New("the cloud scenario starts its own launchers and cloud; it cannot drive a running system")
	}
	co := o.Cloud
	if co.Name == "" {
		co.Name = defaultCloud()
	}
	target, ok := CloudTargets[co.Name]
	if !ok {
		return nil, fmt.Errorf("unknown cloud %q; expected one of: %s", co.Name, cloudNames())
	}
	if co.Latency == 0 {
		co.Latency = 50 * time.Millisecond
	}
	if co.Boot == 0 {
		co.Boot = 2 * time.Second
	}
	rates := []float64{0}
	if co.RateLimit > 0 {
		rates = append(rates, co.RateLimit)
	}
	var out []Result
	for _, rate := range rates {
		for _, launchers := range []int{1, 3} {
			name := fmt.Sprintf("cloud %s, %d launcher(s)", co.Name, launchers)
			if rate > 0 {
				name += fmt.Sprintf(", rate %g/s", rate)
			}
			dir := filepath.Join(o.WorkDir, fmt.Sprintf("%s-rate%g-launchers-%d", co.Name, rate, launchers))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return out, err
			}
			res, err := cloudRun(ctx, o, target, co, dir, n, rate, launchers)
			res.Scenario, res.Launchers = name, launchers
			if err != nil {
				return out, fmt.Errorf("%s: %w", name, err)
			}
			out = append(out, res)
		}
	}
	return out, nil
}

func cloudRun(ctx context.Context, o Options, target CloudTarget, co CloudOptions, dir string, n int, rate float64, launchers int) (Result, error) {
	cloud, err := target.Start(ctx, o.DevCloud, dir, co.Latency, co.Boot)
	if err != nil {
		return Result{}, err
	}
	defer cloud.Stop()
	oo := o
	oo.WorkDir = dir
	oo.Env = append(slices.Clone(o.Env), cloud.Env...)
	var res Result
	err = withSystem(ctx, oo, target.Config(n, rate), launchers, func(s *System) error {
		calls0, refused0, err := cloud.Calls()
		if err != nil {
			return err
		}
		var phases map[string]float64
		res, phases, err = cloudBatch(ctx, s, cloud, n)
		if err != nil {
			return err
		}
		calls, refused, err := cloud.Calls()
		if err != nil {
			return err
		}
		left, err := cloud.Servers()
		if err != nil {
			return err
		}
		// The floor: a launch waits on the create call, the boot, and the
		// listing that sees it active.
		floor := co.Boot + 2*co.Latency
		res.addExtra(map[string]float64{
			"api_calls_per_node":  float64(calls-calls0) / float64(n),
			"refused_429":         float64(refused - refused0),
			"cloud_floor_ms":      float64(floor) / float64(time.Millisecond),
			"overhead_p50_ms":     float64(res.Latency.P50-floor) / float64(time.Millisecond),
			"servers_left":        float64(left),
			"makespan_over_floor": res.Makespan.Seconds() / floor.Seconds(),
		})
		res.addExtra(phases)
		return nil
	})
	return res, err
}

// cloudBatch is batch, plus where each launch's time went, from the node
// records (created, ready) and the cloud's servers (created, ACTIVE):
// request to node record, node record to the server's create call, the
// boot, ACTIVE to the node ready, ready to the request fulfilled (p50s,
// in ms).
func cloudBatch(ctx context.Context, s *System, cloud CloudRun, n int) (Result, map[string]float64, error) {
	t := newTracker()
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := t.watch(tctx, s.Client); err != nil {
		return Result{}, nil, err
	}
	ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("cloud%d", time.Now().UnixNano()), single(n))
	if err != nil {
		return Result{}, nil, err
	}
	reqs, err := waitDone(ctx, t, ids, 30*time.Minute)
	if err != nil {
		return Result{}, nil, err
	}
	lat, first, last := latencies(t, ids, sent)
	times, err := cloud.Times()
	if err != nil {
		return Result{}, nil, err
	}
	var toRecord, toCreate, boot, toReady, toFulfilled []time.Duration
	t.mu.Lock()
	for _, r := range reqs {
		if len(r.Nodes) != 1 {
			continue
		}
		nd, ok := t.nodes[r.Nodes[0]]
		st, sok := times[nd.ExternalID]
		if !ok || !sok || st[1].IsZero() {
			continue
		}
		toRecord = append(toRecord, nd.Created.Sub(sent[r.ID]))
		toCreate = append(toCreate, st[0].Sub(nd.Created))
		boot = append(boot, st[1].Sub(st[0]))
		toReady = append(toReady, nd.StateTime.Sub(st[1]))
		toFulfilled = append(toFulfilled, t.done[r.ID].Sub(nd.StateTime))
	}
	t.mu.Unlock()
	ms := func(ds []time.Duration) float64 { return float64(Summarise(ds).P50) / float64(time.Millisecond) }
	phases := map[string]float64{}
	if len(boot) > 0 {
		phases = map[string]float64{
			"request_to_record_p50_ms": ms(toRecord), "record_to_create_p50_ms": ms(toCreate), "boot_p50_ms": ms(boot),
			"active_to_ready_p50_ms": ms(toReady), "ready_to_fulfilled_p50_ms": ms(toFulfilled),
		}
	}
	nodes, err := takeAll(ctx, s.Client, reqs)
	if err != nil {
		return Result{}, nil, err
	}
	cleanup, err := giveBack(ctx, s, t, nodes)
	if err != nil {
		return Result{}, nil, err
	}
	res := Result{Requests: n, Makespan: last.Sub(first), Throughput: float64(n) / last.Sub(first).Seconds(), Latency: lat, Cleanup: cleanup}
	finish(ctx, s, &res)
	return res, phases, nil
}
