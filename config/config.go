// Package config loads and validates nodepool.yaml (Nodepool's own schema,
// without the ZooKeeper keys) and reads the process settings from the
// environment.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Drivers lists the provider drivers this build knows.
var Drivers = []string{"openstack", "fake", "static", "metastatic"}

// DefaultDriver is the driver of a provider that names none, as in
// Nodepool.
const DefaultDriver = "openstack"

// Defaults applied to keys left out of nodepool.yaml.
const (
	DefaultLaunchRetries  = 3
	DefaultBootTimeout    = 60 * time.Second
	DefaultLaunchTimeout  = time.Hour
	DefaultMaxConcurrency = 0 // unlimited
	DefaultPoolPriority   = 100
)

// Config is a whole nodepool.yaml.
type Config struct {
	Labels    []Label    `yaml:"labels"`
	Providers []Provider `yaml:"providers"`
	// MaxHoldAge bounds how long a held node is kept (0: for ever).
	MaxHoldAge Duration `yaml:"max-hold-age"`
	// TenantResourceLimits caps what each tenant's nodes may hold, across
	// every provider.
	TenantResourceLimits []TenantLimit `yaml:"tenant-resource-limits"`

	// The image builder's keys (see diskimages.go).
	Diskimages        []Diskimage `yaml:"diskimages"`
	ElementsDir       string      `yaml:"elements-dir"`
	ImagesDir         string      `yaml:"images-dir"`
	BuildLogDir       string      `yaml:"build-log-dir"`
	BuildLogRetention *int        `yaml:"build-log-retention"`

	// File is the path the configuration was read from.
	File string `yaml:"-"`
}

// Label is an entry of the top-level `labels` list.
type Label struct {
	Name     string `yaml:"name" required:"true"`
	MinReady int    `yaml:"min-ready"`
	// MaxReadyAge deletes unallocated ready nodes older than this (0: keep).
	MaxReadyAge Duration `yaml:"max-ready-age"`
}

// TenantLimit is an entry of `tenant-resource-limits`; a zero limit is no
// limit.
type TenantLimit struct {
	TenantName string `yaml:"tenant-name" required:"true"`
	MaxServers int    `yaml:"max-servers"`
	MaxCores   int    `yaml:"max-cores"`
	MaxRAM     int    `yaml:"max-ram"`
}

// Provider is an entry of `providers`. Keys tagged with `drivers` exist only
// for those drivers.
type Provider struct {
	Name string `yaml:"name" required:"true"`
	// Driver is left out for openstack, as in Nodepool.
	Driver         string   `yaml:"driver"`
	LaunchRetries  int      `yaml:"launch-retries"`
	BootTimeout    Duration `yaml:"boot-timeout"`
	LaunchTimeout  Duration `yaml:"launch-timeout"`
	MaxConcurrency int      `yaml:"max-concurrency"`
	// Rate is the most API calls per second to the provider, all
	// launcher processes together (0: no limit). OpenStack's `rate` means
	// seconds between calls, as in Nodepool: its driver has a key of its
	// own (OpenStackProvider.RateSeconds), converted into this one.
	Rate  float64 `yaml:"rate" notdrivers:"openstack"`
	Pools []Pool  `yaml:"pools"`

	// Cloud names the cloud: an entry of clouds.yaml for openstack, the
	// simulated cloud for fake.
	Cloud string `yaml:"cloud" drivers:"fake,openstack"`

	// The fake driver's simulated cloud.
	BootDelay   Duration `yaml:"boot-delay" drivers:"fake"`
	DeleteDelay Duration `yaml:"delete-delay" drivers:"fake"`
	APIDelay    Duration `yaml:"api-delay" drivers:"fake"`
	FailureRate float64  `yaml:"failure-rate" drivers:"fake"`
	// APIRateLimit makes the simulated cloud refuse calls beyond this many
	// per second from all clients together (0: no limit).
	APIRateLimit float64      `yaml:"api-rate-limit" drivers:"fake"`
	Quota        *CloudQuota  `yaml:"quota" drivers:"fake"`
	Flavors      []FakeFlavor `yaml:"flavors" drivers:"fake"`

	// Images uploaded to this provider (drivers with images only).
	Diskimages []ProviderDiskimage `yaml:"diskimages" drivers:"fake,openstack"`
	// The fake cloud's image service: the format it takes, how long an
	// upload takes, the share of uploads that fail.
	ImageFormat       string   `yaml:"image-format" drivers:"fake"`
	UploadDelay       Duration `yaml:"upload-delay" drivers:"fake"`
	UploadFailureRate float64  `yaml:"upload-failure-rate" drivers:"fake"`

	// The openstack driver's keys (openstack.go).
	OpenStackProvider `yaml:",inline"`
}

