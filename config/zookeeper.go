package config

import (
	"fmt"
	"net"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultZooKeeperPort is a zookeeper-servers entry's port when it names
// none, as in Nodepool.
const DefaultZooKeeperPort = 2181

// DefaultZooKeeperTimeout is the session timeout when zookeeper-timeout is
// not set (Nodepool's 10.0 seconds).
const DefaultZooKeeperTimeout = 10 * time.Second

// ZooKeeperServer is an entry of `zookeeper-servers`: a server of the
// ensemble Zuul uses, which the ZooKeeper role serves Zuul in.
type ZooKeeperServer struct {
	Host string `yaml:"host" required:"true"`
	Port int    `yaml:"port"`
	// Chroot is the path every ZooKeeper path is relative to ("" for
	// none), as kazoo reads it from the host list Nodepool builds.
	Chroot string `yaml:"chroot"`

	set map[string]bool
}

func (z *ZooKeeperServer) decodeYAML(d *decoder, path string, n *yaml.Node) {
	z.set = d.decodeStruct(path, n, reflect.ValueOf(z).Elem())
	if !z.set["port"] {
		z.Port = DefaultZooKeeperPort
	}
}

// Addr is the server's host:port.
func (z ZooKeeperServer) Addr() string { return net.JoinHostPort(z.Host, strconv.Itoa(z.Port)) }

// ZooKeeperTLS is the `zookeeper-tls` section: the client certificate,
// key and CA (PEM files) of a ZooKeeper served over TLS.
type ZooKeeperTLS struct {
	Cert string `yaml:"cert" required:"true"`
	Key  string `yaml:"key" required:"true"`
	CA   string `yaml:"ca" required:"true"`
}

// ZooKeeperTimeout is `zookeeper-timeout`: seconds, an integer or not.
type ZooKeeperTimeout float64

func (zt *ZooKeeperTimeout) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		d.fail(path, n, "expected a number of seconds, got %s", describe(n))
		return
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
	if err != nil || f <= 0 || f > 3600 {
		d.fail(path, n, "expected a number of seconds above 0 (at most 3600), got %s", n.Value)
		return
	}
	*zt = ZooKeeperTimeout(f)
}

// D is the timeout as a duration.
func (zt ZooKeeperTimeout) D() time.Duration {
	return time.Duration(float64(zt) * float64(time.Second))
}

// ZooKeeper is where Zuul's ZooKeeper is, when the file names one
// (zookeeper-servers): the servers, the chroot every path is under, TLS
// and the session timeout.
type ZooKeeper struct {
	Servers []ZooKeeperServer
	// Chroot is "" or a path such as /nodepool.
	Chroot  string
	TLS     *ZooKeeperTLS
	Timeout time.Duration
}

// Addrs lists the servers as host:port.
func (z *ZooKeeper) Addrs() []string {
	out := make([]string, len(z.Servers))
	for i, s := range z.Servers {
		out[i] = s.Addr()
	}
	return out
}

// ZooKeeper returns where Zuul's ZooKeeper is, or nil when the file names
// no zookeeper-servers.
func (c *Config) ZooKeeper() *ZooKeeper {
	if len(c.ZooKeeperServers) == 0 {
		return nil
	}
	z := &ZooKeeper{Servers: c.ZooKeeperServers, TLS: c.ZooKeeperTLS, Timeout: DefaultZooKeeperTimeout}
	if c.ZooKeeperTimeout > 0 {
		z.Timeout = c.ZooKeeperTimeout.D()
	}
	for _, s := range c.ZooKeeperServers {
		if s.Chroot != "" {
			z.Chroot = normalChroot(s.Chroot)
		}
	}
	return z
}

// normalChroot cleans a chroot as kazoo does ("/" is none).
func normalChroot(c string) string {
	c = path.Clean(c)
	if c == "/" || c == "." {
		return ""
	}
	return c
}

// validateZooKeeper checks zookeeper-servers, zookeeper-tls and
// zookeeper-timeout. Nodepool builds the host list kazoo reads by writing
// each entry as host:port<chroot> and joining them with commas, and kazoo
// takes everything after the first "/" of that list as the chroot: a
// chroot works only on the last entry. A chroot written on other entries
// (and the same on every one that has one) is applied to every server
// here, with a warning; different chroots are an error.
func (c *Config) validateZooKeeper(v *validation) {
	chroots := map[string]int{}
	for i, s := range c.ZooKeeperServers {
		path := indexPath("zookeeper-servers", i)
		if s.Host == "" || strings.ContainsAny(s.Host, " \t\n/,") {
			v.fail(path+".host", v.at("zookeeper-servers", i, "host"), "expected a host name or address, got %q", s.Host)
		}
		if s.Port < 1 || s.Port > 65535 {
			v.fail(path+".port", v.at("zookeeper-servers", i, "port"), "expected a port from 1 to 65535, got %d", s.Port)
		}
		if s.Chroot == "" {
			continue
		}
		if !strings.HasPrefix(s.Chroot, "/") || strings.ContainsAny(s.Chroot, " \t\n,") {
			v.fail(path+".chroot", v.at("zookeeper-servers", i, "chroot"), "expected a ZooKeeper path such as /nodepool, got %q", s.Chroot)
			continue
		}
		if _, seen := chroots[normalChroot(s.Chroot)]; !seen {
			chroots[normalChroot(s.Chroot)] = i
		}
	}
	switch {
	case len(chroots) > 1:
		var list []string
		for ch, i := range chroots {
			list = append(list, fmt.Sprintf("%s (zookeeper-servers[%d])", ch, i))
		}
		v.fail("zookeeper-servers", v.at("zookeeper-servers"), "the entries name different chroots: %s; Zuul and Nodepool see one tree, under one chroot: write it on the last entry only", strings.Join(slices.Sorted(slices.Values(list)), ", "))
	case len(chroots) == 1:
		if hasChrootBefore(c.ZooKeeperServers) {
			v.warn("zookeeper-servers", v.at("zookeeper-servers"), "a chroot written on an entry other than the last: Nodepool's client (kazoo) reads a chroot only after the last server, and would connect to the first server alone; here the chroot applies to every server")
		}
	}
	if len(c.ZooKeeperServers) == 0 && (c.ZooKeeperTLS != nil || c.ZooKeeperTimeout > 0) {
		v.warn("zookeeper-tls", v.at("zookeeper-tls"), "zookeeper-tls and zookeeper-timeout have no effect without zookeeper-servers")
	}
}

func hasChrootBefore(servers []ZooKeeperServer) bool {
	for _, s := range servers[:len(servers)-1] {
		if s.Chroot != "" {
			return true
		}
	}
	return false
}
