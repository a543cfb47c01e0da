package openstack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	cinderlimits "github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	novalimits "github.com/gophercloud/gophercloud/v2/openstack/compute/v2/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/pagination"

	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

type clients struct {
	provider *gophercloud.ProviderClient
	compute  *gophercloud.ServiceClient
	image    *gophercloud.ServiceClient
	network  *gophercloud.ServiceClient
	volume   *gophercloud.ServiceClient
}

// start runs a dev cloud and logs in to it through a clouds.yaml, as the
// driver does.
func start(t *testing.T, opts devos.Options, cloud string) (*devos.Server, clients) {
	t.Helper()
	if opts.AppCredentialID == "" {
		opts.AppCredentialID, opts.AppCredentialSecret = "appcred", "s3cret"
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
	ctx := t.Context()
	ao, eo, _, err := clouds.Parse(clouds.WithCloudName(cloud), clouds.WithLocations(file))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := config.NewProviderClient(ctx, ao)
	if err != nil {
		t.Fatal(err)
	}
	var cl clients
	cl.provider = pc
	if cl.compute, err = openstack.NewComputeV2(pc, eo); err != nil {
		t.Fatal(err)
	}
	cl.compute.Microversion = "2.79"
	if cl.image, err = openstack.NewImageV2(pc, eo); err != nil {
		t.Fatal(err)
	}
	if cl.network, err = openstack.NewNetworkV2(pc, eo); err != nil {
		t.Fatal(err)
	}
	if cl.volume, err = openstack.NewBlockStorageV3(pc, eo); err != nil {
		t.Fatal(err)
	}
	return srv, cl
}

func statusOf(err error) int {
	var e gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &e) {
		return e.Actual
	}
	return 0
}

func bodyOf(err error) string {
	var e gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &e) {
		return string(e.Body)
	}
	return ""
}

