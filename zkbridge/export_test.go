package zkbridge

import "time"

// Hooks for the package's external tests.

// LoseTrustForTest makes c behave as a connection down for d (its session
// not trusted once d passes two thirds of its timeout); RegainForTest as
// one connected again with the same session.
func (c *Conn) LoseTrustForTest(d time.Duration) {
	c.connected.Store(false)
	c.since.Store(time.Now().Add(-d).UnixNano())
}

// RegainForTest: see LoseTrustForTest.
func (c *Conn) RegainForTest() { c.connected.Store(true) }

// Timeout is the connection's session timeout.
func (c *Conn) TimeoutForTest() time.Duration { return c.timeout }

// LockKeeper is the part of a bridge that keeps its request locks.
type LockKeeper struct{ br *Bridge }

// NewLockKeeperForTest is a bridge on c that only keeps request locks.
func NewLockKeeperForTest(c *Conn) LockKeeper {
	return LockKeeper{&Bridge{conn: c, held: map[string]*Lock{}}}
}

// Hold and Held are the bridge's hold and heldLock.
func (k LockKeeper) Hold(id string, l *Lock) { k.br.hold(id, l) }
func (k LockKeeper) Held(id string) *Lock    { return k.br.heldLock(id) }

// SessionChanged is what the bridge does on the notice of a new session
// about its locks.
func (k LockKeeper) SessionChanged() { k.br.dropLocksOfOtherSessions() }

// OfSessionForTest is l as if taken under another session.
func (l *Lock) OfSessionForTest(session int64) *Lock {
	forged := *l
	forged.session = session
	return &forged
}

// KnowRequestForTest records a request znode as read (data), as a watch
// that then missed its deletion leaves it.
func (br *Bridge) KnowRequestForTest(id string, data []byte) {
	zr := &zrequest{ctime: time.Now().UnixMilli()}
	zr.rec, zr.err = ParseRequest(data)
	br.tree.mu.Lock()
	br.tree.requests[id] = zr
	br.tree.mu.Unlock()
}

// PoolIDsForTest lists the ids of the pools the bridge has seen
// registered (its own and other launchers').
func (br *Bridge) PoolIDsForTest() []string { return br.pools.ids() }
