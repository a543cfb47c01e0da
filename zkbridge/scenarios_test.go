package zkbridge_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/internal/zuulsim"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// A request served from ready (min-ready) nodes; the registered pools
// carry every key Nodepool's launchers read of one another.
func TestZuulServedFromReadyNodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.cfg = strings.Replace(e.cfg, "  - name: small\n", "  - name: small\n    min-ready: 2\n", 1)
	e.installation()
	z := e.zuul()
	e.waitFor(30*time.Second, "2 ready small nodes", func() bool { return len(e.readyFree("small")) >= 2 })
	ready := e.readyFree("small")

	var pools []map[string]any
	z.Must(&pools, "registered_pools", nil)
	if len(pools) != 4 {
		t.Fatalf("registered pools: %v", pools)
	}
	for _, p := range pools {
		for _, k := range []string{"hostname", "kind", "state", "version", "model_api", "id", "name", "provider_name", "supported_labels", "priority", "paused"} {
			if _, ok := p[k]; !ok {
				t.Errorf("pool %v lacks %s", p["id"], k)
			}
		}
		if p["kind"] != "pool" || p["state"] != "running" || p["model_api"] != float64(0) {
			t.Errorf("pool %v", p)
		}
	}

	id := z.Submit([]string{"small", "small"}, nil)
	r := z.Wait(id, 30*time.Second)
	if r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}
	for _, nid := range r.Nodes {
		if n := e.nodeFor(nid); !slices.Contains(ready, n.Key) {
			t.Errorf("node %s is not one of the ready nodes %v (%v)", nid, ready, n.Key)
		}
		zn := z.Node(nid)
		if zn["interface_ip"] == nil || zn["connection_port"] != float64(22) || zn["username"] != "zuul" || zn["python_path"] != "auto" {
			t.Errorf("node %s: %v", nid, zn)
		}
		attrs, _ := zn["attributes"].(map[string]any)
		if attrs["executor-zone"] != "zone-a" || zn["provider"] != "fake-cloud" || zn["tenant_name"] != "tenant-one" || zn["requestor"] != z.SystemID {
			t.Errorf("node %s: %v", nid, zn)
		}
		if _, ok := zn["hold_expiration"]; !ok {
			t.Errorf("node %s has no hold_expiration key: Zuul would not write its autohold expiry back", nid)
		}
	}
}

// A request Zuul deletes before it locked its nodes gives them back: ready
// and unallocated in NATS, their znodes gone.
func TestZuulRequestDeletedBeforeLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	id := z.Submit([]string{"small"}, nil)
	r := z.Wait(id, 30*time.Second)
	if r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}
	n := e.nodeFor(r.Nodes[0])
	z.Must(nil, "delete_request", map[string]any{"id": id})
	e.waitFor(10*time.Second, "the node freed and its znode gone", func() bool {
		cur, ok := e.nodes.Get(n.Key)
		return ok && cur.Value.State == kv.NodeReady && cur.Value.AllocatedTo == "" && cur.Value.ZooKeeperID == "" && z.Node(r.Nodes[0]) == nil
	})
	// The freed node serves the next request.
	id2 := z.Submit([]string{"small"}, nil)
	r2 := z.Wait(id2, 30*time.Second)
	if n2 := e.nodeFor(r2.Nodes[0]); n2.Key != n.Key {
		t.Errorf("the freed node %s was not reused (got %s)", n.Key, n2.Key)
	}
}

// A Zuul whose session dies loses the nodes it holds (in-use, unlocked):
// they are deleted. A fulfilled request of it that persists (Zuul >= 4.9)
// keeps its nodes allocated until it is deleted.
func TestZuulSessionLossDeletesItsNodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.killableZuul()
	id := z.Submit([]string{"small", "small"}, nil)
	r := z.Wait(id, 30*time.Second)
	nodes := z.Accept(id)
	z.Use(nodes)
	other := z.Submit([]string{"small"}, nil)
	r2 := z.Wait(other, 30*time.Second)
	e.waitFor(10*time.Second, "the nodes in-use in NATS", func() bool { return e.allState(nodes, kv.NodeInUse) })
	z.Kill() // the session expires after its 4 s timeout
	z2 := e.zuul()
	e.waitFor(30*time.Second, "the lost nodes deleted", func() bool {
		for _, nid := range r.Nodes {
			if _, ok := e.natsNodeOf(nid); ok || z2.Node(nid) != nil {
				return false
			}
		}
		return true
	})
	if n := e.nodeFor(r2.Nodes[0]); n.Value.State != kv.NodeReady || n.Value.AllocatedTo != zkbridge.NATSRequestID(other) {
		t.Errorf("the node of the request that persists: %+v", n.Value)
	}
	if got := z2.Get(other); got == nil || got.State != "fulfilled" {
		t.Errorf("request %s: %+v", other, got)
	}
}

