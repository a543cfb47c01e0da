package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	gcconfig "github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/nodepool-nats/nodepool/events"
	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// startDevCloud runs an OpenStack on loopback for launcher processes and
// returns it with the environment that points them at it.
func startDevCloud(t *testing.T, opts devos.Options) (*devos.Server, map[string]string) {
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
	return srv, map[string]string{"OS_CLIENT_CONFIG_FILE": file}
}

// The kill test against the OpenStack on loopback: servers with floating
// IPs and host-key scans (of one SSH server every server leads to), 5%
// of them ERROR for No valid host.
func TestKillOpenStackLaunchersUnderLoad(t *testing.T) {
	t.Parallel()
	ssh := sshtest.Start(t, sshtest.Ed25519)
	q := devos.Quota{Instances: 45, Cores: -1, RAM: -1, Volumes: -1, Gigabytes: -1, FloatingIPs: -1}
	cloud, env := startDevCloud(t, devos.Options{BootTime: 300 * time.Millisecond, DeleteTime: 100 * time.Millisecond,
		Latency: 5 * time.Millisecond, ErrorRate: 0.05, Quota: &q, HostIP: "127.0.0.1"})
	config := fmt.Sprintf(killLabels+`
providers:
  - name: cloud1
    cloud: dev
    rate: 0
    launch-retries: 3
    port-cleanup-interval: 5
    cloud-images:
      - name: cirros
        image-name: cirros-0.6.2-x86_64-disk
        connection-port: %d
    pools:
      - name: main
        max-servers: 30
        labels:
          - {name: small, cloud-image: cirros, flavor-name: m1.tiny}
          - {name: medium, cloud-image: cirros, flavor-name: m1.small}
          - {name: big, cloud-image: cirros, flavor-name: m1.medium}
      - name: spare
        priority: 200
        max-servers: 10
        labels:
          - {name: small, cloud-image: cirros, flavor-name: m1.tiny}
          - {name: medium, cloud-image: cirros, flavor-name: m1.small}
`, ssh.Port)
	killUnderLoad(t, killCloud{config: config, env: env, instances: func(*records) map[string]string {
		out := map[string]string{}
		for _, s := range cloud.Servers() {
			if !s.Deleting {
				out[s.ID] = s.Metadata["nodepool_node_id"]
			}
		}
		return out
	}, quiet: func(t *testing.T) {
		// Every floating IP left is a ready node's. (The min-ready nodes
		// age out every few seconds: a replacement may be booting without
		// its floating IP yet, or the one it replaces be going with its
		// own, so this is waited for, with a deadline, while the
		// launchers run: once they stop, a replacement they stopped
		// launching keeps its server without a floating IP, for the next
		// launcher to finish. Checked after they stopped, it failed one
		// run in three.)
		fips, servers := cloud.FloatingIPs(), cloud.Servers()
		if !waitfor.True(30*time.Second, func() bool {
			fips, servers = cloud.FloatingIPs(), cloud.Servers()
			return len(fips) == len(servers)
		}, waitfor.Every(50*time.Millisecond)) { // the dev cloud's state, which no record announces
			t.Errorf("%d floating IPs for %d servers: %+v", len(fips), len(servers), fips)
		}
	}}, 120)
}

// A launch whose process is killed (SIGKILL) after it created the server
// is resumed by another process from the node's driver_data: the node
// becomes ready with that server, and no second server is made.
func TestOpenStackLaunchResumedAfterKill(t *testing.T) {
	t.Parallel()
	cloud, env := startDevCloud(t, devos.Options{BootTime: 3 * time.Second})
	srv := natstest.Start(t)
	url := srv.ClientURL()
	cfg := writeConfig(t, `
labels: [{name: small}]
providers:
  - name: cloud1
    cloud: dev
    rate: 0
    cloud-images: [{name: cirros, image-name: cirros-0.6.2-x86_64-disk}]
    pools:
      - name: main
        host-key-checking: false
        labels: [{name: small, cloud-image: cirros, min-ram: 512}]
`)
	procEnv := func(id string) map[string]string {
		e := map[string]string{"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher",
			"NODEPOOL_HTTP_ADDR": "", "NODEPOOL_LEASE_TTL": "2s", "NODEPOOL_SYNC_INTERVAL": "500ms"}
		for k, v := range env {
			e[k] = v
		}
		return e
	}
	first := startRun(t, procEnv("first"), "-c", cfg)
	first.waitLog("launcher running", 60*time.Second)
	rec := watchRecords(t, url, "")
	if _, err := rec.client.Submit(t.Context(), events.RequestMessage{ID: "r1", Labels: []string{"small"}, Requestor: "test"}); err != nil {
		t.Fatal(err)
	}
	var node kv.Node
	rec.until(60*time.Second, "the server is created and recorded", func() bool {
		found := false
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeBuilding && e.Value.ExternalID != "" {
				node, found = e.Value, true
			}
			return !found
		})
		return found
	})
	if err := first.stop(syscall.SIGKILL, 30*time.Second); err == nil {
		t.Log("first launcher killed")
	}
	if s := cloud.Servers(); len(s) != 1 || s[0].Status != "BUILD" {
		t.Fatalf("the server should still boot when its launcher dies: %+v", s)
	}
	second := startRun(t, procEnv("second"), "-c", cfg)
	second.waitLog("launcher running", 60*time.Second)
	rec.until(60*time.Second, "the request is fulfilled and its node ready", func() bool {
		r, ok := rec.requests.Get("r1")
		n, nok := rec.nodes.Get(node.ID)
		return ok && r.Value.State == kv.RequestFulfilled && nok && n.Value.State == kv.NodeReady
	})
	e, _ := rec.nodes.Get(node.ID)
	if e.Value.State != kv.NodeReady || e.Value.ExternalID != node.ExternalID || e.Value.Launcher != "second" {
		t.Errorf("node after the resume: state %s, server %s (was %s), launcher %s", e.Value.State, e.Value.ExternalID, node.ExternalID, e.Value.Launcher)
	}
	if s := cloud.Servers(); len(s) != 1 {
		t.Errorf("%d servers: %+v", len(s), s)
	}
	_ = second.stop(syscall.SIGTERM, 30*time.Second)
}

