package openstack

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	gcconfig "github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

// env is a dev cloud on loopback, a clouds.yaml for it (cloud "dev"), and
// a configuration whose provider "os" uses it.
type env struct {
	t     *testing.T
	cloud *devos.Server
	file  string
	cfg   *config.Config
}

func newEnv(t *testing.T, nodepoolYAML string, opts devos.Options) *env {
	t.Helper()
	if opts.BootTime == 0 {
		opts.BootTime = 50 * time.Millisecond
	}
	if opts.AvailabilityZones == nil {
		opts.AvailabilityZones = []string{"az1", "az2", "az3"}
	}
	srv, err := devos.Start("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	file, err := srv.WriteCloudsYAML(filepath.Join(t.TempDir(), "clouds.yaml"), "dev")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("nodepool.yaml", []byte(nodepoolYAML))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, cloud: srv, file: file, cfg: cfg}
	// What launchConfig's labels use.
	srv.AddSecurityGroup("ci")
	if _, err := keypairs.Create(t.Context(), e.compute(), keypairs.CreateOpts{Name: "zuul"}).Extract(); err != nil {
		t.Fatal(err)
	}
	return e
}

// provider makes a driver for provider "os", as one process would.
func (e *env) provider() *Provider {
	e.t.Helper()
	pc, ok := e.cfg.Provider("os")
	if !ok {
		e.t.Fatal("the configuration has no provider os")
	}
	p, err := New(e.t.Context(), pc, slog.New(slog.DiscardHandler), WithCloudsFile(e.file))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// gophercloud is a plain client of the cloud, for what tests do by hand.
func (e *env) compute() *gophercloud.ServiceClient {
	e.t.Helper()
	return e.clients().compute
}

func (e *env) clients() *clients {
	e.t.Helper()
	ao, eo, _, err := clouds.Parse(clouds.WithCloudName("dev"), clouds.WithLocations(e.file))
	if err != nil {
		e.t.Fatal(err)
	}
	pc, err := gcconfig.NewProviderClient(e.t.Context(), ao)
	if err != nil {
		e.t.Fatal(err)
	}
	c := &clients{provider: pc}
	if c.compute, err = gcos.NewComputeV2(pc, eo); err != nil {
		e.t.Fatal(err)
	}
	c.compute.Microversion = Microversion
	if c.network, err = gcos.NewNetworkV2(pc, eo); err != nil {
		e.t.Fatal(err)
	}
	if c.volume, err = gcos.NewBlockStorageV3(pc, eo); err != nil {
		e.t.Fatal(err)
	}
	if c.image, err = gcos.NewImageV2(pc, eo); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func request(node, label string, attempt int) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: node, Hostname: "np" + node, Provider: "os", Pool: "main", Label: label, Attempt: attempt,
		Tags: map[string]string{drivers.TagProvider: "os", drivers.TagPool: "main", drivers.TagNode: node, drivers.TagLabel: label}}
}

// advance runs a machine until it is done or fails, as the launcher does
// (waiting as it asks, a little at most), within a deadline.
func advance(t *testing.T, sm drivers.StateMachine) (drivers.Step, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		step, err := sm.Advance(ctx)
		if err != nil || step.Done {
			return step, err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the machine did not finish: %s", sm.State())
		case <-time.After(min(step.Wait, 20*time.Millisecond)):
		}
	}
}

// advanceTo runs a machine until its state's step is step.
func advanceTo(t *testing.T, sm drivers.StateMachine, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for stepOf(sm) != step {
		st, err := sm.Advance(ctx)
		if err != nil || st.Done {
			t.Fatalf("before step %s: done %v, %v (state %s)", step, st.Done, err, sm.State())
		}
	}
}

func stepOf(sm drivers.StateMachine) string {
	switch m := sm.(type) {
	case *createMachine:
		return m.st.Step
	case *deleteMachine:
		return m.st.Step
	}
	return ""
}

// until polls cond within a deadline.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitfor.Until(t, 20*time.Second, what, cond, waitfor.Every(10*time.Millisecond))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// countingLimiter lets every call go and counts them.
type countingLimiter struct{ n atomic.Int64 }

func (l *countingLimiter) Wait(ctx context.Context) error {
	l.n.Add(1)
	return ctx.Err()
}