// Autohold: Zuul holds the nodes of a failed job with an expiry; they
// stay held (and counted) until it passes, then go. A hold without an
// expiry ends when Zuul deletes the hold request (the nodes become used).
func TestZuulAutohold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	const job = "tenant-one review.example.org/org/project job .*"

	id := z.Submit([]string{"small"}, nil)
	z.Wait(id, 30*time.Second)
	nodes := z.Accept(id)
	z.Use(nodes)
	// The expiry leaves room for a loaded machine: a hold that expired
	// before the test saw it would end the node first.
	z.Must(nil, "hold", map[string]any{"nodes": nodes, "hold_job": job, "comment": "held for a look", "expiration": 15})
	e.waitFor(12*time.Second, "the node held in NATS", func() bool {
		n, ok := e.natsNodeOf(nodes[0])
		return ok && n.Value.State == kv.NodeHold && n.Value.HoldExpiration != nil && n.Value.HoldJob == job && n.Value.Comment == "held for a look"
	})
	n, _ := e.natsNodeOf(nodes[0])
	if left := time.Until(*n.Value.HoldExpiration); left > 15*time.Second || left < 0 {
		t.Errorf("hold expires in %s, want at most 15 s", left)
	}
	var held int
	z.Must(&held, "held_count", map[string]any{"hold_job": job})
	if held != 1 {
		t.Errorf("held count %d, want 1", held)
	}
	e.waitFor(35*time.Second, "the held node deleted once its hold expired", func() bool {
		_, ok := e.natsNodeOf(nodes[0])
		return !ok && z.Node(nodes[0]) == nil
	})

	id = z.Submit([]string{"small"}, nil)
	z.Wait(id, 30*time.Second)
	nodes = z.Accept(id)
	z.Use(nodes)
	z.Must(nil, "hold", map[string]any{"nodes": nodes, "hold_job": job, "comment": "no expiry"})
	e.waitFor(10*time.Second, "the node held", func() bool {
		n, ok := e.natsNodeOf(nodes[0])
		return ok && n.Value.State == kv.NodeHold && n.Value.HoldExpiration == nil
	})
	var released []string
	z.Must(&released, "release_hold", map[string]any{"nodes": nodes})
	if len(released) != 1 {
		t.Fatalf("released %v", released)
	}
	e.waitFor(20*time.Second, "the released node deleted", func() bool {
		_, ok := e.natsNodeOf(nodes[0])
		return !ok && z.Node(nodes[0]) == nil
	})
}