// waitStatus polls a server until it has a status, as a client would.
func waitStatus(t *testing.T, cl clients, id, status string) *servers.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var s *servers.Server
	waitfor.Until(t, 20*time.Second, fmt.Sprintf("server %s to be %s", id, status), func() bool {
		var err error
		if s, err = servers.Get(ctx, cl.compute, id).Extract(); err != nil {
			t.Fatalf("server %s: %v", id, err)
		}
		return s.Status == status
	}, waitfor.Every(20*time.Millisecond), waitfor.Detail(func() string { return fmt.Sprintf("it is %s", s.Status) }))
	return s
}

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	srv, cl := start(t, devos.Options{BootTime: 100 * time.Millisecond}, "dev")
	ctx := t.Context()
	imgs, err := images.List(cl.image, images.ListOpts{Name: "cirros-0.6.2-x86_64-disk"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	il, _ := images.ExtractImages(imgs)
	if len(il) != 1 {
		t.Fatalf("images: %+v", il)
	}
	nets, _ := networks.List(cl.network, networks.ListOpts{Name: "private"}).AllPages(ctx)
	nl, _ := networks.ExtractNetworks(nets)
	if len(nl) != 1 {
		t.Fatalf("networks: %+v", nl)
	}
	s, err := servers.Create(ctx, cl.compute, servers.CreateOpts{
		Name: "np0000000001", ImageRef: il[0].ID, FlavorRef: "2", Networks: []servers.Network{{UUID: nl[0].ID}},
		Metadata: map[string]string{"nodepool_node_id": "0000000001"}, UserData: []byte("#cloud-config\n"),
	}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	got := waitStatus(t, cl, s.ID, "ACTIVE")
	if got.Metadata["nodepool_node_id"] != "0000000001" || got.Flavor["original_name"] != "m1.small" {
		t.Errorf("server: %+v", got)
	}
	if addrs, _ := got.Addresses["private"].([]any); len(addrs) != 1 {
		t.Errorf("addresses: %v", got.Addresses)
	}
	out, err := servers.ShowConsoleOutput(ctx, cl.compute, s.ID, servers.ShowConsoleOutputOpts{Length: 2}).Extract()
	if err != nil || !strings.Contains(out, "login:") {
		t.Errorf("console: %q, %v", out, err)
	}
	// A floating IP on the server's port.
	pp, _ := ports.List(cl.network, ports.ListOpts{DeviceID: s.ID}).AllPages(ctx)
	pl, _ := ports.ExtractPorts(pp)
	if len(pl) != 1 || pl[0].Status != "ACTIVE" {
		t.Fatalf("ports: %+v", pl)
	}
	pub, _ := networks.List(cl.network, networks.ListOpts{Name: "public"}).AllPages(ctx)
	publ, _ := networks.ExtractNetworks(pub)
	fip, err := floatingips.Create(ctx, cl.network, floatingips.CreateOpts{FloatingNetworkID: publ[0].ID, PortID: pl[0].ID, Description: "np"}).Extract()
	if err != nil || fip.Status != "ACTIVE" {
		t.Fatalf("floating IP: %+v, %v", fip, err)
	}
	got = waitStatus(t, cl, s.ID, "ACTIVE")
	if addrs, _ := got.Addresses["private"].([]any); len(addrs) != 2 {
		t.Errorf("addresses with the floating IP: %v", got.Addresses)
	}
	if err := servers.Delete(ctx, cl.compute, s.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	_, err = servers.Get(ctx, cl.compute, s.ID).Extract()
	if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) || !strings.Contains(bodyOf(err), `"itemNotFound"`) {
		t.Errorf("deleted server: %v", err)
	}
	// The floating IP stays, unattached.
	if f, err := floatingips.Get(ctx, cl.network, fip.ID).Extract(); err != nil || f.PortID != "" || f.Status != "DOWN" {
		t.Errorf("floating IP after the delete: %+v, %v", f, err)
	}
	if len(srv.Ports()) != 0 {
		t.Errorf("ports left: %+v", srv.Ports())
	}
	// changes-since shows the deleted server.
	page, err := servers.List(cl.compute, servers.ListOpts{ChangesSince: time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := servers.ExtractServers(page)
	if len(all) != 1 || all[0].Status != "DELETED" {
		t.Errorf("changes-since: %+v", all)
	}
}

func TestErrorsAndKnobs(t *testing.T) {
	t.Parallel()
	q := devos.Quota{Instances: 2, Cores: -1, RAM: -1, Volumes: 1, Gigabytes: 10, FloatingIPs: -1}
	srv, cl := start(t, devos.Options{Quota: &q}, "dev-appcred")
	ctx := t.Context()
	img := srv.Images()[0].ID
	create := func(name string) (*servers.Server, error) {
		return servers.Create(ctx, cl.compute, servers.CreateOpts{Name: name, ImageRef: img, FlavorRef: "1", Networks: "auto"}, nil).Extract()
	}
	for i := range 2 {
		if _, err := create("s" + string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	_, err := create("over")
	if statusOf(err) != 403 || !strings.Contains(bodyOf(err), `"forbidden"`) || !strings.Contains(bodyOf(err), "Quota exceeded for instances") {
		t.Errorf("over quota: %v", err)
	}
	// Injected failures come first, in order.
	srv.SetQuota(devos.Quota{Instances: -1, Cores: -1, RAM: -1, Volumes: 1, Gigabytes: 10, FloatingIPs: -1})
	srv.FailNextCreates(1, 500, "")
	if _, err := create("fails"); statusOf(err) != 500 || !strings.Contains(bodyOf(err), "computeFault") {
		t.Errorf("injected failure: %v", err)
	}
	srv.ErrorNextServers(1, devos.FaultNoValidHost)
	s, err := create("errors")
	if err != nil {
		t.Fatal(err)
	}
	got := waitStatus(t, cl, s.ID, "ERROR")
	if got.Fault.Message != devos.FaultNoValidHost || got.Fault.Code != 500 {
		t.Errorf("fault: %+v", got.Fault)
	}
	// Unknown flavor: 400 badRequest.
	_, err = servers.Create(ctx, cl.compute, servers.CreateOpts{Name: "x", ImageRef: img, FlavorRef: "nope", Networks: "auto"}, nil).Extract()
	if statusOf(err) != 400 || !strings.Contains(bodyOf(err), "badRequest") {
		t.Errorf("bad flavor: %v", err)
	}
	// Limits.
	lim, err := novalimits.Get(ctx, cl.compute, nil).Extract()
	if err != nil || lim.Absolute.TotalInstancesUsed != 3 || lim.Absolute.MaxTotalInstances != -1 {
		t.Errorf("limits: %+v, %v", lim, err)
	}
	// Pagination with a small page size: every server once.
	srv.SetPageSize(2)
	var seen []string
	err = servers.List(cl.compute, servers.ListOpts{}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		ss, err := servers.ExtractServers(p)
		for _, s := range ss {
			seen = append(seen, s.ID)
		}
		return true, err
	})
	if err != nil || len(seen) != 3 {
		t.Errorf("paginated listing: %v, %v", seen, err)
	}
	fl, err := flavors.ListDetail(cl.compute, nil).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if all, _ := flavors.ExtractFlavors(fl); len(all) != 5 {
		t.Errorf("flavors: %d", len(all))
	}
	// Cinder: quota of one volume.
	v, err := volumes.Create(ctx, cl.volume, volumes.CreateOpts{Size: 5, Name: "v1", Metadata: map[string]string{"nodepool_node_id": "1"}}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	_, err = volumes.Create(ctx, cl.volume, volumes.CreateOpts{Size: 1}, nil).Extract()
	if statusOf(err) != 413 || !strings.Contains(bodyOf(err), "VolumeLimitExceeded") {
		t.Errorf("volume quota: %v", err)
	}
	vl, err := cinderlimits.Get(ctx, cl.volume).Extract()
	if err != nil || vl.Absolute.MaxTotalVolumes != 1 || vl.Absolute.TotalGigabytesUsed != 5 {
		t.Errorf("volume limits: %+v, %v", vl, err)
	}
	if err := volumes.Delete(ctx, cl.volume, v.ID, nil).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	// Rate limit: 429 with Retry-After.
	srv.SetRateLimit(1)
	var rateErr error
	for range 5 {
		if _, rateErr = flavors.Get(ctx, cl.compute, "1").Extract(); rateErr != nil {
			break
		}
	}
	var ue gophercloud.ErrUnexpectedResponseCode
	if !errors.As(rateErr, &ue) || ue.Actual != 429 || ue.ResponseHeader.Get("Retry-After") == "" {
		t.Errorf("rate limit: %v", rateErr)
	}
	if srv.Stats().RateLimited == 0 {
		t.Error("no call counted as rate limited")
	}
}

func TestImageUpload(t *testing.T) {
	t.Parallel()
	srv, cl := start(t, devos.Options{}, "dev")
	ctx := t.Context()
	vis := images.ImageVisibilityPrivate
	img, err := images.Create(ctx, cl.image, images.CreateOpts{Name: "debian-1", DiskFormat: "qcow2", ContainerFormat: "bare",
		Visibility: &vis, Properties: map[string]string{"nodepool_upload_id": "debian.1.cloud.1"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if img.Status != images.ImageStatusQueued {
		t.Errorf("new image is %s", img.Status)
	}
	data := bytes.Repeat([]byte("disk"), 1000)
	if err := imagedata.Upload(ctx, cl.image, img.ID, bytes.NewReader(data)).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	got, err := images.Get(ctx, cl.image, img.ID).Extract()
	if err != nil || got.Status != images.ImageStatusActive || got.SizeBytes != int64(len(data)) || got.Properties["nodepool_upload_id"] != "debian.1.cloud.1" {
		t.Errorf("uploaded image: %+v, %v", got, err)
	}
	// A second upload is refused, as Glance does.
	err = imagedata.Upload(ctx, cl.image, img.ID, bytes.NewReader(data)).ExtractErr()
	if statusOf(err) != 409 || !strings.Contains(bodyOf(err), "<html>") {
		t.Errorf("second upload: %v", err)
	}
	// Listing by a property.
	pages, err := images.List(cl.image, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := images.ExtractImages(pages)
	if len(all) != 2 {
		t.Errorf("images: %d", len(all))
	}
	if err := images.Delete(ctx, cl.image, img.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := images.Delete(ctx, cl.image, img.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("deleting again: %v", err)
	}
	if len(srv.Images()) != 1 {
		t.Errorf("images left: %+v", srv.Images())
	}
}

func TestBadCredentials(t *testing.T) {
	t.Parallel()
	srv, err := devos.Start("127.0.0.1:0", devos.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = config.NewProviderClient(t.Context(), gophercloud.AuthOptions{IdentityEndpoint: srv.AuthURL(), Username: "demo",
		Password: "wrong", DomainName: "Default", TenantName: "demo"})
	if statusOf(err) != 401 {
		t.Errorf("wrong password: %v", err)
	}
	// Without a token, services answer 401.
	resp, err := http.Get(srv.URL + "/compute/v2.1/servers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("no token: %d", resp.StatusCode)
	}
}

// A server is stopped and started as Nova does it (task_state
// powering-off, then SHUTOFF; powering-on, then ACTIVE), refusing with 409
// what its state does not allow, and an administrator can reset it to
// error or active; each change shows in changes-since.
func TestServerStopStartAndResetState(t *testing.T) {
	t.Parallel()
	srv, cl := start(t, devos.Options{BootTime: 50 * time.Millisecond, PowerTime: 50 * time.Millisecond}, "dev")
	ctx := t.Context()
	s, err := servers.Create(ctx, cl.compute, servers.CreateOpts{Name: "stopper", ImageRef: srv.Images()[0].ID, FlavorRef: "1", Networks: "auto"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	conflict := func(what string, err error, want string) {
		t.Helper()
		if statusOf(err) != http.StatusConflict || !strings.Contains(bodyOf(err), want) || !strings.Contains(bodyOf(err), `"conflictingRequest"`) {
			t.Errorf("%s: %v (%s); want 409 saying %q", what, err, bodyOf(err), want)
		}
	}
	conflict("stop while building", servers.Stop(ctx, cl.compute, s.ID).ExtractErr(), "Cannot 'stop' instance "+s.ID+" while it is in task_state spawning")
	waitStatus(t, cl, s.ID, "ACTIVE")
	conflict("start while active", servers.Start(ctx, cl.compute, s.ID).ExtractErr(), "Cannot 'start' instance "+s.ID+" while it is in vm_state active")
	mark := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	if err := servers.Stop(ctx, cl.compute, s.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	conflict("stop while stopping", servers.Stop(ctx, cl.compute, s.ID).ExtractErr(), "while it is in task_state powering-off")
	got := waitStatus(t, cl, s.ID, "SHUTOFF")
	if got.PowerState != servers.SHUTDOWN || got.VmState != "stopped" || got.TaskState != "" {
		t.Errorf("stopped server: power %v, vm_state %q, task_state %q", got.PowerState, got.VmState, got.TaskState)
	}
	page, err := servers.List(cl.compute, servers.ListOpts{ChangesSince: mark}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if all, _ := servers.ExtractServers(page); len(all) != 1 || all[0].Status != "SHUTOFF" {
		t.Errorf("changes-since after the stop: %+v", all)
	}
	conflict("stop while stopped", servers.Stop(ctx, cl.compute, s.ID).ExtractErr(), "while it is in vm_state stopped")
	if err := servers.Start(ctx, cl.compute, s.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cl, s.ID, "ACTIVE")
	if err := servers.ResetState(ctx, cl.compute, s.ID, servers.StateError).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cl, s.ID, "ERROR")
	// An ERROR server can be stopped.
	if err := servers.Stop(ctx, cl.compute, s.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cl, s.ID, "SHUTOFF")
	if err := servers.ResetState(ctx, cl.compute, s.ID, servers.StateActive).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, cl, s.ID, "ACTIVE")
	err = servers.ResetState(ctx, cl.compute, s.ID, "paused").ExtractErr()
	if statusOf(err) != http.StatusBadRequest || !strings.Contains(bodyOf(err), "is not one of ['active', 'error']") {
		t.Errorf("reset to paused: %v (%s)", err, bodyOf(err))
	}
}

// The dev cloud's own API counts the calls and lists the servers with
// their times (what `nodepool bench cloud` reads), without a token and
// without counting itself.
func TestAdminStatsAndServers(t *testing.T) {
	t.Parallel()
	srv, cl := start(t, devos.Options{}, "dev")
	s, err := servers.Create(t.Context(), cl.compute, servers.CreateOpts{Name: "admin", ImageRef: srv.Images()[0].ID, FlavorRef: "1", Networks: "auto"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var stats struct {
		Calls          map[string]int `json:"calls"`
		RateLimited    int            `json:"rate_limited"`
		ServersCreated int            `json:"servers_created"`
	}
	get("/_devcloud/stats", &stats)
	if stats.Calls["compute"] == 0 || stats.Calls["identity"] == 0 || stats.ServersCreated != 1 {
		t.Errorf("stats: %+v", stats)
	}
	before := srv.Stats().Calls
	var list []struct {
		ID       string     `json:"id"`
		Name     string     `json:"name"`
		Status   string     `json:"status"`
		Created  time.Time  `json:"created"`
		Launched *time.Time `json:"launched"`
	}
	get("/_devcloud/servers", &list)
	if len(list) != 1 || list[0].ID != s.ID || list[0].Name != "admin" || list[0].Status != "ACTIVE" || list[0].Launched == nil || list[0].Created.IsZero() {
		t.Errorf("servers: %+v", list)
	}
	if after := srv.Stats().Calls; len(after) != len(before) || after["compute"] != before["compute"] || after["identity"] != before["identity"] {
		t.Errorf("the dev cloud's own API was counted: %v, then %v", before, after)
	}
	resp, err := http.Get(srv.URL + "/_devcloud/nosuch")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown endpoint: %s", resp.Status)
	}
}
