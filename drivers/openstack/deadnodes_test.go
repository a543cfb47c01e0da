package openstack_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	gcconfig "github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/openstack"
	"github.com/nodepool-nats/nodepool/events"
	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

const minReadyConfig = `
labels: [{name: small, min-ready: 1}]
providers:
  - name: os
    cloud: dev
    rate: 0
    cloud-images:
      - name: cirros
        image-name: cirros-0.6.2-x86_64-disk
    pools:
      - name: main
        labels:
          - {name: small, cloud-image: cirros, flavor-name: m1.tiny, host-key-checking: false}
`

// launcherOn runs a launcher whose one provider is the openstack driver
// against a dev cloud, and returns a cache of the node records and a
// plain compute client of the cloud, for what the test does by hand.
func launcherOn(t *testing.T, opts devos.Options) (*kv.Cache[kv.Node], *gophercloud.ServiceClient, *logtest.Recorder) {
	t.Helper()
	srv, err := devos.Start("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	file, err := srv.WriteCloudsYAML(filepath.Join(t.TempDir(), "clouds.yaml"), "dev")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("nodepool.yaml", []byte(minReadyConfig))
	if err != nil {
		t.Fatal(err)
	}
	log, rec := logtest.New(t)
	drv, err := openstack.New(t.Context(), &cfg.Providers[0], log, openstack.WithCloudsFile(file))
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	_, js := ns.Connect(t)
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: 2 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	l, err := consumers.NewLauncher(js, b, consumers.Options{ID: "launcher-1", Config: cfg,
		Providers: map[string]drivers.Provider{"os": drv}, LeaseTTL: 2 * time.Second, SyncInterval: 200 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Run(ctx); err != nil {
			t.Errorf("launcher: %v", err)
		}
		drv.Close()
	}()
	t.Cleanup(func() { cancel(); <-done })
	nodes := kv.NewCache(b.Nodes, log)
	t.Cleanup(nodes.Start())

	ao, eo, _, err := clouds.Parse(clouds.WithCloudName("dev"), clouds.WithLocations(file))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := gcconfig.NewProviderClient(t.Context(), ao)
	if err != nil {
		t.Fatal(err)
	}
	compute, err := gcos.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	compute.Microversion = openstack.Microversion
	return nodes, compute, rec
}

// nodesUntil waits, with a deadline, until cond holds, looking at every
// change of the node records.
func nodesUntil(t *testing.T, nodes *kv.Cache[kv.Node], what string, cond func() bool) {
	t.Helper()
	sub := nodes.Subscribe()
	defer nodes.Unsubscribe(sub)
	waitfor.Until(t, 30*time.Second, what, cond, waitfor.Changes(sub), waitfor.Detail(func() string {
		var b strings.Builder
		nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			fmt.Fprintf(&b, "  node %s %s ext=%s reason=%q\n", e.Key, e.Value.State, e.Value.ExternalID, e.Value.Reason)
			return true
		})
		return b.String()
	}))
}

func readyFree(nodes *kv.Cache[kv.Node]) []kv.Node {
	var out []kv.Node
	nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.State == kv.NodeReady && e.Value.AllocatedTo == "" {
			out = append(out, e.Value)
		}
		return true
	})
	return out
}

// A ready node whose server someone deletes, stops, or an administrator
// sets to ERROR (through Nova's API) is failed with Nova's status as the
// reason within a poll of the server listing, its server deleted, and
// min-ready replaces it.
func TestDeadServerIsReplaced(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		kill   func(ctx context.Context, cl *gophercloud.ServiceClient, id string) error
		reason string
	}{
		{"deleted", func(ctx context.Context, cl *gophercloud.ServiceClient, id string) error {
			return servers.Delete(ctx, cl, id).ExtractErr()
		}, "instance gone from the cloud"},
		{"stopped", func(ctx context.Context, cl *gophercloud.ServiceClient, id string) error {
			return servers.Stop(ctx, cl, id).ExtractErr()
		}, "instance is SHUTOFF"},
		{"error", func(ctx context.Context, cl *gophercloud.ServiceClient, id string) error {
			return servers.ResetState(ctx, cl, id, servers.StateError).ExtractErr()
		}, "instance is ERROR"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			nodes, compute, rec := launcherOn(t, devos.Options{BootTime: 50 * time.Millisecond})
			nodesUntil(t, nodes, "a ready node", func() bool { return len(readyFree(nodes)) == 1 })
			dead := readyFree(nodes)[0]
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("the launcher's log of the dead node:\n%s", strings.Join(rec.Lines("node="+dead.ID), "\n"))
				}
			})
			if err := c.kill(t.Context(), compute, dead.ExternalID); err != nil {
				t.Fatal(err)
			}
			// The launcher's log says the node failed, and why: a cache
			// need not see the failed state, which lasts a moment (a watch
			// started again resumes after it once the delete overwrote it).
			failedLine := func() string {
				if l := rec.Lines("the node failed", "node="+dead.ID); len(l) > 0 {
					return l[0]
				}
				return ""
			}
			nodesUntil(t, nodes, fmt.Sprintf("the dead node %s (server %s) failed and replaced", dead.ID, dead.ExternalID), func() bool {
				_, old := nodes.Get(dead.ID)
				fresh := readyFree(nodes)
				return failedLine() != "" && !old && len(fresh) == 1 && fresh[0].ID != dead.ID
			})
			if line := failedLine(); !strings.Contains(line, "why="+c.reason+" ") && !strings.HasSuffix(line, "why="+c.reason) {
				t.Errorf("failed with %q, want the reason %q", line, c.reason)
			}
			// The node's record went after its server: none is left.
			_, err := servers.Get(t.Context(), compute, dead.ExternalID).Extract()
			if !gophercloud.ResponseCodeIs(err, 404) {
				t.Errorf("the dead node's server is still there: %v", err)
			}
		})
	}
}