// A request for a label no pool of the installation has is declined:
// failed when the installation's pools are the only ones registered;
// back to requested when another launcher may serve it, which then
// fails it when it declines too.
func TestZuulDeclines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	p := e.installation()
	z := e.zuul()
	id := z.Submit([]string{"python-only"}, nil)
	r := z.Wait(id, 30*time.Second)
	if r.State != "failed" || len(r.DeclinedBy) != 4 {
		t.Fatalf("request %s: %+v", id, r)
	}
	for _, pid := range []string{zkbridge.PoolID("fake-cloud", "main"), zkbridge.PoolID("fake-cloud", "big"), zkbridge.PoolID("slow-cloud", "main")} {
		if !slices.Contains(r.DeclinedBy, pid) {
			t.Errorf("declined_by %v lacks %s", r.DeclinedBy, pid)
		}
	}
	// Two labels that no one pool has together are declined too.
	id = z.Submit([]string{"small", "slow"}, nil)
	if r := z.Wait(id, 30*time.Second); r.State != "failed" {
		t.Fatalf("request %s: %+v", id, r)
	}

	py := e.zuul()
	py.Must(nil, "register_pool", map[string]any{"id": "python-PoolWorker.python-cloud-main-1", "provider": "python-cloud", "labels": []string{"python-only"}})
	e.waitFor(10*time.Second, "the other launcher's pool seen", func() bool {
		return slices.Contains(p.Bridge().PoolIDsForTest(), "python-PoolWorker.python-cloud-main-1")
	})
	id = z.Submit([]string{"python-only"}, nil)
	var got *zuulsim.Request
	e.waitFor(20*time.Second, "the installation's decline", func() bool {
		got = z.Get(id)
		return got != nil && len(got.DeclinedBy) == 4
	})
	if got.State != "requested" {
		t.Fatalf("request %s after the installation declined: %+v", id, got)
	}
	// The bridge writes its decline under the request's lock and lets it
	// go a moment later; Nodepool's launcher, which does not wait for a
	// lock either, tries again on its next pass.
	var state string
	e.waitFor(10*time.Second, "the other launcher's decline past the bridge's lock", func() bool {
		py.Must(&state, "decline", map[string]any{"id": id, "launcher_id": "python-PoolWorker.python-cloud-main-1"})
		return state != "locked"
	})
	if state != "failed" {
		t.Fatalf("after every pool declined: %s", state)
	}
}

// Requests wait at quota in Nodepool's order of service: priority prefix,
// then relative_priority (which Zuul may revise while they wait: the
// bridge does not lock a request that waits), then submission.
func TestZuulOrderOfService(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	// Fill the tiny pool (max-servers 1).
	first := z.Submit([]string{"tiny"}, map[string]any{"priority": 100})
	z.Wait(first, 30*time.Second)
	busy := z.Accept(first)
	z.Use(busy)
	type sub struct {
		name     string
		priority int
		rel      int
	}
	subs := []sub{{"a", 300, 0}, {"b", 200, 0}, {"c", 200, -1}, {"d", 100, 0}, {"e", 200, 5}}
	ids := map[string]string{}
	for _, s := range subs {
		ids[s.name] = z.Submit([]string{"tiny"}, map[string]any{"priority": s.priority, "relative_priority": s.rel})
	}
	e.waitFor(20*time.Second, "every request waiting in NATS", func() bool {
		for _, id := range ids {
			r, ok := e.reqs.Get(zkbridge.NATSRequestID(id))
			if !ok || r.Value.State != kv.RequestRequested {
				return false
			}
		}
		return true
	})
	var revised string
	z.Must(&revised, "revise", map[string]any{"id": ids["e"], "relative_priority": -5})
	if revised != "revised" {
		t.Fatalf("revising the priority of a waiting request: %s", revised)
	}
	e.waitFor(10*time.Second, "the revision in NATS", func() bool {
		r, ok := e.reqs.Get(zkbridge.NATSRequestID(ids["e"]))
		return ok && r.Value.RelativePriority == -5
	})
	for _, want := range []string{"d", "e", "c", "b", "a"} {
		z.Return(busy)
		r := z.Wait(ids[want], 30*time.Second)
		if r.State != "fulfilled" {
			t.Fatalf("request %s: %+v", want, r)
		}
		for name, id := range ids {
			if name == want {
				continue
			}
			if got := z.Get(id); got != nil && got.State == "fulfilled" {
				t.Fatalf("request %s was fulfilled before %s", name, want)
			}
		}
		busy = z.Accept(ids[want])
		z.Use(busy)
		delete(ids, want)
	}
}

// helpers

// readyFree lists the ready, unallocated NATS nodes of a label.
func (e *env) readyFree(label string) []string {
	var out []string
	e.nodes.Range(func(n *kv.Entry[kv.Node]) bool {
		if n.Value.State == kv.NodeReady && n.Value.AllocatedTo == "" && slices.Contains(n.Value.Labels, label) {
			out = append(out, n.Key)
		}
		return true
	})
	return out
}

// allState reports whether the NATS nodes of these znodes are all in a
// state.
func (e *env) allState(zkNodes []string, s kv.NodeState) bool {
	for _, nid := range zkNodes {
		n, ok := e.natsNodeOf(nid)
		if !ok || n.Value.State != s {
			return false
		}
	}
	return true
}

