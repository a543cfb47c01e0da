// Package config loads and validates nodepool.yaml (Nodepool's own schema)
// and reads the process settings from the environment.
package config

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults applied to keys left out of nodepool.yaml, as in Nodepool.
const (
	DefaultLaunchRetries  = 3
	DefaultBootTimeout    = 60 * time.Second
	DefaultLaunchTimeout  = time.Hour
	DefaultMaxConcurrency = 0 // unlimited
	DefaultPriority       = 100
	DefaultWebappPort     = 8005
	DefaultWebappListen   = "0.0.0.0"
)

// DefaultPoolPriority is the priority of a pool when neither it nor its
// provider sets one.
const DefaultPoolPriority = DefaultPriority

// Unlimited is what a limit (max-servers, max-cores, max-ram, a tenant's
// limits) holds when the file does not set it. A limit written as 0 is a
// limit of zero, as in Nodepool.
const Unlimited = int(^uint(0) >> 1)

// Config is a whole nodepool.yaml.
type Config struct {
	// Webapp is Nodepool's status server section; nil when absent.
	Webapp    *Webapp    `yaml:"webapp"`
	Labels    []Label    `yaml:"labels"`
	Providers []Provider `yaml:"providers"`
	// MaxHoldAge bounds how long a held node is kept (0: for ever).
	MaxHoldAge Age `yaml:"max-hold-age"`
	// TenantResourceLimits caps what each tenant's nodes may hold, across
	// every provider.
	TenantResourceLimits []TenantLimit `yaml:"tenant-resource-limits"`

	// The image builder's keys (see diskimages.go).
	Diskimages        []Diskimage `yaml:"diskimages"`
	ElementsDir       string      `yaml:"elements-dir"`
	ImagesDir         string      `yaml:"images-dir"`
	BuildLogDir       string      `yaml:"build-log-dir"`
	BuildLogRetention *int        `yaml:"build-log-retention"`

	// Zuul's ZooKeeper (zookeeper.go): when zookeeper-servers is given,
	// the zookeeper role serves Zuul there as a Nodepool launcher.
	ZooKeeperServers []ZooKeeperServer `yaml:"zookeeper-servers"`
	ZooKeeperTLS     *ZooKeeperTLS     `yaml:"zookeeper-tls"`
	ZooKeeperTimeout ZooKeeperTimeout  `yaml:"zookeeper-timeout"`

	// File is the path the configuration was read from; SecureFile the
	// secure file merged over it ("" if none).
	File       string `yaml:"-"`
	SecureFile string `yaml:"-"`
	// Warnings are what Nodepool tolerates but is likely a mistake (a
	// label no pool of this file provides, a key given twice): the file
	// loads, and `nodepool config-validate` and `nodepool run` say so.
	Warnings Errors `yaml:"-"`
}

// Webapp is the `webapp` section: where Nodepool's status server listens.
// Here it sets the status API's address when NODEPOOL_HTTP_ADDR is unset.
type Webapp struct {
	Port          int    `yaml:"port"`
	ListenAddress string `yaml:"listen_address"`
}

func (w *Webapp) decodeYAML(d *decoder, path string, n *yaml.Node) {
	set := d.decodeStruct(path, n, reflect.ValueOf(w).Elem())
	if !set["port"] {
		w.Port = DefaultWebappPort
	}
	if !set["listen_address"] {
		w.ListenAddress = DefaultWebappListen
	}
}

// Addr is the address to listen on, host:port.
func (w *Webapp) Addr() string {
	return net.JoinHostPort(w.ListenAddress, strconv.Itoa(w.Port))
}

// Label is an entry of the top-level `labels` list.
type Label struct {
	Name string `yaml:"name" required:"true"`
	// MinReady is how many unallocated ready nodes to keep; -1 (any
	// negative number) disables the label: no node of it is created.
	MinReady int `yaml:"min-ready"`
	// MaxReadyAge deletes unallocated ready nodes older than this (0: keep).
	MaxReadyAge Age `yaml:"max-ready-age"`
}

// Disabled reports whether the label is disabled (min-ready below 0): no
// node of it is created, for min-ready or for requests.
func (l *Label) Disabled() bool { return l.MinReady < 0 }

// TenantLimit is an entry of `tenant-resource-limits`. A limit the entry
// does not set is Unlimited; 0 is a limit of zero.
type TenantLimit struct {
	TenantName string `yaml:"tenant-name"`
	MaxServers int    `yaml:"max-servers"`
	MaxCores   int    `yaml:"max-cores"`
	MaxRAM     int    `yaml:"max-ram"`
	// Resources are the entry's other limits by key: max-volumes,
	// max-volume-gb and driver-specific ones (AWS quota codes such as
	// L-43DA4232), which Nodepool reads as max-resources.
	Resources map[string]int `yaml:",inline"`
}

