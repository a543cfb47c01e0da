package zkbridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/config"
)

// Conn is a ZooKeeper session of the ensemble Zuul uses, with every path
// under the configured chroot (go-zookeeper has no chroot of its own, so
// paths are prefixed here, as kazoo does it for Zuul and Nodepool).
type Conn struct {
	zcp     atomic.Pointer[zk.Conn]
	chroot  string
	timeout time.Duration
	log     *slog.Logger

	// session is the id of the current session (0 while none), and
	// connected whether it is connected now; since is when the session
	// was last known to be alive (connected).
	session   atomic.Int64
	connected atomic.Bool
	since     atomic.Int64
	// hadSession is set once the first session is established.
	hadSession atomic.Bool

	mu       sync.Mutex
	changes  []chan struct{} // told of every session change
	expiries int64
	// leftover are lock contenders (prefix -> lock directory) whose
	// withdrawal failed, to withdraw again.
	leftover map[string]string
	// doomed are the prefixes of the contenders to withdraw, from when
	// the withdrawal is asked until it is done: AdoptOrphan never adopts
	// one (the withdrawal would delete the lock under its new holder).
	doomed map[string]bool
	// live are the contenders (directory/name) of the locks this process
	// holds as Lock values, not yet released: a contender of this
	// session that is not live is an orphan (AdoptOrphan).
	live map[string]bool
}

