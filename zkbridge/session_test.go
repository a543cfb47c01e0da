package zkbridge_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
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

// A request lock survives a disconnection its session survives: while the
// connection is down for longer than the bridge trusts its session (two
// thirds of the timeout) the lock is not used, and once the connection is
// back with the same session it is the bridge's again. The bridge dropped
// it while it could not trust it; its contender, still in ZooKeeper and
// still its session's, was then taken for another bridge process's, and
// the request stayed pending for as long as the session lived (seen in
// TestZuulKillBridgesAndZooKeeper after a ZooKeeper restart). A lock whose
// contender is this session's is found again by OwnedLock; another
// session's is not.
func TestRequestLockKeptAcrossADisconnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	c := newZuulClient(t, e).c
	other := newZuulClient(t, e).c
	const dir = zkbridge.RequestLocksPath + "/200-0000000001"
	l, err := c.TryLock(dir, zkbridge.LockIdentifierPrefix+"test")
	if err != nil {
		t.Fatal(err)
	}
	k := zkbridge.NewLockKeeperForTest(c)
	k.Hold("200-0000000001", l)

	c.LoseTrustForTest(c.TimeoutForTest())
	if got := k.Held("200-0000000001"); got != nil {
		t.Fatal("a lock was used while its session could not be trusted")
	}
	c.RegainForTest()
	if got := k.Held("200-0000000001"); got != l {
		t.Fatalf("after the connection came back with the same session, the lock held is %v, want the one taken", got)
	}

	owned, err := c.OwnedLock(dir)
	if err != nil || owned == nil || owned.Node() != l.Node() {
		t.Fatalf("OwnedLock of this session's contender: %v %v, want %s", owned, err, l.Node())
	}
	if owned, err := other.OwnedLock(dir); err != nil || owned != nil {
		t.Fatalf("OwnedLock from another session: %v %v, want none", owned, err)
	}
}

// A contender of this session that no lock of the process holds (a lock
// taken by a request whose answer the connection lost, or dropped while
// the session could not be trusted) blocks every contender for as long as
// the session lives, this process's own TryLock included: a request stayed
// "requested" for two minutes after a ZooKeeper restart in
// TestZuulKillBridgesAndZooKeeper, both bridges finding it "locked by
// another contender". AdoptOrphan gives such a lock to the process; it
// never gives one a lock of this process holds, nor another session's.
func TestOrphanedLockIsAdopted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	c := newZuulClient(t, e).c
	other := newZuulClient(t, e).c
	const held = zkbridge.RequestLocksPath + "/200-0000000001"
	l, err := c.TryLock(held, zkbridge.LockIdentifierPrefix+"test")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.AdoptOrphan(held); err != nil || got != nil {
		t.Fatalf("AdoptOrphan of a lock this process holds: %v %v, want none", got, err)
	}

	const dir = zkbridge.RequestLocksPath + "/200-0000000002"
	orphan, err := c.Create(dir+"/0123456789abcdef0123456789abcdef__lock__", []byte(zkbridge.LockIdentifierPrefix+"test"), zk.FlagEphemeral|zk.FlagSequence)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(dir, zkbridge.LockIdentifierPrefix+"test"); !errors.Is(err, zkbridge.ErrLocked) {
		t.Fatalf("TryLock behind this session's orphan: %v, want ErrLocked", err)
	}
	if got, err := other.AdoptOrphan(dir); err != nil || got != nil {
		t.Fatalf("AdoptOrphan from another session: %v %v, want none", got, err)
	}
	adopted, err := c.AdoptOrphan(dir)
	if err != nil || adopted == nil || dir+"/"+adopted.Node() != orphan {
		t.Fatalf("AdoptOrphan: %v %v, want the orphan %s", adopted, err, orphan)
	}
	if got, err := c.AdoptOrphan(dir); err != nil || got != nil {
		t.Fatalf("AdoptOrphan of a lock adopted already: %v %v, want none", got, err)
	}
	if err := adopted.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := other.TryLock(dir, zkbridge.LockIdentifierPrefix+"other")
	if err != nil {
		t.Fatalf("TryLock once the adopted orphan was released: %v", err)
	}
	_ = again.Release()
	_ = l.Release()
}

