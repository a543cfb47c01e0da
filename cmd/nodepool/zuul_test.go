package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/internal/zktest"
	"github.com/nodepool-nats/nodepool/internal/zuulsim"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// Nodes launched for a request that ended while they booted stay ready for
// later requests, as in Nodepool; max-ready-age deletes those nobody took,
// so that the kill test ends with nothing left.
const zuulConfig = `
labels:
  - name: small
    max-ready-age: 10
  - name: medium
    max-ready-age: 10
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.1
    delete-delay: 0.02
    flavors:
      - {name: small, cores: 1, ram: 1024}
    pools:
      - name: main
        max-servers: 30
        labels:
          - {name: small, flavor-name: small, cloud-image: ubuntu}
          - {name: medium, flavor-name: small, cloud-image: ubuntu}
`

// zuulSite is a NATS server, a ZooKeeper server of the test's own and
// the nodepool processes serving Zuul there: one launcher, and bridges
// (processes with the zookeeper role alone).
type zuulSite struct {
	t       *testing.T
	zk      *zktest.Server
	nats    *natstest.Server
	store   string
	url     string
	cfg     string
	chroot  string
	mu      sync.Mutex
	bridges map[string]*proc
	rec     *records
}

func startZuulSite(t *testing.T, bridges int) *zuulSite {
	t.Helper()
	store := t.TempDir()
	srv := natstest.StartAt(t, store, -1)
	s := &zuulSite{t: t, zk: zktest.Start(t), nats: srv, store: store, url: srv.ClientURL(), chroot: "/zuul", bridges: map[string]*proc{}}
	s.cfg = writeConfig(t, zuulConfig+s.zk.ConfigYAML(s.chroot)+"zookeeper-timeout: 2\n")
	l := startRun(t, s.env("launcher", "launcher"), "-c", s.cfg)
	l.waitLog("launcher running", 60*time.Second)
	for i := range bridges {
		s.startBridge(fmt.Sprintf("bridge-%d", i))
	}
	s.rec = watchRecords(t, s.url, "cloud1")
	return s
}

// restartNATS stops the NATS server and starts it again on its store and
// port, as a crashed and restarted server.
func (s *zuulSite) restartNATS(down time.Duration) {
	port := s.nats.Addr().(*net.TCPAddr).Port
	s.nats.Shutdown()
	s.nats.WaitForShutdown()
	time.Sleep(down)
	s.nats = natstest.StartAt(s.t, s.store, port)
}

func (s *zuulSite) env(id, roles string) map[string]string {
	return map[string]string{"NODEPOOL_NATS_URL": s.url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": roles,
		"NODEPOOL_HTTP_ADDR": "", "NODEPOOL_LEASE_TTL": "2s", "NODEPOOL_SYNC_INTERVAL": "500ms"}
}

func (s *zuulSite) startBridge(id string) {
	p := startRun(s.t, s.env(id, "zookeeper"), "-c", s.cfg)
	p.waitLog("serving Zuul over ZooKeeper", 60*time.Second)
	s.mu.Lock()
	s.bridges[id] = p
	s.mu.Unlock()
}

func (s *zuulSite) zuul() *zuulsim.Zuul {
	return zuulsim.Start(s.t, zuulsim.Server{Hosts: s.zk.Hosts(s.chroot), CA: s.zk.CA, Cert: s.zk.Cert, Key: s.zk.Key, SessionTimeout: 5})
}

// job is one build as Zuul runs it: request the nodes, wait, lock them
// and delete the request, use them, give them back. It reports the
// nodes (ZooKeeper ids) it got, or what went wrong.
func job(z *zuulsim.Zuul, labels []string, hold time.Duration) ([]string, error) {
	var id string
	if err := z.Call(&id, "submit", map[string]any{"labels": labels}); err != nil {
		return nil, err
	}
	var r zuulsim.Request
	if err := z.Call(&r, "wait", map[string]any{"id": id, "timeout": 180}); err != nil {
		return nil, err
	}
	if r.State != "fulfilled" || len(r.Nodes) != len(labels) {
		return nil, fmt.Errorf("request %s ended %s with %v", id, r.State, r.Nodes)
	}
	var nodes []string
	if err := z.Call(&nodes, "accept", map[string]any{"id": id}); err != nil {
		return nil, fmt.Errorf("request %s: %w", id, err)
	}
	if err := z.Call(nil, "use", map[string]any{"nodes": nodes}); err != nil {
		return nil, err
	}
	time.Sleep(hold)
	return nodes, z.Call(nil, "return_nodes", map[string]any{"nodes": nodes})
}