// Images on OpenStack through `nodepool run`: a build is uploaded to
// Glance (named by image-name-format, with meta), a node of its label
// boots from the upload and is reached as the diskimage says, and an image
// tagged as ours that no upload accounts for is an alien.
func TestOpenStackImages(t *testing.T) {
	t.Parallel()
	cloud, cloudEnv := startDevCloud(t, devos.Options{BootTime: 100 * time.Millisecond})
	dir := t.TempDir()
	cfg := writeConfig(t, fmt.Sprintf(`
diskimages:
  - name: debian
    dib-cmd: %s
    env-vars: {FAKE_DIB_COUNT: %s/count}
    username: debian
    python-path: /usr/bin/python3
labels: [{name: debian}]
providers:
  - name: cloud1
    cloud: dev
    image-name-format: "np-{image_name}-{timestamp}"
    diskimages:
      - name: debian
        meta: {os_distro: debian}
        connection-port: 2022
    pools:
      - name: main
        host-key-checking: false
        auto-floating-ip: false
        labels: [{name: debian, diskimage: debian, min-ram: 1024}]
`, fakeDib(t), dir))
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	env["NODEPOOL_SYNC_INTERVAL"] = "5s"
	for k, v := range cloudEnv {
		env[k] = v
	}
	p := startRun(t, env, "-c", cfg)
	p.waitLog("builder running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	cli := map[string]string{"NODEPOOL_NATS_URL": url, "NODEPOOL_CONFIG": cfg}
	for k, v := range cloudEnv {
		cli[k] = v
	}
	rec := watchImages(t, url)
	out, errOut, code := nodepool(t, cli, "request", "--json", "--timeout", "60s", "debian")
	if code != 0 {
		t.Fatalf("request: %s", errOut)
	}
	var nodes []kv.Node
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatal(err)
	}
	ups := rec.readyUploads("debian", "cloud1")
	if len(ups) != 1 || nodes[0].ImageID != ups[0].ExternalID || !strings.HasPrefix(ups[0].ExternalName, "np-debian-") {
		t.Fatalf("node booted from %q; uploads %+v", nodes[0].ImageID, ups)
	}
	n := nodes[0]
	if n.Username != "debian" || n.PythonPath != "/usr/bin/python3" || n.ConnectionPort != 2022 || n.ConnectionType != "ssh" {
		t.Errorf("node: username %q python %q connection %s:%d", n.Username, n.PythonPath, n.ConnectionType, n.ConnectionPort)
	}
	var img devos.ImageInfo
	for _, i := range cloud.Images() {
		if i.ID == ups[0].ExternalID {
			img = i
		}
	}
	if img.Status != "active" || img.Properties["os_distro"] != "debian" || img.Properties["nodepool_upload_id"] != ups[0].Key() {
		t.Errorf("image in Glance: %+v", img)
	}
	// An alien: tagged as ours, no upload record.
	alien, err := images.Create(t.Context(), glance(t, cloudEnv), images.CreateOpts{Name: "debian-leaked", DiskFormat: "qcow2", ContainerFormat: "bare",
		Properties: map[string]string{"nodepool_provider_name": "cloud1", "nodepool_upload_id": "debian.0000000009.cloud1.0000000042"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = nodepool(t, cli, "alien-image-list")
	if code != 0 || !strings.Contains(out, alien.ID) || strings.Contains(out, ups[0].ExternalID) {
		t.Errorf("alien-image-list: %d %s\n%s", code, errOut, out)
	}
}

// devLogin logs in to the dev cloud as its clouds.yaml (env's
// OS_CLIENT_CONFIG_FILE) says, as an openstacksdk user would.
func devLogin(t *testing.T, env map[string]string) (*gophercloud.ProviderClient, gophercloud.EndpointOpts) {
	t.Helper()
	ao, eo, _, err := clouds.Parse(clouds.WithCloudName("dev"), clouds.WithLocations(env["OS_CLIENT_CONFIG_FILE"]))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := gcconfig.NewProviderClient(t.Context(), ao)
	if err != nil {
		t.Fatal(err)
	}
	return pc, eo
}

// glance is an image service client of the dev cloud.
func glance(t *testing.T, env map[string]string) *gophercloud.ServiceClient {
	t.Helper()
	pc, eo := devLogin(t, env)
	c, err := gcos.NewImageV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Quota on OpenStack: Nova's limits hold requests back until a node is
// given back, and a create Nova refuses for quota waits instead of
// failing the launch.
func TestOpenStackQuotaWaits(t *testing.T) {
	t.Parallel()
	q := devos.Quota{Instances: 2, Cores: -1, RAM: -1, Volumes: -1, Gigabytes: -1, FloatingIPs: -1}
	cloud, cloudEnv := startDevCloud(t, devos.Options{BootTime: 100 * time.Millisecond, Quota: &q})
	cfg := writeConfig(t, `
labels: [{name: small}]
providers:
  - name: cloud1
    cloud: dev
    rate: 0
    cloud-images: [{name: cirros, image-name: cirros-0.6.2-x86_64-disk}]
    pools:
      - name: main
        host-key-checking: false
        auto-floating-ip: false
        labels: [{name: small, cloud-image: cirros, flavor-name: m1.tiny}]
`)
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	for k, v := range cloudEnv {
		env[k] = v
	}
	// The first create is refused as over quota (another tenant took the
	// room a moment): the launch waits and goes on.
	cloud.FailNextCreates(1, 403, "")
	p := startRun(t, env, "-c", cfg)
	p.waitLog("launcher running", 60*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	rec := watchRecords(t, url, "")
	for _, id := range []string{"q1", "q2", "q3"} {
		if _, err := rec.client.Submit(t.Context(), events.RequestMessage{ID: id, Labels: []string{"small"}, Requestor: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	fulfilled := func() []string {
		var ids []string
		rec.requests.Range(func(e *kv.Entry[kv.Request]) bool {
			if e.Value.State == kv.RequestFulfilled {
				ids = append(ids, e.Key)
			}
			return true
		})
		return ids
	}
	rec.until(60*time.Second, "two requests fulfilled within the quota of two servers", func() bool { return len(fulfilled()) == 2 })
	// The one left waits. (Which one it is depends on the order the
	// intake recorded the three in: a pass serves what is recorded.)
	for _, id := range []string{"q1", "q2", "q3"} {
		if r, _ := rec.requests.Get(id); !slices.Contains(fulfilled(), id) && r.Value.State == kv.RequestFailed {
			t.Errorf("the third request, %s, is %s: %s", id, r.Value.State, r.Value.Reason)
		}
	}
	if n := len(cloud.Servers()); n != 2 {
		t.Errorf("%d servers within a quota of 2", n)
	}
	// Give a node back: the waiting request gets the room.
	first, _ := rec.requests.Get(fulfilled()[0])
	cli := map[string]string{"NODEPOOL_NATS_URL": url, "NODEPOOL_CONFIG": cfg}
	node := first.Value.Nodes[0]
	if _, errOut, code := nodepool(t, cli, "delete", "--force", node); code != 0 {
		t.Fatalf("delete: %s", errOut)
	}
	rec.until(60*time.Second, "all three requests fulfilled", func() bool { return len(fulfilled()) == 3 })
	if out := p.output(); !strings.Contains(out, "cloud asks to wait") || !strings.Contains(out, "Quota exceeded for instances") {
		t.Error("the refused create did not make the launch wait")
	}

	// A server tagged as this provider's without a node record is a leak,
	// deleted by the cleanup; a server that is not ours stays.
	rec.until(60*time.Second, "the deleted node's server gone", func() bool { return len(cloud.Servers()) == 2 })
	cloud.SetQuota(devos.Quota{Instances: -1, Cores: -1, RAM: -1, Volumes: -1, Gigabytes: -1, FloatingIPs: -1})
	nova := novaClient(t, cloudEnv)
	img := cloud.Images()[0].ID
	leaked, err := servers.Create(t.Context(), nova, servers.CreateOpts{Name: "npleaked", FlavorRef: "1", ImageRef: img, Networks: "auto",
		Metadata: map[string]string{"nodepool_provider_name": "cloud1", "nodepool_node_id": "gone"}}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	other, err := servers.Create(t.Context(), nova, servers.CreateOpts{Name: "not-ours", FlavorRef: "1", ImageRef: img, Networks: "auto"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	rec.until(60*time.Second, "the leaked server deleted", func() bool {
		for _, s := range cloud.Servers() {
			if s.ID == leaked.ID {
				return false
			}
		}
		return true
	})
	found := false
	for _, s := range cloud.Servers() {
		found = found || s.ID == other.ID
	}
	if !found {
		t.Error("a server that is not ours was deleted")
	}
}

// novaClient is a compute client of the dev cloud.
func novaClient(t *testing.T, env map[string]string) *gophercloud.ServiceClient {
	t.Helper()
	pc, eo := devLogin(t, env)
	c, err := gcos.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	c.Microversion = "2.79"
	return c
}