// Dial connects to the servers of z (over TLS when z.TLS is set) and waits
// for a session, until ctx ends.
func Dial(ctx context.Context, z *config.ZooKeeper, log *slog.Logger) (*Conn, error) {
	if z == nil || len(z.Servers) == 0 {
		return nil, errors.New("no zookeeper-servers configured")
	}
	c := &Conn{chroot: z.Chroot, timeout: z.Timeout, log: log}
	dialer := func(network, address string, timeout time.Duration) (net.Conn, error) {
		return net.DialTimeout(network, address, timeout)
	}
	if z.TLS != nil {
		tc, err := tlsConfig(z.TLS)
		if err != nil {
			return nil, err
		}
		dialer = func(network, address string, timeout time.Duration) (net.Conn, error) {
			cfg := tc.Clone()
			if host, _, err := net.SplitHostPort(address); err == nil {
				cfg.ServerName = host
			}
			d := &net.Dialer{Timeout: timeout}
			conn, err := tls.DialWithDialer(d, network, address, cfg)
			if err != nil {
				return nil, err
			}
			return conn, nil
		}
	}
	zc, _, err := zk.Connect(z.Addrs(), z.Timeout, zk.WithDialer(dialer), zk.WithLogInfo(false),
		zk.WithLogger(zkLogger{log}), zk.WithEventCallback(c.event))
	if err != nil {
		return nil, fmt.Errorf("connecting to ZooKeeper %s: %w", strings.Join(z.Addrs(), ","), err)
	}
	c.zcp.Store(zc)
	for c.session.Load() == 0 || !c.connected.Load() {
		if ctx.Err() != nil {
			zc.Close()
			return nil, fmt.Errorf("connecting to ZooKeeper %s: no session: %w", strings.Join(z.Addrs(), ","), ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.chroot != "" {
		if err := c.ensure(c.chroot); err != nil {
			zc.Close()
			return nil, fmt.Errorf("creating the chroot %s: %w", c.chroot, err)
		}
	}
	return c, nil
}

func tlsConfig(t *config.ZooKeeperTLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("zookeeper-tls: reading cert %s and key %s: %w", t.Cert, t.Key, err)
	}
	ca, err := os.ReadFile(t.CA)
	if err != nil {
		return nil, fmt.Errorf("zookeeper-tls: reading ca %s: %w", t.CA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("zookeeper-tls: ca %s holds no PEM certificate", t.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// event follows the session's state (go-zookeeper calls it from its
// connection loop: it must not block).
func (c *Conn) event(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		id := int64(-1) // a session whose id Dial has not stored yet
		if zc := c.zcp.Load(); zc != nil {
			id = zc.SessionID()
		}
		old := c.session.Swap(id)
		c.connected.Store(true)
		c.since.Store(time.Now().UnixNano())
		if c.hadSession.Swap(true) && old != id {
			c.notify()
		}
	case zk.StateExpired:
		c.session.Store(0)
		c.connected.Store(false)
		c.mu.Lock()
		c.expiries++
		c.leftover = nil // gone with the session
		c.mu.Unlock()
		c.log.Warn("ZooKeeper session expired: its locks and registrations are gone; starting a new one")
		c.notify()
	case zk.StateDisconnected, zk.StateConnecting:
		if c.connected.Swap(false) {
			c.since.Store(time.Now().UnixNano())
		}
	case zk.StateConnected:
	}
}

// notify tells every subscriber that the session changed.
func (c *Conn) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.changes {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// SessionChanges returns a channel told (without blocking: it may merge
// several) of every session change: an expiry, a new session.
func (c *Conn) SessionChanges() <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	c.changes = append(c.changes, ch)
	c.mu.Unlock()
	return ch
}

// Session is the current session's id, 0 while there is none.
func (c *Conn) Session() int64 {
	id := c.session.Load()
	if id == -1 {
		id = c.zk().SessionID()
	}
	return id
}

// Trusted reports whether the locks of the current session can still be
// relied on: the session is connected, or was less than two thirds of its
// timeout ago (after which the server may have expired it and another
// process may hold what this one locked: it stops acting on them first).
func (c *Conn) Trusted() bool {
	if c.session.Load() == 0 {
		return false
	}
	if c.connected.Load() {
		return true
	}
	return time.Since(time.Unix(0, c.since.Load())) < c.timeout*2/3
}

// Close ends the session: its ephemeral nodes (locks, registrations) go.
func (c *Conn) Close() { c.zk().Close() }

func (c *Conn) zk() *zk.Conn { return c.zcp.Load() }

// full is the server's path of a path under the chroot.
func (c *Conn) full(p string) string {
	if p == "/" {
		if c.chroot == "" {
			return "/"
		}
		return c.chroot
	}
	return c.chroot + p
}

// local is the path under the chroot of a server's path.
func (c *Conn) local(p string) string {
	if c.chroot == "" {
		return p
	}
	if p == c.chroot {
		return "/"
	}
	return strings.TrimPrefix(p, c.chroot)
}

var acl = zk.WorldACL(zk.PermAll)

// Get reads a znode.
func (c *Conn) Get(p string) ([]byte, *zk.Stat, error) { return c.zk().Get(c.full(p)) }

// GetW reads a znode and watches it.
func (c *Conn) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	return c.zk().GetW(c.full(p))
}

// Children lists a znode's children.
func (c *Conn) Children(p string) ([]string, *zk.Stat, error) { return c.zk().Children(c.full(p)) }

// ChildrenW lists a znode's children and watches them.
func (c *Conn) ChildrenW(p string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	return c.zk().ChildrenW(c.full(p))
}

// Exists tells whether a znode exists.
func (c *Conn) Exists(p string) (bool, *zk.Stat, error) { return c.zk().Exists(c.full(p)) }

// ExistsW tells whether a znode exists and watches it.
func (c *Conn) ExistsW(p string) (bool, *zk.Stat, <-chan zk.Event, error) {
	return c.zk().ExistsW(c.full(p))
}

// Set writes a znode at a version (-1: any).
func (c *Conn) Set(p string, data []byte, version int32) (*zk.Stat, error) {
	return c.zk().Set(c.full(p), data, version)
}

// Delete removes a znode at a version (-1: any).
func (c *Conn) Delete(p string, version int32) error { return c.zk().Delete(c.full(p), version) }

// Create makes a znode, its parents too when they are missing (kazoo's
// makepath), and returns its path (with the sequence, for a sequential
// one).
func (c *Conn) Create(p string, data []byte, flags int32) (string, error) {
	created, err := c.zk().Create(c.full(p), data, flags, acl)
	if errors.Is(err, zk.ErrNoNode) {
		if perr := c.ensure(path.Dir(c.full(p))); perr != nil {
			return "", perr
		}
		created, err = c.zk().Create(c.full(p), data, flags, acl)
	}
	if err != nil {
		return "", err
	}
	return c.local(created), nil
}

// Ensure makes a persistent znode and its parents if missing.
func (c *Conn) Ensure(p string) error { return c.ensure(c.full(p)) }

// ensure makes a server path and its parents if missing.
func (c *Conn) ensure(full string) error {
	if full == "/" || full == "" {
		return nil
	}
	_, err := c.zk().Create(full, nil, 0, acl)
	switch {
	case err == nil || errors.Is(err, zk.ErrNodeExists):
		return nil
	case errors.Is(err, zk.ErrNoNode):
		if err := c.ensure(path.Dir(full)); err != nil {
			return err
		}
		_, err = c.zk().Create(full, nil, 0, acl)
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			return nil
		}
	}
	return err
}

// DeleteTree removes a znode and everything under it (its lock
// directory); a part already gone is fine. A child created meanwhile (a
// lock contender) makes it fail with zk.ErrNotEmpty: the caller looks
// again later.
func (c *Conn) DeleteTree(p string) error {
	children, _, err := c.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, ch := range children {
		if err := c.DeleteTree(p + "/" + ch); err != nil {
			return err
		}
	}
	err = c.Delete(p, -1)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// zkLogger sends go-zookeeper's messages to slog at debug level.
type zkLogger struct{ log *slog.Logger }

func (l zkLogger) Printf(format string, args ...any) {
	l.log.Debug("zookeeper client: " + fmt.Sprintf(format, args...))
}

// CreateSequentials makes one persistent sequential znode per data under
// prefix, all in one transaction, and returns their paths in order.
func (c *Conn) CreateSequentials(prefix string, datas [][]byte) ([]string, error) {
	ops := make([]any, len(datas))
	for i, d := range datas {
		ops[i] = &zk.CreateRequest{Path: c.full(prefix), Data: d, Acl: acl, Flags: zk.FlagSequence}
	}
	res, err := c.zk().Multi(ops...)
	if errors.Is(err, zk.ErrNoNode) {
		if perr := c.ensure(path.Dir(c.full(prefix))); perr != nil {
			return nil, perr
		}
		res, err = c.zk().Multi(ops...)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, len(res))
	for i, r := range res {
		if r.Error != nil {
			return nil, r.Error
		}
		out[i] = c.local(r.String)
	}
	return out, nil
}
