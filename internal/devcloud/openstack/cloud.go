// Package openstack is an OpenStack cloud on loopback: Keystone v3, Nova,
// Glance v2, Neutron and Cinder v3 over their real REST APIs, with their
// status codes, error bodies, microversion headers and pagination, and a
// state that lives as long as the process. Servers boot (BUILD, then
// ACTIVE or ERROR with a fault) after a settable time; API latency, quota,
// rate limiting and injected failures are knobs, settable from Go and from
// the flags of `nodepool-devcloud openstack`. Tests, benchmarks and users
// who want to watch the real driver work without a cloud all use it; real
// clients (gophercloud, the openstack CLI) talk to it unchanged.
package openstack

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Defaults of a new cloud.
const (
	DefaultRegion   = "RegionOne"
	DefaultUser     = "demo"
	DefaultPassword = "secret"
	DefaultProject  = "demo"
	DefaultDomain   = "Default"
	// DefaultPageSize is Nova's osapi_max_limit: the most items one page
	// of a listing holds.
	DefaultPageSize = 1000
	// MaxMicroversion is the newest compute microversion served.
	MaxMicroversion = "2.96"
)

// Flavor is an instance size.
type Flavor struct {
	ID    string
	Name  string
	VCPUs int
	RAM   int // MiB
	Disk  int // GiB
}

// DefaultFlavors are DevStack's m1 flavors.
var DefaultFlavors = []Flavor{
	{ID: "1", Name: "m1.tiny", VCPUs: 1, RAM: 512, Disk: 1},
	{ID: "2", Name: "m1.small", VCPUs: 1, RAM: 2048, Disk: 20},
	{ID: "3", Name: "m1.medium", VCPUs: 2, RAM: 4096, Disk: 40},
	{ID: "4", Name: "m1.large", VCPUs: 4, RAM: 8192, Disk: 80},
	{ID: "5", Name: "m1.xlarge", VCPUs: 8, RAM: 16384, Disk: 160},
}

// Quota is the project's limits; a negative value is unlimited, as in
// OpenStack (-1).
type Quota struct {
	Instances   int
	Cores       int
	RAM         int // MiB
	Volumes     int
	Gigabytes   int
	FloatingIPs int
}

// DefaultQuota is OpenStack's default project quota.
var DefaultQuota = Quota{Instances: 10, Cores: 20, RAM: 51200, Volumes: 10, Gigabytes: 1000, FloatingIPs: 50}

// Options set up a cloud. Zero values take the defaults.
type Options struct {
	Region   string
	User     string
	Password string
	Project  string
	// AppCredentialID and AppCredentialSecret are an application
	// credential that authenticates as User in Project.
	AppCredentialID     string
	AppCredentialSecret string

	// Latency is added to every API call.
	Latency time.Duration
	// BootTime is how long a server stays in BUILD.
	BootTime time.Duration
	// DeleteTime is how long a deleted server stays visible (task_state
	// deleting) before it is gone.
	DeleteTime time.Duration
	// VolumeTime is how long a volume stays in creating or deleting.
	VolumeTime time.Duration
	// PowerTime is how long a server's stop or start (os-stop, os-start)
	// takes: task_state powering-off or powering-on, then SHUTOFF or
	// ACTIVE.
	PowerTime time.Duration
	// ErrorRate is the share of servers that go to ERROR instead of
	// ACTIVE (with a fault).
	ErrorRate float64
	// RateLimit refuses calls beyond this many per second from all clients
	// together with 429 and Retry-After (0: no limit).
	RateLimit float64
	// Quota is the project's quota; nil is DefaultQuota.
	Quota *Quota
	// Flavors; nil is DefaultFlavors.
	Flavors []Flavor
	// AvailabilityZones of compute and volumes; nil is ["nova"].
	AvailabilityZones []string
	// Images are cloud images present from the start (active, public);
	// nil is one: "cirros-0.6.2-x86_64-disk".
	Images []string
	// HostIP, if set, is the address every server gets, fixed and
	// floating (tests point it at SSH servers on 127.0.0.1); otherwise
	// addresses come from the networks' subnets.
	HostIP string
	// PageSize is the most items a page of a listing holds (Nova's
	// osapi_max_limit); 0 is DefaultPageSize.
	PageSize int
	// TokenTTL is the life of an issued token; 0 is one hour.
	TokenTTL time.Duration

	Log *slog.Logger
}

