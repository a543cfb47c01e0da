package openstack

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/nodepool-nats/nodepool/drivers"
	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
)

// launchConfig has a cloud image label whose nodes are reached on port
// (an SSH server of the test), with every launch key set.
func launchConfig(port int) string {
	return fmt.Sprintf(`
labels: [{name: small}, {name: big}, {name: noscan}]
providers:
  - name: os
    cloud: dev
    rate: 0
    cloud-images:
      - name: cirros
        image-name: cirros-0.6.2-x86_64-disk
        username: cirros
        python-path: /usr/bin/python3
        connection-port: %d
        config-drive: true
    pools:
      - name: main
        availability-zones: [az1, az2]
        networks: [private]
        security-groups: [default, ci]
        labels:
          - name: small
            cloud-image: cirros
            flavor-name: m1.small
            key-name: zuul
            userdata: "#cloud-config\nruncmd: [true]"
            instance-properties: {team: ci}
            dynamic-instance-properties: {request_info: "for {request.id} of {request.requestor}"}
          - name: big
            cloud-image: cirros
            min-ram: 3000
            flavor-name: m1
          - name: noscan
            cloud-image: cirros
            flavor-name: m1.tiny
            host-key-checking: false
            console-log: true
`, port)
}

func TestLaunchAndDelete(t *testing.T) {
	t.Parallel()
	ssh := sshtest.Start(t, sshtest.Ed25519, sshtest.RSA)
	e := newEnv(t, launchConfig(ssh.Port), devos.Options{HostIP: "127.0.0.1"})
	p := e.provider()

	req := request("0000000001", "small", 1)
	req.Request = &drivers.RequestInfo{ID: "req-1", Requestor: "zuul-tenant"}
	sm, err := p.Create(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	step, err := advance(t, sm)
	if err != nil {
		t.Fatal(err)
	}
	inst := step.Instance
	srvs := e.cloud.Servers()
	if len(srvs) != 1 {
		t.Fatalf("servers: %+v", srvs)
	}
	s := srvs[0]
	if inst.ExternalID != s.ID || sm.ExternalID() != s.ID || s.Name != "np0000000001" || s.Flavor != "m1.small" {
		t.Errorf("instance %+v, server %+v", inst, s)
	}
	for k, v := range map[string]string{drivers.TagNode: "0000000001", drivers.TagProvider: "os", drivers.TagPool: "main",
		drivers.TagLabel: "small", TagAttempt: "1", "team": "ci", "request_info": "for req-1 of zuul-tenant"} {
		if s.Metadata[k] != v || inst.Tags[k] != v {
			t.Errorf("metadata %s = %q on the server, %q on the instance; want %q", k, s.Metadata[k], inst.Tags[k], v)
		}
	}
	if s.KeyName != "zuul" || !s.ConfigDrive || !slices.Equal(s.SecurityGroups, []string{"default", "ci"}) || !slices.Equal(s.Networks, []string{"private"}) {
		t.Errorf("server: %+v", s)
	}
	if ud, _ := base64.StdEncoding.DecodeString(s.UserData); string(ud) != "#cloud-config\nruncmd: [true]" {
		t.Errorf("userdata: %q", ud)
	}
	// Nodes of one request share a zone; the zone is one of the pool's.
	if s.AZ != "az1" && s.AZ != "az2" || inst.AZ != s.AZ {
		t.Errorf("availability zone %q (instance %q)", s.AZ, inst.AZ)
	}
	if got := chooseAZ(&drivers.CreateRequest{NodeID: "other", Request: req.Request}, []string{"az1", "az2"}); got != s.AZ {
		t.Errorf("another node of the request goes to %s, not %s", got, s.AZ)
	}
	// A floating IP (auto-floating-ip), the host keys of the SSH server it
	// leads to, and how to reach the node.
	fips := e.cloud.FloatingIPs()
	if len(fips) != 1 || fips[0].PortID == "" || !strings.Contains(fips[0].Description, "0000000001") {
		t.Errorf("floating IPs: %+v", fips)
	}
	if inst.InterfaceIP != "127.0.0.1" || inst.PublicIPv4 != "127.0.0.1" || inst.PrivateIPv4 != "127.0.0.1" {
		t.Errorf("addresses: %+v", inst)
	}
	if !slices.Equal(inst.HostKeys, ssh.HostKeys()) {
		t.Errorf("host keys %v, want %v", inst.HostKeys, ssh.HostKeys())
	}
	if inst.Username != "cirros" || inst.PythonPath != "/usr/bin/python3" || inst.ConnectionType != "ssh" || inst.ConnectionPort != ssh.Port {
		t.Errorf("connection: %+v", inst)
	}
	if r := inst.Resources; r.Instances != 1 || r.Cores != 1 || r.RAM != 2048 || r.Other != nil || inst.Region != "RegionOne" {
		t.Errorf("resources %+v, region %q", inst.Resources, inst.Region)
	}

	// ListInstances sees it, with its tags.
	insts, err := p.ListInstances(t.Context())
	if err != nil || len(insts) != 1 || insts[0].NodeID() != "0000000001" || insts[0].Resources.RAM != 2048 {
		t.Errorf("instances: %+v, %v", insts, err)
	}

	// The delete releases the floating IP and waits for the server to go.
	dm, err := p.Delete(inst.ExternalID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := advance(t, dm); err != nil {
		t.Fatal(err)
	}
	if n := len(e.cloud.Servers()) + len(e.cloud.FloatingIPs()) + len(e.cloud.Ports()); n != 0 {
		t.Errorf("left in the cloud: %+v %+v %+v", e.cloud.Servers(), e.cloud.FloatingIPs(), e.cloud.Ports())
	}
	// Deleting again is done at once.
	dm, _ = p.Delete(inst.ExternalID, nil)
	if _, err := advance(t, dm); err != nil {
		t.Errorf("deleting a gone server: %v", err)
	}
}

func TestFlavorsAndQuota(t *testing.T) {
	t.Parallel()
	q := devos.Quota{Instances: 7, Cores: 30, RAM: -1, Volumes: -1, Gigabytes: -1, FloatingIPs: -1}
	e := newEnv(t, launchConfig(22), devos.Options{Quota: &q})
	p := e.provider()
	for label, want := range map[string]drivers.Resources{
		"small":  {Instances: 1, Cores: 1, RAM: 2048},
		"big":    {Instances: 1, Cores: 2, RAM: 4096}, // the smallest m1 flavor with 3000 MiB or more
		"noscan": {Instances: 1, Cores: 1, RAM: 512},
	} {
		got, err := p.QuotaForLabel("main", label)
		if err != nil || got.Instances != want.Instances || got.Cores != want.Cores || got.RAM != want.RAM || got.Other != nil {
			t.Errorf("QuotaForLabel(%s) = %+v, %v; want %+v", label, got, err, want)
		}
	}
	lim, err := p.QuotaLimits(t.Context())
	if err != nil || lim.Instances != 7 || lim.Cores != 30 || lim.RAM != drivers.Unlimited {
		t.Errorf("QuotaLimits = %+v, %v", lim, err)
	}
}

func TestCloudErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{})
	p := e.provider()
	create := func(node string) (drivers.StateMachine, error) {
		sm, err := p.Create(request(node, "noscan", 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = advance(t, sm)
		return sm, err
	}
	// Nova's quota refusal: the launcher waits for room.
	e.cloud.FailNextCreates(1, 403, "")
	if _, err := create("q1"); !errors.Is(err, drivers.ErrQuotaExceeded) || !strings.Contains(err.Error(), "Quota exceeded for instances") {
		t.Errorf("403 quota: %v", err)
	}
	e.cloud.FailNextCreates(1, 413, "Quota exceeded for cores: Requested 8, but already used 16 of 20 cores")
	if _, err := create("q2"); !errors.Is(err, drivers.ErrQuotaExceeded) {
		t.Errorf("413 quota: %v", err)
	}
	// Rate limiting: 429 with how long to wait.
	e.cloud.FailNextCreates(1, 429, "")
	_, err := create("r1")
	if !errors.Is(err, drivers.ErrRateLimited) || drivers.RetryAfter(err) != time.Second {
		t.Errorf("429: %v (retry after %s)", err, drivers.RetryAfter(err))
	}
	// Any other failure fails the attempt.
	e.cloud.FailNextCreates(1, 500, "")
	if _, err := create("f1"); err == nil || errors.Is(err, drivers.ErrQuotaExceeded) || errors.Is(err, drivers.ErrCapacity) || !strings.Contains(err.Error(), "500") {
		t.Errorf("500: %v", err)
	}
	if n := len(e.cloud.Servers()); n != 0 {
		t.Errorf("%d servers after refused creates", n)
	}
	// No valid host: the server in ERROR is deleted and the create starts
	// over, after the launcher's wait.
	e.cloud.ErrorNextServers(1, devos.FaultNoValidHost)
	sm, err := create("c1")
	if !errors.Is(err, drivers.ErrCapacity) || !strings.Contains(err.Error(), "No valid host") {
		t.Errorf("no valid host: %v", err)
	}
	until(t, "the ERROR server is gone", func() bool { return len(e.cloud.Servers()) == 0 })
	if step, err := advance(t, sm); err != nil || !step.Done {
		t.Errorf("the create after no valid host: %v", err)
	}
	// A server that goes to ERROR for another reason fails the attempt,
	// and its fault says why.
	e.cloud.ErrorNextServers(1, "Build of instance aborted: Failure prepping block device.")
	sm, err = create("e1")
	if err == nil || errors.Is(err, drivers.ErrCapacity) || !strings.Contains(err.Error(), "Failure prepping block device") || sm.ExternalID() == "" {
		t.Errorf("ERROR server: %v", err)
	}
	// The launcher adds the console log of labels with console-log.
	d := p.Diagnose(t.Context(), request("e1", "noscan", 1), sm.ExternalID())
	if !strings.Contains(d, "console log of server") || !strings.Contains(d, "Kernel panic") {
		t.Errorf("diagnosis: %q", d)
	}
}

// A create resumed by another process goes on from its stored state; a
// resumed step whose create call's outcome is unknown finds what the call
// made instead of making a second one.
func TestResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{BootTime: 300 * time.Millisecond})
	first := e.provider()
	sm, err := first.Create(request("0000000007", "noscan", 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm, stepBoot)
	booting := sm.State()
	// The process dies before it records that it created the server: its
	// last stored state says the server is still to be made.
	var before createState
	before.Step, before.AZ = stepServer, sm.(*createMachine).st.AZ
	second := e.provider() // another process
	sm2, err := second.Create(request("0000000007", "noscan", 2), mustJSON(t, before))
	if err != nil {
		t.Fatal(err)
	}
	step, err := advance(t, sm2)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(e.cloud.Servers()); n != 1 || step.Instance.ExternalID != sm.ExternalID() {
		t.Errorf("%d servers; resumed create made %s, first %s", n, step.Instance.ExternalID, sm.ExternalID())
	}
	// Resuming from the booting state finds the same server ready.
	third := e.provider()
	sm3, err := third.Create(request("0000000007", "noscan", 2), booting)
	if err != nil {
		t.Fatal(err)
	}
	if step, err := advance(t, sm3); err != nil || step.Instance.ExternalID != sm.ExternalID() {
		t.Errorf("resumed from boot: %v", err)
	}
	// A delete resumed from its stored state finishes it.
	dm, _ := first.Delete(sm.ExternalID(), nil)
	advanceTo(t, dm, delWait)
	dm2, err := second.Delete(sm.ExternalID(), dm.State())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := advance(t, dm2); err != nil || len(e.cloud.Servers()) != 0 {
		t.Errorf("resumed delete: %v, %+v", err, e.cloud.Servers())
	}
	// Garbage in driver_data is an error, not a panic.
	if _, err := second.Create(request("x", "noscan", 1), []byte(`{"step": 5}`)); err == nil {
		t.Error("a state that is not a create's was taken")
	}
}

// A launch resumed while its server boots, when that server is gone (a
// process failed the attempt and deleted it, and died before recording
// that): the attempt fails at once as not found, and is not a call of
// unknown outcome made again until the boot timeout.
func TestResumedBootOfAVanishedServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{BootTime: time.Minute})
	first := e.provider()
	sm, err := first.Create(request("0000000008", "noscan", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm, stepBoot)
	booting := sm.State()
	dm, err := first.Delete(sm.ExternalID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := advance(t, dm); err != nil {
		t.Fatal(err)
	}
	sm2, err := e.provider().Create(request("0000000008", "noscan", 1), booting)
	if err != nil {
		t.Fatal(err)
	}
	_, err = advance(t, sm2)
	if !errors.Is(err, drivers.ErrNotFound) || errors.Is(err, drivers.ErrUncertain) {
		t.Fatalf("resumed boot of a deleted server: %v; want drivers.ErrNotFound, not drivers.ErrUncertain", err)
	}
}

func TestHostKeyCheckingAndScanFailures(t *testing.T) {
	t.Parallel()
	ssh := sshtest.Start(t, sshtest.Ed25519)
	ssh.SetMode(sshtest.Refusing)
	e := newEnv(t, launchConfig(ssh.Port), devos.Options{HostIP: "127.0.0.1"})
	p := e.provider()
	// host-key-checking false: no scan, no keys.
	sm, _ := p.Create(request("n1", "noscan", 1), nil)
	step, err := advance(t, sm)
	if err != nil || len(step.Instance.HostKeys) != 0 || ssh.Accepted() != 0 {
		t.Errorf("no scan: %+v, %v, %d connections", step.Instance, err, ssh.Accepted())
	}
	// A node whose SSH server refuses stays in the scan step (the
	// launcher's boot-timeout ends it), and the diagnosis says why.
	sm, _ = p.Create(request("n2", "small", 1), nil)
	advanceTo(t, sm, stepScan)
	for range 2 {
		st, err := sm.Advance(t.Context())
		if err != nil || st.Done {
			t.Fatalf("scan of a refusing host: %+v, %v", st, err)
		}
	}
	if d := p.Diagnose(t.Context(), request("n2", "small", 1), sm.ExternalID()); !strings.Contains(d, "host-key scan of 127.0.0.1") {
		t.Errorf("diagnosis: %q", d)
	}
	// Once it answers, the node is ready with its key.
	ssh.SetMode(sshtest.Up)
	step, err = advance(t, sm)
	if err != nil || !slices.Equal(step.Instance.HostKeys, ssh.HostKeys()) {
		t.Errorf("scan: %v, %v", step.Instance, err)
	}
}

// ListInstances lists every server, over pages, ours and others; with a
// nodepool-id, servers of another nodepool are not ours.
func TestListInstances(t *testing.T) {
	t.Parallel()
	cfg := strings.Replace(launchConfig(22), "    rate: 0\n", "    rate: 0\n    nodepool-id: prod\n", 1)
	e := newEnv(t, cfg, devos.Options{PageSize: 2})
	p := e.provider()
	for i := range 3 {
		sm, _ := p.Create(request(fmt.Sprintf("n%d", i), "noscan", 1), nil)
		if _, err := advance(t, sm); err != nil {
			t.Fatal(err)
		}
	}
	img := e.cloud.Images()[0].ID
	for name, md := range map[string]map[string]string{
		"someone-elses":  nil,
		"other-nodepool": {drivers.TagProvider: "os", drivers.TagNode: "zz", TagNodepoolID: "staging"},
	} {
		if _, err := servers.Create(t.Context(), e.compute(), servers.CreateOpts{Name: name, FlavorRef: "3", ImageRef: img, Networks: "auto", Metadata: md}, nil).Extract(); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "five instances listed", func() bool {
		insts, err := p.ListInstances(t.Context())
		return err == nil && len(insts) == 5
	})
	insts, _ := p.ListInstances(t.Context())
	ours := 0
	for _, inst := range insts {
		if inst.Tags[drivers.TagProvider] == "os" {
			ours++
			if inst.Tags[TagNodepoolID] != "prod" {
				t.Errorf("instance %s counted as ours: %v", inst.Name, inst.Tags)
			}
		}
		if inst.Name == "someone-elses" && inst.Resources.Cores != 2 {
			t.Errorf("another server's size: %+v", inst.Resources)
		}
	}
	if ours != 3 {
		t.Errorf("%d of ours, want 3", ours)
	}
}

// Every call to the cloud waits for the provider's limiter.
func TestPacing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{})
	p := e.provider()
	lim := &countingLimiter{}
	p.Pace(lim)
	before := p.Calls()
	sm, _ := p.Create(request("n1", "noscan", 1), nil)
	if _, err := advance(t, sm); err != nil {
		t.Fatal(err)
	}
	calls := p.Calls() - before
	if calls < 4 || lim.n.Load() != calls {
		t.Errorf("%d calls, %d waited for the limiter", calls, lim.n.Load())
	}
}