// CloudQuota is a simulated cloud's limits; zero means unlimited.
type CloudQuota struct {
	Instances int `yaml:"instances"`
	Cores     int `yaml:"cores"`
	RAM       int `yaml:"ram"`
}

// FakeFlavor is an instance size of the fake cloud.
type FakeFlavor struct {
	Name  string `yaml:"name" required:"true"`
	Cores int    `yaml:"cores"`
	RAM   int    `yaml:"ram"`
}

// Pool is an entry of a provider's `pools`.
type Pool struct {
	Name       string      `yaml:"name" required:"true"`
	MaxServers int         `yaml:"max-servers" notdrivers:"static"`
	MaxCores   int         `yaml:"max-cores" notdrivers:"static"`
	MaxRAM     int         `yaml:"max-ram" notdrivers:"static"`
	Priority   int         `yaml:"priority"`
	Labels     []PoolLabel `yaml:"labels" notdrivers:"static"`

	// Nodes are a static pool's hosts; the pool's Labels are derived from
	// them (see drivers.go).
	Nodes []StaticNode `yaml:"nodes" drivers:"static"`

	// The openstack driver's pool keys (openstack.go).
	OpenStackPool `yaml:",inline"`

	// maxServersSet tells an explicit `max-servers: 0` from an absent key.
	maxServersSet bool
}

// PoolLabel is an entry of a pool's `labels`: a label this pool can boot and
// how. A plain string is accepted as shorthand for `{name: ...}`.
type PoolLabel struct {
	Name       string `yaml:"name" required:"true"`
	FlavorName string `yaml:"flavor-name" drivers:"fake,openstack"`
	CloudImage string `yaml:"cloud-image" drivers:"fake,openstack"`
	// Diskimage names an image of the provider's diskimages to boot from.
	Diskimage string `yaml:"diskimage" drivers:"fake,openstack"`

	// An openstack label's keys (openstack.go).
	OpenStackLabel `yaml:",inline"`

	// A metastatic label's backing nodes (see drivers.go).
	MetastaticLabel `yaml:",inline"`
}

// Unlimited is what MaxServers holds when a pool sets no limit.
const Unlimited = int(^uint(0) >> 1)

func (p *Provider) decodeYAML(d *decoder, path string, n *yaml.Node) {
	d.driver = DefaultDriver
	if dn := mappingValue(n, "driver"); dn != nil && dn.Kind == yaml.ScalarNode && !isNull(dn) {
		d.driver = dn.Value
	}
	defer func() { d.driver = "" }()
	d.decodeStruct(path, n, []reflect.Value{reflect.ValueOf(p).Elem()})
	if p.Driver == "" {
		p.Driver = DefaultDriver
	}
	p.OpenStackProvider.noteSet(n)
	if p.Driver != "" && !slices.Contains(Drivers, p.Driver) {
		d.fail(joinPath(path, "driver"), mappingValue(n, "driver"), "unknown driver %q; expected one of: %s", p.Driver, strings.Join(Drivers, ", "))
	}
}

func (p *Pool) decodeYAML(d *decoder, path string, n *yaml.Node) {
	d.decodeStruct(path, n, []reflect.Value{reflect.ValueOf(p).Elem()})
	p.maxServersSet = mappingValue(n, "max-servers") != nil && !isNull(mappingValue(n, "max-servers"))
}