// Cloud is one OpenStack cloud. Its handler serves every service under one
// address: Keystone at /identity (and at the root), Nova at /compute,
// Glance at /image, Neutron at /network, Cinder at /volume.
type Cloud struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux

	mu sync.Mutex
	st *state
	// knobs changed at run time
	latency     time.Duration
	bootTime    time.Duration
	deleteTime  time.Duration
	volumeTime  time.Duration
	powerTime   time.Duration
	errorRate   float64
	rateLimit   float64
	quota       Quota
	failCreates []injectedFailure
	errorNext   []string
	hostIP      string
	pageSize    int

	// rate limiting window
	window      int64
	windowCalls int

	stats Stats
}

// injectedFailure is a create call that will fail.
type injectedFailure struct {
	status  int
	message string
}

// Stats counts what the cloud served.
type Stats struct {
	// Calls is every API call, by service ("identity", "compute",
	// "image", "network", "volume").
	Calls map[string]int
	// RateLimited counts calls refused with 429.
	RateLimited int
	// ServersCreated counts accepted server creates.
	ServersCreated int
}

// New makes a cloud; Handler serves it, Start listens for it.
func New(opts Options) *Cloud {
	if opts.Region == "" {
		opts.Region = DefaultRegion
	}
	if opts.User == "" {
		opts.User = DefaultUser
	}
	if opts.Password == "" {
		opts.Password = DefaultPassword
	}
	if opts.Project == "" {
		opts.Project = DefaultProject
	}
	if opts.Flavors == nil {
		opts.Flavors = DefaultFlavors
	}
	if len(opts.AvailabilityZones) == 0 {
		opts.AvailabilityZones = []string{"nova"}
	}
	if opts.Images == nil {
		opts.Images = []string{"cirros-0.6.2-x86_64-disk"}
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = time.Hour
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	q := DefaultQuota
	if opts.Quota != nil {
		q = *opts.Quota
	}
	c := &Cloud{opts: opts, log: opts.Log, quota: q}
	c.latency, c.bootTime, c.deleteTime, c.volumeTime = opts.Latency, opts.BootTime, opts.DeleteTime, opts.VolumeTime
	c.powerTime = opts.PowerTime
	c.errorRate, c.rateLimit, c.hostIP, c.pageSize = opts.ErrorRate, opts.RateLimit, opts.HostIP, opts.PageSize
	if c.pageSize <= 0 {
		c.pageSize = DefaultPageSize
	}
	c.st = newState(&c.opts)
	c.stats.Calls = map[string]int{}
	c.routes()
	return c
}

// Reset empties the cloud back to how New made it: no servers, volumes,
// ports, floating IPs or uploaded images, no injected failures; knobs
// keep their current values and issued tokens stay valid.
func (c *Cloud) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	tokens := c.st.tokens
	c.st = newState(&c.opts)
	c.st.tokens = tokens
	c.failCreates, c.errorNext = nil, nil
	c.stats = Stats{Calls: map[string]int{}}
}

// SetLatency sets the time added to every API call.
func (c *Cloud) SetLatency(d time.Duration) { c.set(func() { c.latency = d }) }

// SetBootTime sets how long new servers stay in BUILD.
func (c *Cloud) SetBootTime(d time.Duration) { c.set(func() { c.bootTime = d }) }

// SetDeleteTime sets how long deleted servers stay visible.
func (c *Cloud) SetDeleteTime(d time.Duration) { c.set(func() { c.deleteTime = d }) }

// SetPowerTime sets how long a server's stop or start takes.
func (c *Cloud) SetPowerTime(d time.Duration) { c.set(func() { c.powerTime = d }) }

// SetErrorRate sets the share of new servers that go to ERROR.
func (c *Cloud) SetErrorRate(r float64) { c.set(func() { c.errorRate = r }) }

// SetRateLimit sets the calls per second the cloud takes from all clients
// together (0: no limit).
func (c *Cloud) SetRateLimit(perSecond float64) { c.set(func() { c.rateLimit = perSecond }) }