var _ = fmt.Sprint
var _ = config.RoleLauncher

// A Zuul before 4.9 writes ephemeral requests: when its session ends,
// the request vanishes, and the nodes it did not lock go back.
func TestZuulEphemeralRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.killableZuul()
	id := z.Submit([]string{"small"}, map[string]any{"ephemeral": true})
	r := z.Wait(id, 30*time.Second)
	if r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}
	n := e.nodeFor(r.Nodes[0])
	if err := z.Call(nil, "stop", nil); err != nil {
		t.Logf("Zuul's session did not close cleanly (%v): it expires after its timeout", err)
	}
	z.Kill()
	z2 := e.zuul()
	e.waitFor(20*time.Second, "the node freed", func() bool {
		cur, ok := e.nodes.Get(n.Key)
		return ok && cur.Value.AllocatedTo == "" && cur.Value.ZooKeeperID == "" && z2.Node(r.Nodes[0]) == nil
	}, waitfor.Detail(func() string {
		cur, _ := e.nodes.Get(n.Key)
		nr, ok := e.reqs.Get(zkbridge.NATSRequestID(id))
		return fmt.Sprintf("node %s: %s allocated to %q, znode %q; Zuul sees the znode: %+v; the ZooKeeper request: %+v; its NATS request: %v %+v",
			n.Key, cur.Value.State, cur.Value.AllocatedTo, cur.Value.ZooKeeperID, z2.Node(r.Nodes[0]), z2.Get(id), ok, nr.Value)
	}))
	if z2.Get(id) != nil {
		t.Errorf("ephemeral request %s outlived its session", id)
	}
}

// Locks are kazoo's both ways: a request another contender holds locked
// is not claimed until it is released; a request the bridge holds while
// its node boots cannot be locked by another kazoo client.
func TestZuulLockInterplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	other := e.zuul()

	id := z.Submit([]string{"small"}, nil)
	var locked bool
	other.Must(&locked, "lock_request", map[string]any{"id": id})
	if !locked {
		// The bridge got there first: fine, but then this half of the
		// test checks nothing; the request must end fulfilled anyway.
		t.Log("the bridge locked the request before the other contender")
	} else {
		e.waitFor(20*time.Second, "the NATS request served", func() bool {
			r, ok := e.reqs.Get(zkbridge.NATSRequestID(id))
			return ok && r.Value.State == kv.RequestFulfilled
		})
		time.Sleep(300 * time.Millisecond) // the bridge tries, and must keep off
		if r := z.Get(id); r.State != "requested" {
			t.Fatalf("request %s claimed under another contender's lock: %+v", id, r)
		}
		other.Must(nil, "unlock_request", map[string]any{"id": id})
	}
	if r := z.Wait(id, 20*time.Second); r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}

	// A slow boot (2 s): pending, under the bridge's lock.
	id = z.Submit([]string{"slow"}, nil)
	e.waitFor(20*time.Second, "the request pending", func() bool {
		r := z.Get(id)
		return r != nil && r.State == "pending"
	})
	var contenders []string
	other.Must(&contenders, "lock_contenders", map[string]any{"path": "/nodepool/requests-lock/" + id})
	if len(contenders) != 1 || !strings.Contains(contenders[0], "__lock__") {
		t.Errorf("contenders of a pending request: %v", contenders)
	}
	other.Must(&locked, "lock_request", map[string]any{"id": id})
	if locked {
		t.Fatalf("another kazoo client locked request %s while the bridge held it", id)
	}
	if r := z.Wait(id, 30*time.Second); r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}
	// The bridge writes fulfilled, then unlocks (as Nodepool's launchers
	// do): the lock goes a moment after Zuul sees the request fulfilled.
	e.waitFor(10*time.Second, "the request unlocked once fulfilled", func() bool {
		other.Must(&locked, "lock_request", map[string]any{"id": id})
		return locked
	})
	other.Must(nil, "unlock_request", map[string]any{"id": id})
}