func (l *PoolLabel) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		l.Name = n.Value
		return
	}
	d.decodeStruct(path, n, []reflect.Value{reflect.ValueOf(l).Elem()})
	l.MetastaticLabel.noteSet(n)
}

// removedKeys are Nodepool keys whose job the process settings took over.
var removedKeys = map[string]string{
	"zookeeper-servers": "NATS replaces ZooKeeper: set NODEPOOL_NATS_URL instead",
	"zookeeper-tls":     "NATS replaces ZooKeeper: set NODEPOOL_NATS_TLS_CA, NODEPOOL_NATS_TLS_CERT and NODEPOOL_NATS_TLS_KEY instead",
	"zookeeper-timeout": "NATS replaces ZooKeeper; there is no session timeout to set",
}

// Load reads, decodes and validates a nodepool.yaml. Every problem found is
// returned together, as Errors.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading configuration: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates the text of a nodepool.yaml; file names it in
// messages.
func Parse(file string, data []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, Errors{{File: file, Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	if len(doc.Content) == 0 {
		return nil, Errors{{File: file, Msg: "the file is empty; expected a mapping with labels and providers"}}
	}
	root := doc.Content[0]
	d := &decoder{file: file}
	cfg := &Config{File: file}
	if root.Kind == yaml.MappingNode {
		// Take out the ZooKeeper keys with a message of their own.
		kept := &yaml.Node{Kind: yaml.MappingNode, Line: root.Line}
		for i := 0; i+1 < len(root.Content); i += 2 {
			if why, ok := removedKeys[root.Content[i].Value]; ok {
				d.fail(root.Content[i].Value, root.Content[i], "%s", why)
				continue
			}
			kept.Content = append(kept.Content, root.Content[i], root.Content[i+1])
		}
		root = kept
	}
	d.decodeStruct("", root, []reflect.Value{reflect.ValueOf(cfg).Elem()})
	if len(d.errs) == 0 {
		cfg.resolveDiskimages(d, root)
	}
	if len(d.errs) == 0 {
		cfg.applyDefaults()
		cfg.applyImageDefaults()
		cfg.validate(d, root)
		cfg.validateImages(d, root)
		cfg.deriveStaticLabels()
	}
	if len(d.errs) > 0 {
		return nil, d.errs
	}
	return cfg, nil
}

func (c *Config) applyDefaults() {
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.LaunchRetries == 0 {
			p.LaunchRetries = DefaultLaunchRetries
		}
		if p.BootTimeout == 0 {
			p.BootTimeout = Duration(DefaultBootTimeout)
		}
		if p.LaunchTimeout == 0 {
			p.LaunchTimeout = Duration(DefaultLaunchTimeout)
		}
		if p.Driver == "fake" && p.Cloud == "" {
			p.Cloud = p.Name
		}
		if p.Driver == "openstack" {
			p.applyOpenStackDefaults()
		}
		for j := range p.Pools {
			pool := &p.Pools[j]
			if !pool.maxServersSet {
				pool.MaxServers = Unlimited
			}
			if pool.Priority == 0 {
				pool.Priority = DefaultPoolPriority
			}
			pool.applyDriverDefaults(p.Driver)
		}
	}
}

// nameRE is what provider and pool names may hold: they become parts of
// lease keys and subjects.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// labelRE is what label names may hold: they travel in request messages and
// subjects.
var labelRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// validate checks what the types alone cannot: names, references between
// sections, ranges. root is used to point at lines.
func (c *Config) validate(d *decoder, root *yaml.Node) {
	line := func(path ...any) *yaml.Node { return nodeAt(root, path...) }
	labels := map[string]int{}
	for i, l := range c.Labels {
		path := indexPath("labels", i)
		if !labelRE.MatchString(l.Name) || len(l.Name) > 128 {
			d.fail(path+".name", line("labels", i, "name"), "label name %q is not valid; expected 1 to 128 of A-Z a-z 0-9 _ - and inner dots", l.Name)
		}
		if prev, dup := labels[l.Name]; dup {
			d.fail(path+".name", line("labels", i, "name"), "label %q is defined twice (also labels[%d])", l.Name, prev)
		}
		labels[l.Name] = i
		if l.MinReady < 0 {
			d.fail(path+".min-ready", line("labels", i, "min-ready"), "expected 0 or more, got %d", l.MinReady)
		}
	}
	provided := map[string]bool{}
	providers := map[string]int{}
	staticHosts := map[string]string{} // static host identity -> path of its first entry
	for i, p := range c.Providers {
		path := indexPath("providers", i)
		at := func(rest ...any) *yaml.Node { return line(append([]any{"providers", i}, rest...)...) }
		if !nameRE.MatchString(p.Name) {
			d.fail(path+".name", at("name"), "provider name %q is not valid; expected 1 to 64 of A-Z a-z 0-9 _ -", p.Name)
		}
		if prev, dup := providers[p.Name]; dup {
			d.fail(path+".name", at("name"), "provider %q is defined twice (also providers[%d])", p.Name, prev)
		}
		providers[p.Name] = i
		if p.LaunchRetries < 1 {
			d.fail(path+".launch-retries", at("launch-retries"), "expected 1 or more, got %d", p.LaunchRetries)
		}
		if p.MaxConcurrency < 0 {
			d.fail(path+".max-concurrency", at("max-concurrency"), "expected 0 (unlimited) or more, got %d", p.MaxConcurrency)
		}
		if p.Rate < 0 {
			d.fail(path+".rate", at("rate"), "expected 0 (no limit) or more calls per second, got %g", p.Rate)
		}
		if p.APIRateLimit < 0 {
			d.fail(path+".api-rate-limit", at("api-rate-limit"), "expected 0 (no limit) or more calls per second, got %g", p.APIRateLimit)
		}
		if p.FailureRate < 0 || p.FailureRate > 1 {
			d.fail(path+".failure-rate", at("failure-rate"), "expected a number from 0 to 1, got %g", p.FailureRate)
		}
		flavors := map[string]bool{}
		for j, f := range p.Flavors {
			if flavors[f.Name] {
				d.fail(indexPath(path+".flavors", j)+".name", at("flavors", j, "name"), "flavor %q is defined twice", f.Name)
			}
			flavors[f.Name] = true
			if f.Cores < 0 || f.RAM < 0 {
				d.fail(indexPath(path+".flavors", j), at("flavors", j), "cores and ram must be 0 or more")
			}
		}
		if len(p.Pools) == 0 {
			d.fail(path, at(), "missing required key \"pools\"; a provider needs at least one pool")
		}
		pools := map[string]int{}
		for j, pool := range p.Pools {
			ppath := indexPath(path+".pools", j)
			pat := func(rest ...any) *yaml.Node { return at(append([]any{"pools", j}, rest...)...) }
			if !nameRE.MatchString(pool.Name) {
				d.fail(ppath+".name", pat("name"), "pool name %q is not valid; expected 1 to 64 of A-Z a-z 0-9 _ -", pool.Name)
			}
			if prev, dup := pools[pool.Name]; dup {
				d.fail(ppath+".name", pat("name"), "pool %q is defined twice in provider %q (also pools[%d])", pool.Name, p.Name, prev)
			}
			pools[pool.Name] = j
			if pool.MaxServers < 0 {
				d.fail(ppath+".max-servers", pat("max-servers"), "expected 0 or more, got %d", pool.MaxServers)
			}
			if pool.MaxCores < 0 || pool.MaxRAM < 0 {
				d.fail(ppath, pat(), "max-cores and max-ram must be 0 (no limit) or more")
			}
			if pool.Priority < 0 {
				d.fail(ppath+".priority", pat("priority"), "expected 0 or more, got %d", pool.Priority)
			}
			seen := map[string]bool{}
			for k, pl := range pool.Labels {
				lpath := indexPath(ppath+".labels", k)
				if _, ok := labels[pl.Name]; !ok {
					d.fail(lpath, pat("labels", k), "label %q is not defined; expected one of the names under the top-level labels (%s)", pl.Name, strings.Join(c.LabelNames(), ", "))
				}
				if seen[pl.Name] {
					d.fail(lpath, pat("labels", k), "label %q is listed twice in this pool", pl.Name)
				}
				seen[pl.Name] = true
				provided[pl.Name] = true
				if p.Driver == "fake" && pl.FlavorName != "" && !flavors[pl.FlavorName] {
					d.fail(lpath+".flavor-name", pat("labels", k, "flavor-name"), "flavor %q is not defined in this provider's flavors", pl.FlavorName)
				}
			}
			if p.Driver == "static" {
				c.validateStaticPool(d, ppath, pat, &pool, labels, provided, staticHosts)
			}
		}
		if p.Driver == "openstack" {
			c.validateOpenStack(d, i, at)
		}
	}
	c.validateMetastatic(d, line)
	tenants := map[string]bool{}
	for i, tl := range c.TenantResourceLimits {
		path := indexPath("tenant-resource-limits", i)
		if tenants[tl.TenantName] {
			d.fail(path+".tenant-name", line("tenant-resource-limits", i, "tenant-name"), "tenant %q is listed twice", tl.TenantName)
		}
		tenants[tl.TenantName] = true
		if tl.MaxServers < 0 || tl.MaxCores < 0 || tl.MaxRAM < 0 {
			d.fail(path, line("tenant-resource-limits", i), "limits must be 0 (no limit) or more")
		}
	}
	for i, l := range c.Labels {
		if !provided[l.Name] {
			d.fail(indexPath("labels", i)+".name", line("labels", i, "name"), "label %q is not provided by any pool; add it to a pool's labels or remove it", l.Name)
		}
	}
}

// nodeAt finds the node at a path of keys (string) and indexes (int), for
// line numbers; it returns nil when the path is not there.
func nodeAt(n *yaml.Node, path ...any) *yaml.Node {
	for _, p := range path {
		n = resolveAlias(n)
		if n == nil {
			return nil
		}
		switch p := p.(type) {
		case string:
			n = mappingValue(n, p)
		case int:
			if n.Kind != yaml.SequenceNode || p >= len(n.Content) {
				return nil
			}
			n = n.Content[p]
		}
	}
	return n
}

// LabelNames lists the defined labels, in file order.
func (c *Config) LabelNames() []string {
	names := make([]string, len(c.Labels))
	for i, l := range c.Labels {
		names[i] = l.Name
	}
	return names
}

// Label returns the label of that name.
func (c *Config) Label(name string) (Label, bool) {
	for _, l := range c.Labels {
		if l.Name == name {
			return l, true
		}
	}
	return Label{}, false
}

// Provider returns the provider of that name.
func (c *Config) Provider(name string) (*Provider, bool) {
	for i := range c.Providers {
		if c.Providers[i].Name == name {
			return &c.Providers[i], true
		}
	}
	return nil, false
}

// Pool returns the pool of that name.
func (p *Provider) Pool(name string) (*Pool, bool) {
	for i := range p.Pools {
		if p.Pools[i].Name == name {
			return &p.Pools[i], true
		}
	}
	return nil, false
}

// Label returns the pool's entry for a label.
func (p *Pool) Label(name string) (PoolLabel, bool) {
	for _, l := range p.Labels {
		if l.Name == name {
			return l, true
		}
	}
	return PoolLabel{}, false
}

// Flavor returns the fake flavor of that name.
func (p *Provider) Flavor(name string) (FakeFlavor, bool) {
	for _, f := range p.Flavors {
		if f.Name == name {
			return f, true
		}
	}
	return FakeFlavor{}, false
}

// IsErrors reports whether err holds configuration problems (as opposed to,
// say, a file that could not be read).
func IsErrors(err error) bool {
	var es Errors
	return errors.As(err, &es)
}

// TenantLimit returns the limits of a tenant, if it has any.
func (c *Config) TenantLimit(tenant string) (TenantLimit, bool) {
	for _, tl := range c.TenantResourceLimits {
		if tl.TenantName == tenant {
			return tl, true
		}
	}
	return TenantLimit{}, false
}
