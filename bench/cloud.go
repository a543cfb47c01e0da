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
	// Start runs the cloud with the latency and boot time; env is what
	// the launchers need to find it.
	Start func(ctx context.Context, workDir string, latency, boot time.Duration) (CloudRun, error)
}

// CloudRun is a running cloud.
type CloudRun struct {
	Env []string
	// Calls and Refused count the API calls the cloud served and refused
	// (rate limited) so far.
	Calls   func() (calls, refused int)
	Servers func() int
	Stop    func()
}

// CloudTargets are the clouds the cloud scenario knows, by name.
var CloudTargets = map[string]CloudTarget{
	"aws": awsTarget,
}

// defaultCloud is the cloud of the cloud scenario when --cloud is not
// given: openstack, when this build has its target.
func defaultCloud() string {
	if _, ok := CloudTargets["openstack"]; ok {
		return "openstack"
	}
	return "aws"
}

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
	cloud, err := target.Start(ctx, dir, co.Latency, co.Boot)
	if err != nil {
		return Result{}, err
	}
	defer cloud.Stop()
	oo := o
	oo.WorkDir = dir
	oo.Env = append(slices.Clone(o.Env), cloud.Env...)
	var res Result
	err = withSystem(ctx, oo, target.Config(n, rate), launchers, func(s *System) error {
		calls0, refused0 := cloud.Calls()
		var err error
		res, err = batch(ctx, s, "cloud", n, 30*time.Minute)
		if err != nil {
			return err
		}
		calls, refused := cloud.Calls()
		// The floor: a launch waits on the create call, the boot, and the
		// listing that sees it active.
		floor := co.Boot + 2*co.Latency
		res.Extra = map[string]float64{
			"api_calls_per_node":  float64(calls-calls0) / float64(n),
			"refused_429":         float64(refused - refused0),
			"cloud_floor_ms":      float64(floor) / float64(time.Millisecond),
			"overhead_p50_ms":     float64(res.Latency.P50-floor) / float64(time.Millisecond),
			"servers_left":        float64(cloud.Servers()),
			"makespan_over_floor": res.Makespan.Seconds() / floor.Seconds(),
		}
		return nil
	})
	return res, err
}