// Bridges are SIGKILLed and started again every second or so while Zuul
// runs builds through them (four executors, 48 builds); then the
// ZooKeeper server itself is killed and started again with requests in
// flight, and then the NATS server: every request ends fulfilled, no node
// is given to two builds, and once every node is given back, no node is
// left in NATS, in the cloud or in ZooKeeper, and no NATS request of
// Zuul's is left.
func TestZuulKillBridgesAndZooKeeper(t *testing.T) {
	t.Parallel()
	s := startZuulSite(t, 2)
	ctx, stop := context.WithCancel(t.Context())
	chaos := make(chan int)
	go func() {
		kills := 0
		rng := rand.New(rand.NewPCG(1, 2))
		defer func() { chaos <- kills }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(700+rng.IntN(1000)) * time.Millisecond):
			}
			id := fmt.Sprintf("bridge-%d", rng.IntN(2))
			s.mu.Lock()
			p := s.bridges[id]
			s.mu.Unlock()
			_ = p.stop(syscall.SIGKILL, 30*time.Second)
			s.startBridge(id)
			kills++
		}
	}()

	var mu sync.Mutex
	owner := map[string]int{}
	var wg sync.WaitGroup
	for e := range 4 {
		z := s.zuul()
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(e), 9))
			for b := range 12 {
				labels := []string{"small", "medium"}[:1+rng.IntN(2)]
				nodes, err := job(z, labels, time.Duration(200+rng.IntN(800))*time.Millisecond)
				if err != nil {
					t.Errorf("executor %d, build %d: %v", e, b, err)
					return
				}
				mu.Lock()
				for _, n := range nodes {
					if prev, dup := owner[n]; dup {
						t.Errorf("node %s given to executors %d and %d", n, prev, e)
					}
					owner[n] = e
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	stop()
	kills := <-chaos
	t.Logf("%d nodes, %d bridge kills", len(owner), kills)
	if t.Failed() {
		return
	}

	// The ZooKeeper server restarts with requests in flight.
	z := s.zuul()
	var ids []string
	for range 8 {
		var id string
		z.Must(&id, "submit", map[string]any{"labels": []string{"small"}})
		ids = append(ids, id)
	}
	s.zk.Kill()
	time.Sleep(500 * time.Millisecond)
	if err := s.zk.Run(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		r := z.Wait(id, 120*time.Second)
		if r.State != "fulfilled" {
			t.Fatalf("request %s after the ZooKeeper restart: %+v", id, r)
		}
		nodes := z.Accept(id)
		z.Use(nodes)
		z.Return(nodes)
	}

	// The NATS server restarts with requests in flight.
	ids = nil
	for range 8 {
		var id string
		z.Must(&id, "submit", map[string]any{"labels": []string{"medium"}})
		ids = append(ids, id)
	}
	s.restartNATS(time.Second)
	for _, id := range ids {
		r := z.Wait(id, 120*time.Second)
		if r.State != "fulfilled" {
			t.Fatalf("request %s after the NATS restart: %+v", id, r)
		}
		nodes := z.Accept(id)
		z.Use(nodes)
		z.Return(nodes)
	}

	s.rec.until(60*time.Second, "every node gone in NATS and the cloud, and no NATS request of Zuul's", func() bool {
		left := s.rec.nodes.Len() + s.rec.instances.Len()
		s.rec.requests.Range(func(e *kv.Entry[kv.Request]) bool {
			if _, ok := zkbridge.ZKRequestID(e.Key); ok {
				left++
			}
			return true
		})
		return left == 0
	})
	var dump map[string]string
	waitfor.Until(t, 30*time.Second, "no node znode left", func() bool {
		dump = nil
		z.Must(&dump, "dump", nil)
		return len(dump) == 0
	}, waitfor.Every(100*time.Millisecond), waitfor.Detail(func() string {
		var ids []string
		for id := range dump {
			ids = append(ids, id)
		}
		return "node znodes left: " + strings.Join(ids, " ")
	}))
}

// Zuul's requests and nodes are requests and nodes like any other for the
// operator: `nodepool request-list` shows a request Zuul waits on (zk=...),
// `nodepool list` a node Zuul uses, with its holder and ZooKeeper id.
func TestZuulShowsInListings(t *testing.T) {
	t.Parallel()
	s := startZuulSite(t, 1)
	z := s.zuul()
	var id string
	z.Must(&id, "submit", map[string]any{"labels": []string{"small"}})
	r := z.Wait(id, 60*time.Second)
	out, errOut, code := nodepool(t, map[string]string{"NODEPOOL_NATS_URL": s.url}, "request-list")
	if code != 0 || !strings.Contains(out, "zk="+id) || !strings.Contains(out, "fulfilled") {
		t.Errorf("request-list (%d): %s%s", code, out, errOut)
	}
	nodes := z.Accept(id)
	z.Use(nodes)
	s.rec.until(30*time.Second, "the node in use", func() bool { return s.rec.count(kv.NodeInUse) == 1 })
	out, errOut, code = nodepool(t, map[string]string{"NODEPOOL_NATS_URL": s.url}, "list", "--fields", "id,state,holder,zookeeper_id,allocated_to")
	if code != 0 || !strings.Contains(out, r.Nodes[0]) || !strings.Contains(out, "in-use") || !strings.Contains(out, "zuul:"+z.SystemID) || !strings.Contains(out, "zk="+id) {
		t.Errorf("list (%d): %s%s", code, out, errOut)
	}
	z.Return(nodes)
}