// The ports of a server are found through Neutron as the driver uses it.
func TestPortsOfServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{})
	p := e.provider()
	sm, _ := p.Create(request("n1", "noscan", 1), nil)
	if _, err := advance(t, sm); err != nil {
		t.Fatal(err)
	}
	pages, err := ports.List(e.clients().network, ports.ListOpts{DeviceID: sm.ExternalID()}).AllPages(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pl, _ := ports.ExtractPorts(pages)
	if len(pl) != 1 || pl[0].DeviceOwner != "compute:nova" && !strings.HasPrefix(pl[0].DeviceOwner, "compute:") {
		t.Errorf("ports: %+v", pl)
	}
}

// loseAnswer forwards a request and loses its answer, once, for the
// first request that matches.
type loseAnswer struct {
	base  http.RoundTripper
	match func(*http.Request) bool
	done  atomic.Bool
}

func (l *loseAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err == nil && l.match(r) && l.done.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

// A server create whose answer is lost may have made the server: the
// step is uncertain, and made again it finds that server (by the node's
// metadata) instead of making a second one.
func TestLostCreateAnswerIsUncertain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{})
	p := e.provider()
	p.transport.base = &loseAnswer{base: p.transport.base, match: func(r *http.Request) bool {
		return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/servers")
	}}
	sm, err := p.Create(request("0000000011", "noscan", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	var lost error
	for lost == nil {
		step, err := sm.Advance(t.Context())
		if step.Done {
			t.Fatal("launched without losing an answer")
		}
		lost = err
	}
	if !errors.Is(lost, drivers.ErrUncertain) {
		t.Fatalf("a lost answer: %v; want drivers.ErrUncertain", lost)
	}
	if n := len(e.cloud.Servers()); n != 1 {
		t.Fatalf("%d servers after the lost answer", n)
	}
	step, err := advance(t, sm)
	if err != nil {
		t.Fatal(err)
	}
	if all := e.cloud.Servers(); len(all) != 1 || step.Instance.ExternalID != all[0].ID {
		t.Fatalf("servers after the step was made again: %+v; launched %s", all, step.Instance.ExternalID)
	}
}

// Owns tells the server of a node from others by its metadata.
func TestOwns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, launchConfig(22), devos.Options{})
	p := e.provider()
	sm, err := p.Create(request("0000000012", "noscan", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	step, err := advance(t, sm)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id, node string
		owned    bool
		gone     bool
	}{
		{step.Instance.ExternalID, "0000000012", true, false},
		{step.Instance.ExternalID, "0000000013", false, false},
		{"00000000-0000-0000-0000-000000000000", "0000000012", false, true},
	} {
		owned, err := p.Owns(t.Context(), c.id, c.node)
		if owned != c.owned || errors.Is(err, drivers.ErrNotFound) != c.gone || (err != nil && !c.gone) {
			t.Errorf("Owns(%s, %s) = %v, %v; want %v (gone %v)", c.id, c.node, owned, err, c.owned, c.gone)
		}
	}
}
