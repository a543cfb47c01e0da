// Package aws is an AWS on loopback: one HTTP listener that speaks EC2's
// Query protocol, Service Quotas' JSON protocol, the EBS direct API and S3
// (through gofakes3), faithfully enough that the real SDK and the aws CLI
// work against it. It is stateful (instances boot and terminate, images,
// snapshots, volumes, spot requests, fleets, dedicated hosts, import tasks)
// and has knobs for what a real cloud does to its clients: API latency,
// boot time, capacity errors per instance type, quotas, throttling and spot
// interruptions. Tests and `nodepool-devcloud aws` (which benchmarks run)
// use it.
//
// Requests are told apart by the service in their SigV4 signature's scope
// (ec2, servicequotas, ebs, s3), as an AWS endpoint does by host name; the
// signature itself is not checked, any credentials will do.
package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"golang.org/x/time/rate"
)

// Duration is a time.Duration written as "2s" in JSON.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("expected a duration such as \"2s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("expected a duration such as \"2s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

// Knobs are what a test or an operator may change while the cloud runs.
type Knobs struct {
	// APILatency is added to every call.
	APILatency Duration `json:"api_latency"`
	// BootTime is how long an instance stays pending before it runs.
	BootTime Duration `json:"boot_time"`
	// TerminateTime is how long an instance is shutting-down (or
	// stopping).
	TerminateTime Duration `json:"terminate_time"`
	// TerminatedRetention is how long a terminated instance stays listed.
	TerminatedRetention Duration `json:"terminated_retention"`
	// ImportTime is how long an import task, a new snapshot or a new
	// image takes to complete.
	ImportTime Duration `json:"import_time"`
	// SpotNotice is the warning a spot instance gets between its
	// interruption notice (marked-for-termination) and its termination.
	SpotNotice Duration `json:"spot_notice"`
	// RateLimit refuses calls beyond this many per second
	// (RequestLimitExceeded); 0: no limit.
	RateLimit float64 `json:"rate_limit"`
	// PageSize bounds every page of a Describe call, as AWS does for
	// large accounts, so that clients must follow NextToken.
	PageSize int `json:"page_size"`
	// InstanceAddress, if set, is every instance's private and public
	// IPv4 address (tests point it at SSH servers on 127.0.0.1).
	InstanceAddress string `json:"instance_address"`
	// Quotas are Service Quotas values by code, over the defaults: EC2's
	// vCPU quotas (awsquota.Quotas; DefaultQuotas sets them all), which
	// RunInstances and CreateFleet enforce, and any other quota served
	// (EBS storage in TiB, IOPS, dedicated hosts), which is reported only.
	Quotas map[string]float64 `json:"quotas"`
	// NoCapacity makes launches of an instance type fail with
	// InsufficientInstanceCapacity: the number of launches to refuse
	// (-1: all). Keys are instance types for on-demand launches and
	// "spot/<type>" for spot launches.
	NoCapacity map[string]int `json:"no_capacity"`
}

// Options configure a new cloud.
type Options struct {
	Region    string
	AccountID string
	Knobs     Knobs
	// InstanceTypes is the catalogue (default: DefaultInstanceTypes).
	InstanceTypes []InstanceType
	// Images are AMIs that exist from the start (default: DefaultImages).
	Images []SeedImage
	// Buckets are S3 buckets that exist from the start.
	Buckets []string
	Log     *slog.Logger
}

// DefaultKnobs are the knobs of a cloud whose options leave them out.
func DefaultKnobs() Knobs {
	return Knobs{
		BootTime:            Duration(2 * time.Second),
		TerminateTime:       Duration(time.Second),
		TerminatedRetention: Duration(time.Minute),
		ImportTime:          Duration(2 * time.Second),
		SpotNotice:          Duration(2 * time.Minute),
		PageSize:            1000,
		Quotas:              DefaultQuotas(),
		NoCapacity:          map[string]int{},
	}
}