// Tenant limits count Zuul's requests by tenant_name, beside NATS
// clients' requests of the same tenant.
func TestZuulTenantLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "tenant-resource-limits:\n  - tenant-name: tenant-one\n    max-servers: 1\n")
	e.installation()
	z := e.zuul()
	id1 := z.Submit([]string{"small"}, nil)
	r1 := z.Wait(id1, 30*time.Second)
	nodes := z.Accept(id1)
	z.Use(nodes)
	if n := e.nodeFor(r1.Nodes[0]); n.Value.Tenant != "tenant-one" {
		t.Errorf("node tenant %q", n.Value.Tenant)
	}
	id2 := z.Submit([]string{"small"}, nil)
	other := z.Submit([]string{"small"}, map[string]any{"tenant": "tenant-two"})
	if r := z.Wait(other, 30*time.Second); r.State != "fulfilled" {
		t.Fatalf("another tenant's request: %+v", r)
	}
	if r := z.Get(id2); r.State != "requested" {
		t.Fatalf("tenant-one's second request served over its limit: %+v", r)
	}
	z.Return(nodes)
	if r := z.Wait(id2, 30*time.Second); r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id2, r)
	}
}

// Records no one should have written (a request that is not JSON, one
// without node_types, one in a state that does not exist, a node znode of
// garbage under one of the installation's providers) stop nothing: the
// next request is served.
func TestZuulBadRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	for _, data := range []string{`{not json`, `{"state": "requested"}`, `{"state": "exploding", "node_types": ["small"]}`, `[]`, `null`, `{"state": "requested", "node_types": "small"}`} {
		z.Must(nil, "raw_create", map[string]any{"path": "/nodepool/requests/200-", "data": data, "sequence": true})
	}
	z.Must(nil, "raw_create", map[string]any{"path": "/nodepool/nodes/", "data": `{"provider": "fake-cloud", "state": 7}`, "sequence": true})
	z.Must(nil, "raw_create", map[string]any{"path": "/nodepool/requests/not-a-request", "data": `{}`})
	id := z.Submit([]string{"small"}, nil)
	if r := z.Wait(id, 30*time.Second); r.State != "fulfilled" {
		t.Fatalf("request %s: %+v", id, r)
	}
}

// Several bridge processes serve one ensemble: every request is served
// once, every node handed out once, no znode is made twice.
func TestSeveralBridges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.start("launcher", config.RoleLauncher)
	for i := range 3 {
		e.start(fmt.Sprintf("bridge-%d", i), config.RoleZooKeeper)
	}
	z := e.zuul()
	var ids []string
	for range 10 { // the pool's max-servers
		ids = append(ids, z.Submit([]string{"small"}, nil))
	}
	seen := map[string]string{}
	for _, id := range ids {
		r := z.Wait(id, 60*time.Second)
		if r.State != "fulfilled" || len(r.Nodes) != 1 {
			t.Fatalf("request %s: %+v", id, r)
		}
		if prev, dup := seen[r.Nodes[0]]; dup {
			t.Fatalf("node %s given to %s and %s", r.Nodes[0], prev, id)
		}
		seen[r.Nodes[0]] = id
		// The test's view of the records may lag the bridge's writes.
		e.waitFor(10*time.Second, "node "+r.Nodes[0]+" recorded for "+id, func() bool {
			n, ok := e.natsNodeOf(r.Nodes[0])
			return ok && n.Value.AllocatedTo == zkbridge.NATSRequestID(id)
		})
	}
	var dump map[string]string
	z.Must(&dump, "dump", nil)
	if len(dump) != len(ids) {
		t.Errorf("%d node znodes for %d nodes: %v", len(dump), len(ids), dump)
	}
	for _, id := range ids {
		nodes := z.Accept(id)
		z.Use(nodes)
		z.Return(nodes)
	}
	e.waitFor(30*time.Second, "every node deleted", func() bool {
		dump = nil
		z.Must(&dump, "dump", nil)
		return len(dump) == 0
	})
}

