package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"
)

// Defaults of the static driver's node keys, as static.rst gives them.
const (
	DefaultStaticUsername        = "zuul"
	DefaultStaticConnectionType  = "ssh"
	DefaultStaticSSHPort         = 22
	DefaultStaticWinRMPort       = 5986
	DefaultStaticTimeout         = 5 * time.Second
	DefaultStaticMaxParallelJobs = 1
	DefaultStaticPythonPath      = "/usr/bin/python2"
	DefaultShellType             = "sh"
)

// StaticPool holds the keys of a static pool: its hosts. The pool's Labels
// are derived from them (see deriveStaticLabels).
type StaticPool struct {
	Nodes []StaticNode `yaml:"nodes" drivers:"static"`
}

// StaticNode is an entry of a static pool's `nodes`: an existing host,
// registered as max-parallel-jobs nodes.
type StaticNode struct {
	// Name is the host's name or address.
	Name           string    `yaml:"name" required:"true"`
	Labels         LabelList `yaml:"labels" required:"true"`
	Username       string    `yaml:"username"`
	ConnectionType string    `yaml:"connection-type"`
	ConnectionPort int       `yaml:"connection-port"`
	// SSHPort is connection-port's deprecated name (ssh-port), read when
	// connection-port is not given.
	SSHPort         int        `yaml:"ssh-port"`
	HostKey         StringList `yaml:"host-key"`
	HostKeyChecking *bool      `yaml:"host-key-checking"`
	Timeout         Duration   `yaml:"timeout"`
	MaxParallelJobs int        `yaml:"max-parallel-jobs"`
	PythonPath      string     `yaml:"python-path"`
	ShellType       string     `yaml:"shell-type"`

	set map[string]bool // keys given explicitly
}

func (sn *StaticNode) decodeYAML(d *decoder, path string, n *yaml.Node) {
	sn.set = d.decodeStruct(path, n, reflect.ValueOf(sn).Elem())
}

// ChecksHostKey reports whether the host's SSH host keys are scanned before
// its nodes go into service (host-key-checking, default true).
func (sn *StaticNode) ChecksHostKey() bool { return sn.HostKeyChecking == nil || *sn.HostKeyChecking }

// GathersHostKeys reports whether the connection type speaks SSH.
func (sn *StaticNode) GathersHostKeys() bool {
	return sn.ConnectionType == "ssh" || sn.ConnectionType == "network_cli"
}

// LabelList is a list of label names that may also be written as one
// string of names separated by spaces, as Nodepool reads a static node's
// labels.
type LabelList []string

func (ll *LabelList) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		var s string
		d.decodeString(path, n, reflect.ValueOf(&s).Elem(), false)
		*ll = strings.Fields(s)
		return
	}
	var list []string
	d.decode(path, n, reflect.ValueOf(&list).Elem())
	*ll = list
}

func staticDefaults(p *Provider) {
	for j := range p.Pools {
		pool := &p.Pools[j]
		// A static pool's size is its hosts' slots.
		pool.MaxServers = Unlimited
		for i := range pool.Nodes {
			sn := &pool.Nodes[i]
			if !sn.set["username"] {
				sn.Username = DefaultStaticUsername
			}
			if !sn.set["connection-type"] {
				sn.ConnectionType = DefaultStaticConnectionType
			}
			if !sn.set["connection-port"] {
				sn.ConnectionPort = DefaultStaticSSHPort
				if sn.ConnectionType == "winrm" {
					sn.ConnectionPort = DefaultStaticWinRMPort
				}
				if sn.set["ssh-port"] {
					sn.ConnectionPort = sn.SSHPort
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
			if !sn.set["python-path"] {
				sn.PythonPath = DefaultStaticPythonPath
			}
			if !sn.set["shell-type"] {
				sn.ShellType = DefaultShellType
			}
		}
	}
}

// validateStatic checks a static provider's pools; the labels their nodes
// carry count as provided. Name, username and port must be unique across
// the file, as in Nodepool.
func validateStatic(c *Config, v *validation, i int) {
	p := &c.Providers[i]
	for j := range p.Pools {
		pool := &p.Pools[j]
		ppath := indexPath(indexPath("providers", i)+".pools", j)
		at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i, "pools", j}, rest...)...) }
		if pool.set["max-servers"] {
			v.warn(ppath+".max-servers", at("max-servers"), "max-servers has no effect on a static pool: its nodes are its hosts' max-parallel-jobs slots")
		}
		if len(pool.Nodes) == 0 {
			v.warn(ppath, at(), "this static pool has no nodes, so it provides no label")
		}
		for k := range pool.Nodes {
			validateStaticNode(c, v, ppath, at, &pool.Nodes[k], k)
		}
	}
}