func (tl *TenantLimit) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping with tenant-name and limits, got %s", describe(n))
		return
	}
	tl.MaxServers, tl.MaxCores, tl.MaxRAM = Unlimited, Unlimited, Unlimited
	named := false
	for _, p := range d.pairs(path, n) {
		key, v := p.key.Value, resolveAlias(p.val)
		kpath := joinPath(path, key)
		if p.key.Kind != yaml.ScalarNode {
			d.fail(path, p.key, "expected a plain key, got %s", describe(p.key))
			continue
		}
		if key == "tenant-name" {
			named = true
			if v != nil && !isNull(v) {
				d.decodeString(kpath, v, reflect.ValueOf(&tl.TenantName).Elem(), false)
			}
			continue
		}
		if v == nil || isNull(v) {
			continue
		}
		i, ok := d.integer(kpath, v)
		if !ok {
			continue
		}
		switch key {
		case "max-servers":
			tl.MaxServers = int(i)
		case "max-cores":
			tl.MaxCores = int(i)
		case "max-ram":
			tl.MaxRAM = int(i)
		default:
			if tl.Resources == nil {
				tl.Resources = map[string]int{}
			}
			tl.Resources[key] = int(i)
		}
	}
	if !named {
		d.fail(path, n, "missing required key %q", "tenant-name")
	}
}

// Provider is an entry of `providers`. Keys tagged with `drivers` exist only
// for those drivers; the keys of one driver alone live in a struct of
// config/<driver>.go embedded here (see drivers.go for the convention).
type Provider struct {
	Name string `yaml:"name" required:"true"`
	// Driver is the driver's name; "openstack" when the file has none, as
	// in Nodepool.
	Driver         string `yaml:"driver"`
	MaxConcurrency int    `yaml:"max-concurrency"`
	// Priority is the default of the pools' priority (lower is served
	// first).
	Priority int `yaml:"priority"`

	// Launch keys of the drivers that launch instances. The defaults
	// depend on the driver (see drivers.go).
	LaunchRetries int      `yaml:"launch-retries" drivers:"fake,metastatic,openstack,aws,kubernetes"`
	BootTimeout   Duration `yaml:"boot-timeout" drivers:"fake,metastatic,openstack,aws"`
	LaunchTimeout Duration `yaml:"launch-timeout" drivers:"fake,metastatic,openstack,aws"`
	// Rate is the most API calls per second to the provider, all
	// launcher processes together (0: no limit). Every driver has it here
	// (Nodepool's static and metastatic do not); OpenStack's `rate` means
	// seconds between calls, so its driver has a key of its own and
	// converts it into this.
	Rate float64 `yaml:"rate" notdrivers:"openstack"`
	// Cloud names the cloud (the fake's simulated cloud, OpenStack's
	// clouds.yaml entry); nodes record it.
	Cloud string `yaml:"cloud" drivers:"fake,openstack"`

	Pools []Pool `yaml:"pools"`
	// Images uploaded to this provider (drivers with images only).
	Diskimages []ProviderDiskimage `yaml:"diskimages" drivers:"fake,openstack,aws"`

	FakeProvider       `yaml:",inline"`
	OpenStackProvider  `yaml:",inline"`
	AWSProvider        `yaml:",inline"`
	KubernetesProvider `yaml:",inline"`

	// set holds the keys written in the file.
	set map[string]bool
}

// Pool is an entry of a provider's `pools`.
type Pool struct {
	Name string `yaml:"name" required:"true"`
	// Priority: lower is served first; 0 is the best. Defaults to the
	// provider's priority.
	Priority int `yaml:"priority"`
	// MaxServers is Unlimited when absent; 0 or less disables the pool
	// (it takes no request), as Nodepool documents for removing a
	// provider from the launcher.
	MaxServers int `yaml:"max-servers"`
	MaxCores   int `yaml:"max-cores" drivers:"fake,openstack,aws,kubernetes"`
	MaxRAM     int `yaml:"max-ram" drivers:"fake,openstack,aws,kubernetes"`
	// NodeAttributes are stored in the `attributes` of every node of the
	// pool.
	NodeAttributes Attributes  `yaml:"node-attributes"`
	Labels         []PoolLabel `yaml:"labels" notdrivers:"static"`

	StaticPool     `yaml:",inline"`
	MetastaticPool `yaml:",inline"`
	OpenStackPool  `yaml:",inline"`
	AWSPool        `yaml:",inline"`
	KubernetesPool `yaml:",inline"`

	set map[string]bool
}

// Disabled reports whether the pool takes no requests (max-servers 0 or
// less).
func (p *Pool) Disabled() bool { return p.MaxServers <= 0 }