// Another launcher's nodes (a Python Nodepool's, of a provider this file
// does not have) are never touched, whatever their state.
func TestForeignNodesUntouched(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()
	py := e.zuul()
	py.Must(nil, "register_pool", map[string]any{"id": "python-PoolWorker.python-cloud-main-1", "provider": "python-cloud", "labels": []string{"python-only"}})
	var foreign []string
	for _, st := range []string{"used", "in-use", "ready", "deleting"} {
		var id string
		py.Must(&id, "make_node", map[string]any{"provider": "python-cloud", "label": "python-only", "state": st, "allocated_to": "200-0099999999"})
		foreign = append(foreign, id)
	}
	// A request for a label only the other launcher serves is declined,
	// not failed, and left to it.
	id := z.Submit([]string{"python-only"}, nil)
	e.waitFor(20*time.Second, "the installation's decline", func() bool {
		r := z.Get(id)
		return r != nil && len(r.DeclinedBy) == 4
	})
	// Several sweeps (500 ms each) later, the foreign nodes are as they were.
	id2 := z.Submit([]string{"small"}, nil)
	z.Wait(id2, 30*time.Second)
	time.Sleep(2 * time.Second)
	for _, nid := range foreign {
		if n := z.Node(nid); n == nil {
			t.Errorf("foreign node %s was deleted", nid)
		}
	}
	if r := z.Get(id); r.State != "requested" {
		t.Errorf("request for the other launcher's label: %+v", r)
	}
}

// A reload registers the pools as the new file has them: a pool turned
// off (max-servers 0, the first step of moving a provider back to a
// Python launcher) is no longer advertised, and requests for its labels
// are declined.
func TestBridgeReload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	p := e.installation()
	z := e.zuul()
	var pools []map[string]any
	z.Must(&pools, "registered_pools", nil)
	if len(pools) != 4 {
		t.Fatalf("registered pools: %v", pools)
	}
	text := strings.Replace(e.cfg, "        max-servers: 1\n", "        max-servers: 0\n", 1)
	cfg, err := config.Parse("nodepool.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	e.waitFor(20*time.Second, "the tiny pool unregistered", func() bool {
		pools = nil
		z.Must(&pools, "registered_pools", nil)
		return len(pools) == 3
	})
	for _, pc := range pools {
		if pc["provider_name"] == "tiny-cloud" {
			t.Errorf("tiny-cloud still registered: %v", pc)
		}
	}
	id := z.Submit([]string{"tiny"}, nil)
	if r := z.Wait(id, 30*time.Second); r.State != "failed" {
		t.Fatalf("request for a label of the pool turned off: %+v", r)
	}
	// A file without zookeeper-servers is refused while the role runs.
	plain, err := config.Parse("nodepool.yaml", []byte(strings.Split(text, "zookeeper-servers:")[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(t.Context(), plain); err == nil || !strings.Contains(err.Error(), "names no zookeeper-servers") {
		t.Errorf("reload without zookeeper-servers: %v", err)
	}
}

// A request's deletion its watch did not deliver is seen by the sweep.
// The bridge is made to know a request ZooKeeper does not have, as a
// watch that missed its deletion leaves it: fulfilled with a node znode
// of the installation's (a real request's). Only the watch could tell it
// was gone, and its NATS request stayed for as long as the process lived
// (a loaded run once left a request of a closed Zuul session so); now
// the sweep withdraws it.
func TestSweepSeesAMissedDeletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	p := e.installation()
	z := e.zuul()
	real := z.Wait(z.Submit([]string{"small"}, nil), 30*time.Second)
	if real.State != "fulfilled" {
		t.Fatalf("request: %+v", real)
	}
	const zkID = "200-0000000777"
	data, err := json.Marshal(map[string]any{"state": "fulfilled", "node_types": []string{"small"}, "requestor": "zuul", "nodes": real.Nodes})
	if err != nil {
		t.Fatal(err)
	}
	p.Bridge().KnowRequestForTest(zkID, data)
	now := time.Now().UTC()
	rec := kv.Request{ID: zkbridge.NATSRequestID(zkID), State: kv.RequestFulfilled, Labels: []string{"small"}, Nodes: []string{},
		DeclinedBy: []string{}, Requestor: "zuul", Priority: 200, Provider: "fake-cloud", Pool: "main", Created: now, StateTime: now}
	if _, err := e.buckets.Requests.Create(t.Context(), rec.ID, &rec); err != nil {
		t.Fatal(err)
	}
	e.waitFor(10*time.Second, "the NATS request seen", func() bool { return e.reqs.Has(rec.ID) })
	e.waitFor(20*time.Second, "the NATS request of the deleted request withdrawn", func() bool {
		return !e.reqs.Has(rec.ID)
	})
}