// A contender whose release failed (the connection down) is left to be
// withdrawn once the connection is back: it must not be adopted as an
// orphan meanwhile, or the withdrawal deletes it under the process that
// adopted it, and another session's contender holds the lock beside it
// (two bridges fulfilled one request after a ZooKeeper restart in
// TestZuulKillBridgesAndZooKeeper).
func TestLockBeingWithdrawnIsNotAdopted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	proxy := e.zk.Proxy(t)
	cfg, err := config.Parse("z.yaml", []byte("labels: []\n"+e.zk.ConfigYAMLVia(proxy, e.chroot)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := zkbridge.Dial(t.Context(), cfg.ZooKeeper(), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	other := newZuulClient(t, e).c
	const dir = zkbridge.RequestLocksPath + "/200-0000000003"
	l, err := c.TryLock(dir, zkbridge.LockIdentifierPrefix+"test")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	if err := l.Release(); err == nil {
		t.Fatal("a release with the connection cut succeeded")
	}
	proxy.Restore()
	waitfor.Until(t, 20*time.Second, "the connection back, the session trusted", func() bool {
		_, _, err := c.Children(zkbridge.RequestLocksPath)
		return err == nil && c.Trusted()
	})
	if got, err := c.AdoptOrphan(dir); err != nil || got != nil {
		t.Fatalf("AdoptOrphan of a contender being withdrawn: %v %v, want none", got, err)
	}
	if left := c.Withdrawn(); left != 0 {
		t.Fatalf("%d contenders left to withdraw", left)
	}
	again, err := other.TryLock(dir, zkbridge.LockIdentifierPrefix+"other")
	if err != nil {
		t.Fatalf("TryLock once the contender was withdrawn: %v", err)
	}
	_ = again.Release()
}

// The notice of a new session comes after the bridge's workers may have
// taken locks under it (the pools are registered again first). Those
// locks are the bridge's: the notice drops only the locks of other
// sessions, and what it drops is no longer counted as held by a step of
// the process, so that an orphaned contender of it can be adopted. When
// the notice dropped every lock, a lock of the new session was lost but
// still counted as held: neither bridge could take the request again
// while the session lived (TestZuulKillBridgesAndZooKeeper after the
// ZooKeeper restart, a loaded run at 79d9a9e: two requests pending or
// requested for 120 s, "locked by another contender").
func TestNewSessionsLocksSurviveItsLateNotice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	c := newZuulClient(t, e).c
	k := zkbridge.NewLockKeeperForTest(c)

	const current = zkbridge.RequestLocksPath + "/200-0000000004"
	l, err := c.TryLock(current, zkbridge.LockIdentifierPrefix+"test")
	if err != nil {
		t.Fatal(err)
	}
	k.Hold("200-0000000004", l)

	// A lock the process holds whose Lock says an older session (its
	// contender is this session's, so that what the drop leaves can be
	// seen through AdoptOrphan).
	const old = zkbridge.RequestLocksPath + "/200-0000000005"
	taken, err := c.TryLock(old, zkbridge.LockIdentifierPrefix+"test")
	if err != nil {
		t.Fatal(err)
	}
	k.Hold("200-0000000005", taken.OfSessionForTest(c.Session()+1))

	k.SessionChanged()
	if got := k.Held("200-0000000004"); got != l {
		t.Fatalf("after the late notice of its session, the lock held is %v, want the one taken under it", got)
	}
	if got, err := c.AdoptOrphan(current); err != nil || got != nil {
		t.Fatalf("AdoptOrphan of a lock still held: %v %v, want none", got, err)
	}
	if got := k.Held("200-0000000005"); got != nil {
		t.Fatalf("a lock of another session is still held after the notice: %v", got)
	}
	adopted, err := c.AdoptOrphan(old)
	if err != nil || adopted == nil || adopted.Node() != taken.Node() {
		t.Fatalf("AdoptOrphan of the contender of a dropped lock: %v %v, want %s (it must not stay counted as held)", adopted, err, taken.Node())
	}
	_ = adopted.Release()
	_ = l.Release()
}
