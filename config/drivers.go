package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"gopkg.in/yaml.v3"
)

// Defaults of the static driver's node keys, as in Nodepool.
const (
	DefaultStaticUsername        = "zuul"
	DefaultStaticConnectionType  = "ssh"
	DefaultStaticSSHPort         = 22
	DefaultStaticWinRMPort       = 5986
	DefaultStaticTimeout         = 5 * time.Second
	DefaultStaticMaxParallelJobs = 1
)

// Defaults of the metastatic driver's label keys, as in Nodepool.
const (
	DefaultMetastaticMaxParallelJobs = 1
	DefaultMetastaticGraceTime       = 60 * time.Second
)

// StaticConnectionTypes are the values of a static node's connection-type.
// ssh and network_cli hosts have their SSH host keys scanned; winrm hosts
// are checked by a TCP connection.
var StaticConnectionTypes = []string{"ssh", "network_cli", "winrm"}

// StaticNode is an entry of a static pool's `nodes`: an existing host,
// registered as max-parallel-jobs nodes.
type StaticNode struct {
	// Name is the host's name or address.
	Name            string     `yaml:"name" required:"true"`
	Labels          StringList `yaml:"labels" required:"true"`
	Username        string     `yaml:"username"`
	ConnectionType  string     `yaml:"connection-type"`
	ConnectionPort  int        `yaml:"connection-port"`
	HostKey         StringList `yaml:"host-key"`
	HostKeyChecking *bool      `yaml:"host-key-checking"`
	Timeout         Duration   `yaml:"timeout"`
	MaxParallelJobs int        `yaml:"max-parallel-jobs"`

	set map[string]bool // keys given explicitly
}

func (sn *StaticNode) decodeYAML(d *decoder, path string, n *yaml.Node) {
	d.decodeStruct(path, n, []reflect.Value{reflect.ValueOf(sn).Elem()})
	sn.set = explicitKeys(n, "connection-port", "timeout", "max-parallel-jobs")
}

// ChecksHostKey reports whether the host's SSH host keys are scanned before
// its nodes go into service (host-key-checking, default true).
func (sn *StaticNode) ChecksHostKey() bool { return sn.HostKeyChecking == nil || *sn.HostKeyChecking }

// GathersHostKeys reports whether the connection type speaks SSH.
func (sn *StaticNode) GathersHostKeys() bool {
	return sn.ConnectionType == "ssh" || sn.ConnectionType == "network_cli"
}

// MetastaticLabel holds the keys of a metastatic pool's label: which label
// backs it and how backing nodes are shared and given back.
type MetastaticLabel struct {
	BackingLabel     string   `yaml:"backing-label" drivers:"metastatic"`
	MaxParallelJobs  int      `yaml:"max-parallel-jobs" drivers:"metastatic"`
	GraceTime        Duration `yaml:"grace-time" drivers:"metastatic"`
	MinRetentionTime Duration `yaml:"min-retention-time" drivers:"metastatic"`
	MaxAge           Duration `yaml:"max-age" drivers:"metastatic"`

	set map[string]bool
}

func (ml *MetastaticLabel) noteSet(n *yaml.Node) {
	ml.set = explicitKeys(n, "max-parallel-jobs", "grace-time")
}

// explicitKeys tells which of keys a mapping gives a (non-null) value.
func explicitKeys(n *yaml.Node, keys ...string) map[string]bool {
	set := map[string]bool{}
	for _, k := range keys {
		if v := mappingValue(n, k); v != nil && !isNull(v) {
			set[k] = true
		}
	}
	return set
}

// applyDriverDefaults fills the driver-specific keys a pool left out.
func (p *Pool) applyDriverDefaults(driver string) {
	switch driver {
	case "static":
		p.MaxServers = Unlimited
		for i := range p.Nodes {
			sn := &p.Nodes[i]
			if sn.Username == "" {
				sn.Username = DefaultStaticUsername
			}
			if sn.ConnectionType == "" {
				sn.ConnectionType = DefaultStaticConnectionType
			}
			if !sn.set["connection-port"] {
				sn.ConnectionPort = DefaultStaticSSHPort
				if sn.ConnectionType == "winrm" {
					sn.ConnectionPort = DefaultStaticWinRMPort
				}
			}
			if !sn.set["timeout"] {
				sn.Timeout = Duration(DefaultStaticTimeout)
			}
			if !sn.set["max-parallel-jobs"] {
				sn.MaxParallelJobs = DefaultStaticMaxParallelJobs
			}
			if sn.HostKeyChecking == nil {
				t := true
				sn.HostKeyChecking = &t
			}
		}
	case "metastatic":
		for i := range p.Labels {
			ml := &p.Labels[i].MetastaticLabel
			if !ml.set["max-parallel-jobs"] {
				ml.MaxParallelJobs = DefaultMetastaticMaxParallelJobs
			}
			if !ml.set["grace-time"] {
				ml.GraceTime = Duration(DefaultMetastaticGraceTime)
			}
		}
	}
}

