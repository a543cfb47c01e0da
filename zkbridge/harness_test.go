package zkbridge_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/internal/zktest"
	"github.com/nodepool-nats/nodepool/internal/zuulsim"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// zookeeper is the package's ZooKeeper server; each test works under a
// chroot of its own.
var zookeeper zktest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	zookeeper.Stop()
	os.Exit(code)
}

// testLog records what a process logs (with NODEPOOL_TEST_LOG set, it
// also writes it to stderr); a failed test prints it.
func testLog(t testing.TB) *slog.Logger {
	log, rec := logtest.New(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", rec)
		}
	})
	return log
}

// baseConfig is a fake cloud with two pools; %s is the zookeeper keys.
const baseConfig = `
labels:
  - name: small
  - name: large
  - name: slow
  - name: tiny
  - name: python-only
providers:
  - name: fake-cloud
    driver: fake
    boot-delay: 0.05
    delete-delay: 0.01
    flavors:
      - {name: small, cores: 2, ram: 2048}
      - {name: large, cores: 8, ram: 8192}
    pools:
      - name: main
        max-servers: 10
        node-attributes:
          executor-zone: zone-a
        labels:
          - {name: small, flavor-name: small, cloud-image: ubuntu}
          - {name: large, flavor-name: large, cloud-image: ubuntu}
      - name: big
        max-servers: 2
        labels:
          - {name: large, flavor-name: large, cloud-image: ubuntu}
  - name: slow-cloud
    driver: fake
    boot-delay: 2
    flavors:
      - {name: small, cores: 2, ram: 2048}
    pools:
      - name: main
        max-servers: 4
        labels:
          - {name: slow, flavor-name: small, cloud-image: ubuntu}
  - name: tiny-cloud
    driver: fake
    boot-delay: 0.02
    delete-delay: 0.01
    flavors:
      - {name: small, cores: 2, ram: 2048}
    pools:
      - name: main
        max-servers: 1
        labels:
          - {name: tiny, flavor-name: small, cloud-image: ubuntu}
%s`

// env is a NATS server, ZooKeeper (a chroot of the test's own) and the
// processes of an installation: launchers and bridges.
type env struct {
	t       testing.TB
	nats    *natstest.Server
	zk      *zktest.Server
	chroot  string
	cfg     string // the nodepool.yaml text
	procs   []*proc
	nodes   *kv.Cache[kv.Node]
	reqs    *kv.Cache[kv.Request]
	buckets *kv.Buckets
}

