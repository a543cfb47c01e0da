package natstest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/freeport"
)

// Account is the account of a test server without accounts configured:
// the one to name when asking a server about a stream.
const Account = server.DEFAULT_GLOBAL_ACCOUNT

// Cluster is a JetStream cluster of in-process nats-servers on random
// ports, each storing in a folder of the test's own. A member can be
// stopped and started again on its store and its ports, as a crashed and
// restarted server would be.
type Cluster struct {
	t    testing.TB
	name string

	mu      sync.Mutex
	members []*member
}

type member struct {
	opts *server.Options
	ns   *server.Server // nil while stopped
}

// StartCluster starts n servers (3 or 5 for a useful quorum) as one
// cluster and waits until they elected a meta leader and every one is
// current. The servers stop when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, name: fmt.Sprintf("nodepool-test-%d", time.Now().UnixNano()%1e9)}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoSigs:     true,
			NoLog:      true,
			Cluster: server.ClusterOpts{
				Name: c.name,
				Host: "127.0.0.1",
			},
		}
		c.members = append(c.members, &member{opts: opts})
	}
	// Every member gets its client and route ports before any starts, so
	// each can list all the others' routes and keep its ports on restart.
	// A port found free may be taken before its server listens on it (an
	// outgoing connection of a test beside this one gets it): the member
	// is then given new ports and started again.
	if err := c.choosePorts(c.members...); err != nil {
		t.Fatal(err)
	}
	for i := range c.members {
		for tries := 1; ; tries++ {
			err := c.start(i)
			if err == nil {
				break
			}
			if !errors.Is(err, errPortTaken) || tries == maxPortTries {
				t.Fatal(err)
			}
			if err := c.choosePorts(c.members[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, m := range c.members {
			if m.ns != nil {
				m.ns.Shutdown()
				m.ns.WaitForShutdown()
				m.ns = nil
			}
		}
	})
	c.WaitHealthy(60 * time.Second)
	return c
}

// maxPortTries is how many times a member is started on new ports when
// one of its ports was taken.
const maxPortTries = 5

// errPortTaken: a server could not listen on one of its ports.
var errPortTaken = errors.New("a port of the server was taken")

// choosePorts gives members new client and route ports, and every
// member the routes of all (a member that runs keeps its own until it
// starts again; the cluster's gossip tells it the new routes meanwhile).
func (c *Cluster) choosePorts(members ...*member) error {
	ports, err := freeport.Ports(2 * len(members))
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range members {
		m.opts.Port, m.opts.Cluster.Port = ports[2*i], ports[2*i+1]
	}
	var routes []string
	for _, m := range c.members {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", m.opts.Cluster.Port))
	}
	for _, m := range c.members {
		m.opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
	}
	return nil
}

func (c *Cluster) start(i int) error {
	c.mu.Lock()
	m := c.members[i]
	opts := m.opts.Clone()
	c.mu.Unlock()
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("starting nats-server %s: %w", opts.ServerName, err)
	}
	// A server that cannot listen says so as a fatal error, and then
	// never becomes ready.
	fatal := &fatalLog{err: make(chan string, 1)}
	ns.SetLogger(fatal, false, false)
	go ns.Start()
	ready := make(chan bool, 1)
	go func() { ready <- ns.ReadyForConnections(30 * time.Second) }()
	select {
	case ok := <-ready:
		if !ok {
			ns.Shutdown()
			return fmt.Errorf("nats-server %s did not start", opts.ServerName)
		}
	case msg := <-fatal.err:
		ns.Shutdown()
		if strings.Contains(msg, "Error listening") {
			return fmt.Errorf("nats-server %s: %w: %s", opts.ServerName, errPortTaken, msg)
		}
		return fmt.Errorf("nats-server %s did not start: %s", opts.ServerName, msg)
	}
	c.mu.Lock()
	m.ns = ns
	c.mu.Unlock()
	return nil
}

// fatalLog is a test server's logger: it keeps quiet but for its first
// fatal error, which it hands over.
type fatalLog struct {
	err  chan string
	once sync.Once
}

func (l *fatalLog) Fatalf(format string, v ...any) {
	l.once.Do(func() { l.err <- fmt.Sprintf(format, v...) })
}
func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