// validateStaticPool checks a static pool's nodes; the labels they carry
// count as provided by the pool. hosts remembers every host seen in the
// file: name, username and port must be unique across it, as in Nodepool.
func (c *Config) validateStaticPool(d *decoder, ppath string, at func(...any) *yaml.Node, pool *Pool, labels map[string]int, provided map[string]bool, hosts map[string]string) {
	if len(pool.Nodes) == 0 {
		d.fail(ppath, at(), "a static pool needs \"nodes\": the hosts it hands out (name, labels, ...)")
	}
	for i, sn := range pool.Nodes {
		npath := indexPath(ppath+".nodes", i)
		nat := func(rest ...any) *yaml.Node { return at(append([]any{"nodes", i}, rest...)...) }
		if sn.Name == "" || strings.ContainsAny(sn.Name, " \t\n/") {
			d.fail(npath+".name", nat("name"), "expected a host name or address, got %q", sn.Name)
		}
		id := sn.Name + "|" + sn.Username + "|" + strconv.Itoa(sn.ConnectionPort)
		if prev, dup := hosts[id]; dup {
			d.fail(npath, nat(), "host %s (username %s, port %d) is listed twice (also %s); name, username and connection-port must be unique", sn.Name, sn.Username, sn.ConnectionPort, prev)
		} else {
			hosts[id] = npath
		}
		if len(sn.Labels) == 0 {
			d.fail(npath+".labels", nat("labels"), "expected at least one label")
		}
		seen := map[string]bool{}
		for k, l := range sn.Labels {
			lpath := indexPath(npath+".labels", k)
			if _, ok := labels[l]; !ok {
				d.fail(lpath, nat("labels", k), "label %q is not defined; expected one of the names under the top-level labels (%s)", l, strings.Join(c.LabelNames(), ", "))
			}
			if seen[l] {
				d.fail(lpath, nat("labels", k), "label %q is listed twice for this node", l)
			}
			seen[l] = true
			provided[l] = true
		}
		if !slices.Contains(StaticConnectionTypes, sn.ConnectionType) {
			d.fail(npath+".connection-type", nat("connection-type"), "expected one of %s, got %q", strings.Join(StaticConnectionTypes, ", "), sn.ConnectionType)
		}
		if sn.ConnectionPort < 1 || sn.ConnectionPort > 65535 {
			d.fail(npath+".connection-port", nat("connection-port"), "expected a port from 1 to 65535, got %d", sn.ConnectionPort)
		}
		if sn.Timeout.D() <= 0 {
			d.fail(npath+".timeout", nat("timeout"), "expected a timeout of more than zero, got %s", sn.Timeout.D())
		}
		if sn.MaxParallelJobs < 1 {
			d.fail(npath+".max-parallel-jobs", nat("max-parallel-jobs"), "expected 1 or more, got %d", sn.MaxParallelJobs)
		}
		for k, key := range sn.HostKey {
			if _, err := ParseHostKey(key); err != nil {
				kpath := npath + ".host-key"
				kat := nat("host-key")
				if len(sn.HostKey) > 1 || (kat != nil && kat.Kind == yaml.SequenceNode) {
					kpath, kat = indexPath(kpath, k), nat("host-key", k)
				}
				d.fail(kpath, kat, "%v", err)
			}
		}
	}
}

// ParseHostKey reads an SSH public key written as in known_hosts or
// authorized_keys ("ssh-ed25519 AAAA..."; a comment after it is ignored) and
// returns it as "type base64", the form of a node's host_keys.
func ParseHostKey(s string) (string, error) {
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s))
	if err != nil {
		return "", fmt.Errorf("expected an SSH public key such as \"ssh-ed25519 AAAA...\", got %q", s)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))), nil
}

// validateMetastatic checks the labels of every metastatic pool: the
// backing label must exist and come from a pool of another driver.
func (c *Config) validateMetastatic(d *decoder, line func(...any) *yaml.Node) {
	meta := map[string]string{} // labels served by metastatic pools -> provider/pool
	for _, p := range c.Providers {
		if p.Driver != "metastatic" {
			continue
		}
		for _, pool := range p.Pools {
			for _, pl := range pool.Labels {
				meta[pl.Name] = p.Name + "/" + pool.Name
			}
		}
	}
	for i, p := range c.Providers {
		if p.Driver != "metastatic" {
			continue
		}
		for j, pool := range p.Pools {
			for k, pl := range pool.Labels {
				lpath := indexPath(indexPath(indexPath("providers", i)+".pools", j)+".labels", k)
				at := func(rest ...any) *yaml.Node {
					return line(append([]any{"providers", i, "pools", j, "labels", k}, rest...)...)
				}
				switch _, defined := c.Label(pl.BackingLabel); {
				case pl.BackingLabel == "":
					d.fail(lpath, at(), "missing required key \"backing-label\": the label of the nodes this label is carved out of")
				case !defined:
					d.fail(lpath+".backing-label", at("backing-label"), "label %q is not defined; expected one of the names under the top-level labels (%s)", pl.BackingLabel, strings.Join(c.LabelNames(), ", "))
				case meta[pl.BackingLabel] != "":
					d.fail(lpath+".backing-label", at("backing-label"), "label %q is itself served by metastatic pool %s; expected a label that another driver provides", pl.BackingLabel, meta[pl.BackingLabel])
				}
				if pl.MaxParallelJobs < 1 {
					d.fail(lpath+".max-parallel-jobs", at("max-parallel-jobs"), "expected 1 or more, got %d", pl.MaxParallelJobs)
				}
				if pl.MaxAge > 0 && pl.MaxAge < pl.MinRetentionTime {
					d.fail(lpath+".max-age", at("max-age"), "max-age (%s) must be at least min-retention-time (%s)", pl.MaxAge.D(), pl.MinRetentionTime.D())
				}
			}
		}
	}
}

// deriveStaticLabels sets each static pool's Labels to the labels of its
// nodes, in file order, so that the rest of the system sees which labels a
// static pool serves as it does for any other pool.
func (c *Config) deriveStaticLabels() {
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Driver != "static" {
			continue
		}
		for j := range p.Pools {
			pool := &p.Pools[j]
			pool.Labels = nil
			for _, sn := range pool.Nodes {
				for _, l := range sn.Labels {
					if _, ok := pool.Label(l); !ok {
						pool.Labels = append(pool.Labels, PoolLabel{Name: l})
					}
				}
			}
		}
	}
}