// Cloud is the state of the AWS account and region it simulates.
type Cloud struct {
	region  string
	account string
	log     *slog.Logger
	s3      http.Handler
	s3back  gofakes3.Backend

	mu        sync.Mutex
	knobs     Knobs
	limiter   *rate.Limiter
	types     map[string]InstanceType
	instances map[string]*instance
	spot      map[string]*spotRequest
	volumes   map[string]*volume
	snapshots map[string]*snapshot
	images    map[string]*image
	imports   map[string]*importTask
	fleets    map[string]*fleet
	templates map[string]*launchTemplate
	hosts     map[string]*host
	tokens    map[string]string // client token -> id of what it made
	calls     map[string]int
	seq       int
}

// New makes a cloud.
func New(opts Options) *Cloud {
	if opts.Region == "" {
		opts.Region = "us-east-1"
	}
	if opts.AccountID == "" {
		opts.AccountID = "123456789012"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.InstanceTypes == nil {
		opts.InstanceTypes = DefaultInstanceTypes
	}
	if opts.Images == nil {
		opts.Images = DefaultImages
	}
	k := opts.Knobs
	d := DefaultKnobs()
	if k.PageSize <= 0 {
		k.PageSize = d.PageSize
	}
	if k.SpotNotice == 0 {
		k.SpotNotice = d.SpotNotice
	}
	if k.TerminatedRetention == 0 {
		k.TerminatedRetention = d.TerminatedRetention
	}
	if k.Quotas == nil {
		k.Quotas = d.Quotas
	}
	if k.NoCapacity == nil {
		k.NoCapacity = map[string]int{}
	}
	back := s3mem.New()
	c := &Cloud{
		region: opts.Region, account: opts.AccountID, log: opts.Log,
		s3back: back,
		knobs:  k, limiter: newLimiter(k.RateLimit),
		types:     map[string]InstanceType{},
		instances: map[string]*instance{}, spot: map[string]*spotRequest{},
		volumes: map[string]*volume{}, snapshots: map[string]*snapshot{},
		images: map[string]*image{}, imports: map[string]*importTask{},
		fleets: map[string]*fleet{}, templates: map[string]*launchTemplate{},
		hosts: map[string]*host{}, tokens: map[string]string{}, calls: map[string]int{},
	}
	c.s3 = gofakes3.New(back, gofakes3.WithoutVersioning(), gofakes3.WithLogger(gofakes3.DiscardLog())).Server()
	for _, b := range opts.Buckets {
		if err := back.CreateBucket(b); err != nil {
			c.log.Warn("could not create bucket", "bucket", b, "err", err)
		}
	}
	for _, t := range opts.InstanceTypes {
		c.types[t.Name] = t
	}
	now := time.Now()
	for _, si := range opts.Images {
		c.seedImage(si, now)
	}
	return c
}

func newLimiter(perSecond float64) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))
}

// Region is the region the cloud simulates.
func (c *Cloud) Region() string { return c.region }

// AccountID is the account that owns what clients create.
func (c *Cloud) AccountID() string { return c.account }

// Knobs returns the current knobs.
func (c *Cloud) Knobs() Knobs {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.knobs.clone()
}

// SetKnobs changes the knobs.
func (c *Cloud) SetKnobs(fn func(*Knobs)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.knobs.clone()
	fn(&k)
	if k.PageSize <= 0 {
		k.PageSize = 1000
	}
	if k.RateLimit != c.knobs.RateLimit {
		c.limiter = newLimiter(k.RateLimit)
	}
	c.knobs = k
}

func (k Knobs) clone() Knobs {
	c := k
	c.Quotas = make(map[string]float64, len(k.Quotas))
	for key, v := range k.Quotas {
		c.Quotas[key] = v
	}
	c.NoCapacity = make(map[string]int, len(k.NoCapacity))
	for key, v := range k.NoCapacity {
		c.NoCapacity[key] = v
	}
	return c
}

// Calls returns how many calls each action received (EC2 actions by name,
// "servicequotas.<Op>", "ebs.<Op>", "s3.<METHOD>"), and how many were
// refused for the rate limit ("throttled").
func (c *Cloud) Calls() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.calls))
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