// PoolLabel is an entry of a pool's `labels`: a label this pool can boot and
// how. A plain string is accepted as shorthand for `{name: ...}`.
type PoolLabel struct {
	Name       string `yaml:"name" required:"true"`
	FlavorName string `yaml:"flavor-name" drivers:"fake,openstack"`
	CloudImage string `yaml:"cloud-image" drivers:"fake,openstack,aws"`
	// Diskimage names an image of the provider's diskimages to boot from.
	Diskimage string `yaml:"diskimage" drivers:"fake,openstack,aws"`

	// A metastatic label's backing nodes (see metastatic.go).
	MetastaticLabel `yaml:",inline"`
	// An openstack label's keys (see openstack.go).
	OpenStackLabel `yaml:",inline"`
	// An aws label's keys (see aws.go).
	AWSLabel `yaml:",inline"`
	// A kubernetes label's keys (see kubernetes.go).
	KubernetesLabel `yaml:",inline"`

	set map[string]bool
}

func (p *Provider) decodeYAML(d *decoder, path string, n *yaml.Node) {
	p.Driver = d.providerDriver(path, n)
	defer func() { d.driver, d.lenient = "", false }()
	p.set = d.decodeStruct(path, n, reflect.ValueOf(p).Elem())
	p.set["driver"] = true
	p.Driver = d.driver
}

func (p *Pool) decodeYAML(d *decoder, path string, n *yaml.Node) {
	p.set = d.decodeStruct(path, n, reflect.ValueOf(p).Elem())
}

func (l *PoolLabel) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		d.decodeString(path, n, reflect.ValueOf(&l.Name).Elem(), false)
		l.set = map[string]bool{"name": true}
		return
	}
	l.set = d.decodeStruct(path, n, reflect.ValueOf(l).Elem())
}

func (c *Config) applyDefaults() {
	if c.BuildLogRetention == nil {
		r := DefaultBuildLogRetention
		c.BuildLogRetention = &r
	}
	for i := range c.Providers {
		p := &c.Providers[i]
		spec := driverSpecs[p.Driver]
		if !p.set["priority"] {
			p.Priority = DefaultPriority
		}
		if !p.set["launch-retries"] {
			p.LaunchRetries = DefaultLaunchRetries
		}
		if !p.set["boot-timeout"] {
			p.BootTimeout = Duration(DefaultBootTimeout)
			if spec.bootTimeout > 0 {
				p.BootTimeout = Duration(spec.bootTimeout)
			}
		}
		if !p.set["launch-timeout"] {
			p.LaunchTimeout = Duration(DefaultLaunchTimeout)
		}
		if !p.set["rate"] && spec.rate > 0 {
			p.Rate = spec.rate
		}
		for j := range p.Pools {
			pool := &p.Pools[j]
			if !pool.set["priority"] {
				pool.Priority = p.Priority
			}
			if !pool.set["max-servers"] {
				pool.MaxServers = Unlimited
			}
			if !pool.set["max-cores"] {
				pool.MaxCores = Unlimited
			}
			if !pool.set["max-ram"] {
				pool.MaxRAM = Unlimited
			}
			if pool.NodeAttributes == nil {
				pool.NodeAttributes = Attributes{}
			}
		}
		if spec.defaults != nil {
			spec.defaults(p)
		}
	}
}

// Lookups by name.

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

// PoolLabel returns a pool of the provider and the pool's entry for a
// label, or an error that names what the provider does not have.
func (p *Provider) PoolLabel(pool, label string) (*Pool, *PoolLabel, error) {
	pc, ok := p.Pool(pool)
	if !ok {
		return nil, nil, fmt.Errorf("provider %s has no pool %q", p.Name, pool)
	}
	for i := range pc.Labels {
		if pc.Labels[i].Name == label {
			return pc, &pc.Labels[i], nil
		}
	}
	return nil, nil, fmt.Errorf("pool %s/%s has no label %q", p.Name, pool, label)
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

// Unavailable lists the providers whose driver this build reads but cannot
// run (a driver whose keys are known before its launcher is built; none
// now): their keys are checked like any other's, and Runnable refuses the
// file.
func (c *Config) Unavailable() []*Provider {
	var out []*Provider
	for i := range c.Providers {
		if !DriverAvailable(c.Providers[i].Driver) {
			out = append(out, &c.Providers[i])
		}
	}
	return out
}

// UnavailableMessage says why this build cannot run a provider of a
// driver it reads.
func UnavailableMessage(p *Provider) string {
	return fmt.Sprintf("provider %s: driver %s: configuration valid; the driver %s", p.Name, p.Driver, driverSpecs[p.Driver].missing)
}

// Runnable reports whether this build can run every provider of the file:
// nil, or an error naming each one it cannot. A launcher does not start
// (or reload) with such a file, rather than leave a provider unserved.
func (c *Config) Runnable() error {
	un := c.Unavailable()
	if len(un) == 0 {
		return nil
	}
	msgs := make([]string, len(un))
	for i, p := range un {
		msgs[i] = UnavailableMessage(p)
	}
	return fmt.Errorf("%s: %s; remove such providers from this file (Nodepool can keep serving them) to run it here", c.File, strings.Join(msgs, "; "))
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
