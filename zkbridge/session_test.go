package zkbridge_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// A bridge whose ZooKeeper session expires (cut off for longer than its
// timeout) loses its locks and registrations with it; back, it registers
// its pools again and takes up the request it held pending, which ends
// fulfilled. While it was away, another kazoo client could lock that
// request: the lock was really gone.
func TestBridgeSessionExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	proxy := e.zk.Proxy(t)
	e.cfg = fmt.Sprintf(baseConfig, e.zk.ConfigYAMLVia(proxy, e.chroot)+"zookeeper-timeout: 2\n")
	e.installation()
	z := e.zuul()
	other := e.zuul()

	id := z.Submit([]string{"slow"}, nil) // boots in 2 s
	e.waitFor(20*time.Second, "the request pending", func() bool {
		r := z.Get(id)
		return r != nil && r.State == "pending"
	})
	proxy.Cut()
	var pools []map[string]any
	e.waitFor(20*time.Second, "the bridge's session expired (its pools unregistered)", func() bool {
		pools = nil
		z.Must(&pools, "registered_pools", nil)
		return len(pools) == 0
	})
	var locked bool
	other.Must(&locked, "lock_request", map[string]any{"id": id})
	if !locked {
		t.Fatal("the request lock outlived the bridge's session")
	}
	other.Must(nil, "unlock_request", map[string]any{"id": id})
	e.waitFor(20*time.Second, "the node ready in NATS", func() bool {
		r, ok := e.reqs.Get(zkbridge.NATSRequestID(id))
		return ok && r.Value.State == kv.RequestFulfilled
	})
	proxy.Restore()
	r := z.Wait(id, 30*time.Second)
	if r.State != "fulfilled" || len(r.Nodes) != 1 {
		t.Fatalf("request %s: %+v", id, r)
	}
	e.waitFor(20*time.Second, "the pools registered again", func() bool {
		pools = nil
		z.Must(&pools, "registered_pools", nil)
		return len(pools) == 4
	})
	nodes := z.Accept(id)
	z.Use(nodes)
	z.Return(nodes)
	e.waitFor(20*time.Second, "the node deleted", func() bool {
		_, ok := e.natsNodeOf(nodes[0])
		return !ok && z.Node(nodes[0]) == nil
	})
}