func validateStaticNode(c *Config, v *validation, ppath string, at func(...any) *yaml.Node, sn *StaticNode, i int) {
	npath := indexPath(ppath+".nodes", i)
	nat := func(rest ...any) *yaml.Node { return at(append([]any{"nodes", i}, rest...)...) }
	if sn.Name == "" || strings.ContainsAny(sn.Name, " \t\n/") {
		v.fail(npath+".name", nat("name"), "expected a host name or address, got %q", sn.Name)
	}
	id := sn.Name + "|" + sn.Username + "|" + strconv.Itoa(sn.ConnectionPort)
	if prev, dup := v.staticHosts[id]; dup {
		v.fail(npath, nat(), "host %s (username %s, port %d) is listed twice (also %s); name, username and connection-port must be unique", sn.Name, sn.Username, sn.ConnectionPort, prev)
	} else {
		v.staticHosts[id] = npath
	}
	if len(sn.Labels) == 0 {
		v.fail(npath+".labels", nat("labels"), "expected at least one label")
	}
	seen := map[string]bool{}
	for k, l := range sn.Labels {
		lpath := indexPath(npath+".labels", k)
		lat := nat("labels", k)
		if lat == nil {
			lat = nat("labels")
		}
		v.labelDefined(lpath, lat, l)
		if seen[l] {
			v.warn(lpath, lat, "label %q is listed twice for this node; once is enough (Nodepool accepts it too)", l)
		}
		seen[l] = true
		v.provided[l] = true
	}
	if len(seen) < len(sn.Labels) {
		var once LabelList
		for _, l := range sn.Labels {
			if !slices.Contains(once, l) {
				once = append(once, l)
			}
		}
		sn.Labels = once
	}
	if sn.set["ssh-port"] {
		if sn.set["connection-port"] {
			v.warn(npath+".ssh-port", nat("ssh-port"), "ssh-port is Nodepool's old name of connection-port (deprecated since the static driver took windows hosts, Nodepool 3.x); connection-port is given too and wins: remove ssh-port")
		} else {
			v.warn(npath+".ssh-port", nat("ssh-port"), "ssh-port is Nodepool's old name of connection-port (deprecated since the static driver took windows hosts, Nodepool 3.x); it is read as connection-port %d: rename it", sn.ConnectionPort)
		}
	}
	if sn.ConnectionType == "" || strings.ContainsAny(sn.ConnectionType, " \t\n") {
		v.fail(npath+".connection-type", nat("connection-type"), "expected a connection type such as ssh, winrm or network_cli, got %q", sn.ConnectionType)
	}
	if sn.ConnectionPort < 1 || sn.ConnectionPort > 65535 {
		v.fail(npath+".connection-port", nat("connection-port"), "expected a port from 1 to 65535, got %d", sn.ConnectionPort)
	}
	if sn.MaxParallelJobs < 1 {
		v.warn(npath+".max-parallel-jobs", nat("max-parallel-jobs"), "max-parallel-jobs %d gives this host no node", sn.MaxParallelJobs)
	}
	if strings.ContainsAny(sn.Username, " \t\n") {
		v.fail(npath+".username", nat("username"), "username %q is not valid; expected a user name without spaces", sn.Username)
	}
	for k, key := range sn.HostKey {
		if _, err := ParseHostKey(key); err != nil {
			kpath := npath + ".host-key"
			kat := nat("host-key")
			if len(sn.HostKey) > 1 || (kat != nil && kat.Kind == yaml.SequenceNode) {
				kpath, kat = indexPath(kpath, k), nat("host-key", k)
			}
			v.warn(kpath, kat, "%v; the host's check fails on it, so its nodes never become ready (as in Nodepool, whose key scan compares it)", err)
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
				if sn.MaxParallelJobs < 1 {
					continue
				}
				for _, l := range sn.Labels {
					if _, ok := pool.Label(l); !ok {
						pool.Labels = append(pool.Labels, PoolLabel{Name: l})
					}
				}
			}
		}
	}
}
