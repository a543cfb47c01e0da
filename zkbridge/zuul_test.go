package zkbridge_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// The whole life of a Zuul request, as Zuul's scheduler and executor take
// it: submit, fulfilled with ready nodes in label order, lock (30 s) and
// delete the request, in-use with user_data, used and unlock; the nodes
// are then deleted, in NATS and in ZooKeeper.
func TestZuulRequestLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.installation()
	z := e.zuul()

	var pools []map[string]any
	z.Must(&pools, "registered_pools", nil)
	if len(pools) != 4 {
		t.Fatalf("registered pools: %v", pools)
	}

	id := z.Submit([]string{"small", "large", "small"}, nil)
	r := z.Wait(id, 60*time.Second)
	if r.State != "fulfilled" || len(r.Nodes) != 3 {
		t.Fatalf("request %s: %+v\n%s", id, r, e.describe())
	}
	for i, nid := range r.Nodes {
		n := z.Node(nid)
		if n.State() != "ready" || n["allocated_to"] != id {
			t.Errorf("node %s: %v", nid, n)
		}
		types, _ := n["type"].([]any)
		if len(types) != 1 || types[0] != r.NodeTypes[i] {
			t.Errorf("node %d of %s is %v, want %s", i, id, n["type"], r.NodeTypes[i])
		}
	}
	nodes := z.Accept(id)
	if z.Get(id) != nil {
		t.Fatalf("request %s not deleted", id)
	}
	z.Use(nodes)
	e.waitFor(10*time.Second, "the nodes in-use in NATS", func() bool {
		for _, nid := range nodes {
			n, ok := e.natsNodeOf(nid)
			if !ok || n.Value.State != kv.NodeInUse {
				return false
			}
		}
		return true
	})
	// The NATS request goes once every node is taken.
	e.waitFor(10*time.Second, "the NATS request deleted", func() bool {
		_, ok := e.reqs.Get(zkbridge.NATSRequestID(id))
		return !ok
	})
	z.Return(nodes)
	e.waitFor(10*time.Second, "the nodes deleted", func() bool {
		for _, nid := range nodes {
			if _, ok := e.natsNodeOf(nid); ok || z.Node(nid) != nil {
				return false
			}
		}
		return true
	})
	if slices.Contains(nodes, "") {
		t.Fatal("empty node id")
	}
}