// SetQuota sets the project's quota.
func (c *Cloud) SetQuota(q Quota) { c.set(func() { c.quota = q }) }

// SetHostIP sets the address new servers get (empty: from the subnets).
func (c *Cloud) SetHostIP(ip string) { c.set(func() { c.hostIP = ip }) }

// SetPageSize sets the most items a page of a listing holds.
func (c *Cloud) SetPageSize(n int) {
	c.set(func() {
		c.pageSize = n
		if n <= 0 {
			c.pageSize = DefaultPageSize
		}
	})
}

// FailNextCreates makes the next n server creates fail with an HTTP
// status and message, as Nova words them (403 with "Quota exceeded for
// instances: ...", 500, ...). An empty message takes Nova's usual one for
// the status.
func (c *Cloud) FailNextCreates(n, status int, message string) {
	c.set(func() {
		for range n {
			c.failCreates = append(c.failCreates, injectedFailure{status: status, message: message})
		}
	})
}

// FaultNoValidHost is the fault of a server the scheduler found no room
// for.
const FaultNoValidHost = "No valid host was found. There are not enough hosts available."

// ErrorNextServers makes the next n servers created go to ERROR when their
// boot ends, with fault as the fault's message (FaultNoValidHost, say).
func (c *Cloud) ErrorNextServers(n int, fault string) {
	c.set(func() {
		for range n {
			c.errorNext = append(c.errorNext, fault)
		}
	})
}

// Stats returns a copy of what the cloud counted.
func (c *Cloud) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Calls = map[string]int{}
	for k, v := range c.stats.Calls {
		s.Calls[k] = v
	}
	return s
}

func (c *Cloud) set(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
}

// Handler serves the cloud's APIs.
func (c *Cloud) Handler() http.Handler { return http.HandlerFunc(c.serve) }

// Server is a cloud listening on an address.
type Server struct {
	*Cloud
	// URL is the base address, such as http://127.0.0.1:5000.
	URL string
	srv *http.Server
	ln  net.Listener
}

// Start serves a cloud on addr (host:port; port 0 picks a free one).
func Start(addr string, opts Options) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev cloud: listening on %s: %w", addr, err)
	}
	c := New(opts)
	s := &Server{Cloud: c, URL: "http://" + ln.Addr().String(), ln: ln,
		srv: &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("dev cloud stopped serving", "err", err)
		}
	}()
	return s, nil
}

// AuthURL is the Keystone v3 address for clouds.yaml.
func (s *Server) AuthURL() string { return s.URL + "/identity/v3" }

// Close stops serving.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// CloudsYAML is a clouds.yaml with two entries for this cloud: name
// (password authentication) and name-appcred (the application
// credential, when the cloud has one).
func (s *Server) CloudsYAML(name string) string {
	o := s.opts
	var b strings.Builder
	fmt.Fprintf(&b, "clouds:\n  %s:\n    auth:\n      auth_url: %s\n      username: %s\n      password: %s\n      project_name: %s\n      user_domain_name: %s\n      project_domain_name: %s\n    region_name: %s\n    identity_api_version: 3\n",
		name, s.AuthURL(), o.User, o.Password, o.Project, DefaultDomain, DefaultDomain, o.Region)
	if o.AppCredentialID != "" {
		fmt.Fprintf(&b, "  %s-appcred:\n    auth_type: v3applicationcredential\n    auth:\n      auth_url: %s\n      application_credential_id: %s\n      application_credential_secret: %s\n    region_name: %s\n    identity_api_version: 3\n",
			name, s.AuthURL(), o.AppCredentialID, o.AppCredentialSecret, o.Region)
	}
	return b.String()
}

// WriteCloudsYAML writes CloudsYAML(name) to a file (readable by its owner
// only: it holds the password) and returns the file's path.
func (s *Server) WriteCloudsYAML(path, name string) (string, error) {
	if err := os.WriteFile(path, []byte(s.CloudsYAML(name)), 0o600); err != nil {
		return "", fmt.Errorf("writing clouds.yaml: %w", err)
	}
	return path, nil
}

// newID returns a random UUID (version 4), as OpenStack ids are.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}