// LiveInstances counts the instances that are not terminated.
func (c *Cloud) LiveInstances() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(time.Now())
	n := 0
	for _, in := range c.instances {
		if in.State != "terminated" {
			n++
		}
	}
	return n
}

// InstanceInfo is an instance as the cloud holds it.
type InstanceInfo struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	State string `json:"state"`
	// Launched is when RunInstances (or CreateFleet) made it; Running
	// when it went from pending to running (absent before).
	Launched time.Time  `json:"launched"`
	Running  *time.Time `json:"running,omitempty"`
}

// Instances lists the instances that are not terminated, oldest first.
func (c *Cloud) Instances() []InstanceInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.advance(now)
	out := []InstanceInfo{}
	for _, in := range c.instances {
		if in.State == "terminated" {
			continue
		}
		ii := InstanceInfo{ID: in.ID, Type: in.Type, State: in.State, Launched: in.LaunchTime}
		if in.State != "pending" && !in.RunningAt.IsZero() && !in.RunningAt.After(now) {
			t := in.RunningAt
			ii.Running = &t
		}
		out = append(out, ii)
	}
	slices.SortFunc(out, func(a, b InstanceInfo) int {
		if c := a.Launched.Compare(b.Launched); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// newID makes an id such as i-0123456789abcdef0.
func newID(prefix string) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 17)
	for i := range b {
		b[i] = hex[rand.IntN(16)]
	}
	return prefix + "-" + string(b)
}

func (c *Cloud) requestID() string {
	c.seq++
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rand.Uint32(), c.seq&0xffff, rand.IntN(4096), rand.IntN(4096), rand.Uint64()&0xffffffffffff)
}

// ServeHTTP routes a request to the service its signature names.
func (c *Cloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_devcloud/") {
		c.serveAdmin(w, r)
		return
	}
	if lat := c.Knobs().APILatency.D(); lat > 0 {
		t := time.NewTimer(lat)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	switch serviceOf(r) {
	case "ec2":
		c.serveEC2(w, r)
	case "servicequotas":
		c.serveQuotas(w, r)
	case "ebs":
		c.serveEBS(w, r)
	default:
		c.count("s3." + r.Method)
		c.s3.ServeHTTP(w, r)
	}
}

// serviceOf names the service a request is for: the one its SigV4
// credential scope names, or, for unsigned requests, what its shape says.
func serviceOf(r *http.Request) string {
	cred := r.URL.Query().Get("X-Amz-Credential")
	if auth := r.Header.Get("Authorization"); auth != "" {
		if _, rest, ok := strings.Cut(auth, "Credential="); ok {
			cred, _, _ = strings.Cut(rest, ",")
		}
	}
	if parts := strings.Split(cred, "/"); len(parts) == 5 {
		return parts[3]
	}
	switch {
	case strings.HasPrefix(r.Header.Get("X-Amz-Target"), "ServiceQuotasV20190624."):
		return "servicequotas"
	case r.Method == http.MethodPost && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") && r.URL.Path == "/":
		return "ec2"
	case strings.HasPrefix(r.URL.Path, "/snapshots"):
		return "ebs"
	}
	return "s3"
}

func (c *Cloud) count(action string) {
	c.mu.Lock()
	c.calls[action]++
	c.mu.Unlock()
}

// throttled takes a token of the rate limit; false means refuse the call.
func (c *Cloud) throttled() bool {
	c.mu.Lock()
	lim := c.limiter
	c.mu.Unlock()
	return lim != nil && !lim.Allow()
}

// Server is a cloud listening on an address.
type Server struct {
	Cloud *Cloud
	srv   *http.Server
	ln    net.Listener
	done  chan struct{}
}

// Listen starts serving a cloud on addr (host:port; port 0 picks one).
func Listen(addr string, c *Cloud) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev cloud cannot listen on %s: %w", addr, err)
	}
	s := &Server{Cloud: c, ln: ln, done: make(chan struct{}),
		srv: &http.Server{Handler: c, ReadHeaderTimeout: 30 * time.Second}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("dev cloud stopped serving", "err", err)
		}
	}()
	return s, nil
}

// URL is the endpoint URL clients use (http://host:port).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}