type proc struct {
	p      *service.Process
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func newEnv(t testing.TB, extraYAML string) *env {
	t.Helper()
	e := &env{t: t, nats: natstest.Start(t), zk: zookeeper.Get(t), chroot: zktest.Chroot(t)}
	e.cfg = fmt.Sprintf(baseConfig, e.zk.ConfigYAML(e.chroot)) + extraYAML
	return e
}

// start starts a process with the given roles.
func (e *env) start(id string, roles ...string) *service.Process {
	e.t.Helper()
	cfg, err := config.Parse("nodepool.yaml", []byte(e.cfg))
	if err != nil {
		e.t.Fatal(err)
	}
	s := config.Settings{NatsURL: e.nats.ClientURL(), DataDir: e.t.TempDir(), Roles: roles, ID: id, Replicas: 1,
		LeaseTTL: 2 * time.Second, SyncInterval: 500 * time.Millisecond}
	p, err := service.Start(e.t.Context(), s, cfg, testLog(e.t).With("id", id))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr := &proc{p: p, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(pr.done); _ = p.Run(ctx) }()
	e.procs = append(e.procs, pr)
	e.t.Cleanup(func() { pr.stop() })
	if e.buckets == nil {
		e.buckets = p.Buckets()
		log := testLog(e.t)
		e.nodes, e.reqs = kv.NewCache(e.buckets.Nodes, log), kv.NewCache(e.buckets.Requests, log)
		stopN, stopR := e.nodes.Start(), e.reqs.Start()
		e.t.Cleanup(func() { stopN(); stopR() })
	}
	e.waitFor(60*time.Second, id+" ready", func() bool { return p.Ready() == nil })
	return p
}

func (p *proc) stop() {
	p.once.Do(func() {
		p.cancel()
		<-p.done
		p.p.Close()
	})
}

// stopAll stops every process.
func (e *env) stopAll() {
	for _, p := range e.procs {
		p.stop()
	}
}

// benchConfig is a fake cloud that boots in 0.1 s, with room for every
// request of a burst.
const benchConfig = `
labels:
  - name: small
providers:
  - name: fake-cloud
    driver: fake
    boot-delay: 0.1
    delete-delay: 0
    flavors:
      - {name: small, cores: 1, ram: 1024}
    pools:
      - name: main
        max-servers: 1000
        labels:
          - {name: small, flavor-name: small, cloud-image: ubuntu}
%s`

// newBenchEnv is an environment with the benchmark's cloud.
func newBenchEnv(tb testing.TB, extraYAML string) *env {
	e := newEnv(tb, "")
	e.cfg = fmt.Sprintf(benchConfig, e.zk.ConfigYAML(e.chroot)) + extraYAML
	return e
}

// installation starts one process with the launcher and zookeeper roles.
func (e *env) installation() *service.Process {
	return e.start("np1", config.RoleLauncher, config.RoleZooKeeper)
}

// zuul starts a Zuul stand-in on the test's chroot, with Zuul's default
// session timeout (10 s): a shorter one expired under a loaded machine
// (the stand-in's heartbeats late), its locks gone between Zuul's lock
// and its delete of the request (TestZuulAutohold).
func (e *env) zuul() *zuulsim.Zuul {
	e.t.Helper()
	return e.zuulSession(10)
}

// killableZuul is a Zuul stand-in that the test kills: its session, and
// so its locks and ephemeral requests, expire 4 s after.
func (e *env) killableZuul() *zuulsim.Zuul {
	e.t.Helper()
	return e.zuulSession(4)
}

func (e *env) zuulSession(seconds float64) *zuulsim.Zuul {
	e.t.Helper()
	return zuulsim.Start(e.t, zuulsim.Server{Hosts: e.zk.Hosts(e.chroot), CA: e.zk.CA, Cert: e.zk.Cert, Key: e.zk.Key, SessionTimeout: seconds})
}

// waitFor checks cond on every change of the node and request records,
// and every 20 ms, until the deadline.
func (e *env) waitFor(timeout time.Duration, what string, cond func() bool, more ...waitfor.Option) {
	e.t.Helper()
	opts := append([]waitfor.Option{waitfor.Every(20 * time.Millisecond)}, more...)
	if e.nodes != nil {
		sn, sr := e.nodes.Subscribe(), e.reqs.Subscribe()
		defer e.nodes.Unsubscribe(sn)
		defer e.reqs.Unsubscribe(sr)
		opts = append(opts, waitfor.Changes(sn), waitfor.Changes(sr))
	}
	waitfor.Until(e.t, timeout, what, cond, opts...)
}

// nodeFor waits for the NATS node handed to Zuul as a znode to show in
// the test's view of the records (which may lag the bridge's writes).
func (e *env) nodeFor(zkNode string) kv.Entry[kv.Node] {
	e.t.Helper()
	var n kv.Entry[kv.Node]
	e.waitFor(10*time.Second, "the NATS node of znode "+zkNode, func() bool {
		var ok bool
		n, ok = e.natsNodeOf(zkNode)
		return ok
	})
	return n
}

// natsNodeOf finds the NATS node handed to Zuul as a znode.
func (e *env) natsNodeOf(zkNode string) (kv.Entry[kv.Node], bool) {
	var out kv.Entry[kv.Node]
	found := false
	e.nodes.Range(func(n *kv.Entry[kv.Node]) bool {
		if n.Value.ZooKeeperID == zkNode {
			out, found = *n, true
			return false
		}
		return true
	})
	return out, found
}

// describe lists the node records, for failure messages.
func (e *env) describe() string {
	var b strings.Builder
	e.nodes.Range(func(n *kv.Entry[kv.Node]) bool {
		fmt.Fprintf(&b, "%s %s alloc=%s zk=%s holder=%s\n", n.Key, n.Value.State, n.Value.AllocatedTo, n.Value.ZooKeeperID, n.Value.Holder)
		return true
	})
	e.reqs.Range(func(r *kv.Entry[kv.Request]) bool {
		fmt.Fprintf(&b, "request %s %s nodes=%v reason=%s\n", r.Key, r.Value.State, r.Value.Nodes, r.Value.Reason)
		return true
	})
	return b.String()
}