// Size is the number of members, running or not.
func (c *Cluster) Size() int { return len(c.members) }

// URL is the client URL of member i (it keeps it across restarts).
func (c *Cluster) URL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", c.members[i].opts.Port)
}

// URLs lists every member's client URL, comma separated, as
// NODEPOOL_NATS_URL takes them. The first is member first's, so that
// processes given different first members connect to different servers.
func (c *Cluster) URLs(first int) string {
	var urls []string
	for i := range c.members {
		urls = append(urls, c.URL((first+i)%len(c.members)))
	}
	return strings.Join(urls, ",")
}

// Server is member i, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].ns
}

// Name is member i's server name.
func (c *Cluster) Name(i int) string { return c.members[i].opts.ServerName }

// Stop shuts member i down (as a crash would, its store stays). It may be
// called from any goroutine; stopping a stopped member does nothing.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	ns := c.members[i].ns
	c.members[i].ns = nil
	c.mu.Unlock()
	if ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// Restart starts a stopped member again on its store and ports. It may
// be called from any goroutine.
func (c *Cluster) Restart(i int) error {
	if c.Server(i) != nil {
		return fmt.Errorf("nats-server %s is running", c.Name(i))
	}
	return c.start(i)
}

// Running lists the members that run.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, m := range c.members {
		if m.ns != nil {
			out = append(out, i)
		}
	}
	return out
}

// Healthy reports whether every running member is current: the meta
// group has a leader, and every stream and consumer it holds a replica of
// has caught up (the server's own /healthz). It says why not.
func (c *Cluster) Healthy() (bool, string) {
	for _, i := range c.Running() {
		ns := c.Server(i)
		if ns == nil {
			continue
		}
		if st := ns.Healthz(nil); st.Status != "ok" {
			return false, fmt.Sprintf("%s: %s %s", c.Name(i), st.Status, st.Error)
		}
	}
	// Healthy servers are not yet a cluster that can place a replicated
	// stream: the meta leader must see every other running member as a
	// current peer, or a create of an R3 bucket at once is refused with
	// "no suitable peers for placement" (seen on a loaded machine).
	running := c.Running()
	for _, i := range running {
		ns := c.Server(i)
		if ns == nil || !ns.JetStreamIsLeader() {
			continue
		}
		jsi, err := ns.Jsz(nil)
		if err != nil || jsi.Meta == nil {
			return false, fmt.Sprintf("%s: no meta cluster information (%v)", c.Name(i), err)
		}
		current := 0
		for _, p := range jsi.Meta.Replicas {
			if p.Current && !p.Offline {
				current++
			}
		}
		if current < len(running)-1 {
			return false, fmt.Sprintf("the meta leader %s sees %d current peers of %d", c.Name(i), current, len(running)-1)
		}
		return true, ""
	}
	if len(running) > 1 {
		return false, "no meta leader"
	}
	return true, ""
}

// WaitHealthy waits until Healthy, failing the test after timeout.
func (c *Cluster) WaitHealthy(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := c.Healthy()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster not healthy within %s: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StreamLeader returns the member leading a stream (a KV bucket's stream
// is KV_<bucket>), or -1 when no running member leads it.
func (c *Cluster) StreamLeader(stream string) int {
	for _, i := range c.Running() {
		if ns := c.Server(i); ns != nil && ns.JetStreamIsStreamLeader(Account, stream) {
			return i
		}
	}
	return -1
}

// WaitStreamLeader waits until a running member leads stream and returns
// it.
func (c *Cluster) WaitStreamLeader(stream string, timeout time.Duration) int {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if i := c.StreamLeader(stream); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no leader for stream %s within %s", stream, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// MetaLeader returns the member leading the meta group, or -1.
func (c *Cluster) MetaLeader() int {
	for _, i := range c.Running() {
		if ns := c.Server(i); ns != nil && ns.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// Connect opens a connection to every member (member first first),
// reconnecting for ever, closed when the test ends.
func (c *Cluster) Connect(t testing.TB, first int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URLs(first), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DontRandomize())
	if err != nil {
		t.Fatalf("connecting to the cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
