package zkbridge

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
)

// Locks here are kazoo's Lock recipe, which Zuul and Nodepool use for every
// request and node lock: a contender is an ephemeral sequential child of
// the lock's directory named <uuid4 hex>__lock__<10-digit sequence>, its
// data the holder's identifier; the contender with the lowest sequence
// holds the lock. (go-zookeeper's own Lock names its contenders otherwise,
// and kazoo would not see them.)

// contenderRE matches a contender's name, as kazoo's Lock does.
var contenderRE = regexp.MustCompile(`__lock__(-?\d{10})$`)

// Contender is one contender of a lock.
type Contender struct {
	Name string // the child's name
	Seq  string // its sequence, as kazoo sorts it
}

// Contenders lists a lock directory's contenders, lowest sequence
// (the holder) first; a directory that does not exist has none.
func (c *Conn) Contenders(dir string) ([]Contender, error) {
	children, _, err := c.Children(dir)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return contenders(children), nil
}

func contenders(children []string) []Contender {
	var out []Contender
	for _, ch := range children {
		if m := contenderRE.FindStringSubmatch(ch); m != nil {
			out = append(out, Contender{Name: ch, Seq: m[1]})
		}
	}
	slices.SortFunc(out, func(a, b Contender) int { return strings.Compare(a.Seq, b.Seq) })
	return out
}

// Lock is a lock this session holds.
type Lock struct {
	c       *Conn
	dir     string
	node    string // the contender's name
	session int64
}

// Dir is the lock's directory.
func (l *Lock) Dir() string { return l.dir }

// Node is the name of this holder's contender.
func (l *Lock) Node() string { return l.node }

// Valid reports whether the lock is still held: its session is the
// current one and can be trusted (see Conn.Trusted).
func (l *Lock) Valid() bool { return l.session == l.c.Session() && l.c.Trusted() }

// ErrLocked says another contender holds the lock.
var ErrLocked = errors.New("locked by another contender")

// TryLock takes the lock of dir without waiting (kazoo's
// acquire(blocking=False)): it adds a contender and holds the lock if that
// contender is the lowest; otherwise it withdraws it and returns
// ErrLocked. identifier is the contender's data (who holds it).
func (c *Conn) TryLock(dir, identifier string) (*Lock, error) {
	return c.tryLock(dir, identifier, true)
}

// TryLockNode is TryLock on the lock of a node znode: the znode itself is
// never made (kazoo's lock would make it again, empty, when it is being
// deleted: the bridge does not); a node that is gone is zk.ErrNoNode.
func (c *Conn) TryLockNode(zkNode, identifier string) (*Lock, error) {
	return c.tryLock(NodesPath+"/"+zkNode+"/lock", identifier, false)
}

func (c *Conn) tryLock(dir, identifier string, makeParents bool) (*Lock, error) {
	session := c.Session()
	if session == 0 || !c.Trusted() {
		return nil, zk.ErrNoServer
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40 // a version 4 UUID, as kazoo's uuid4()
	id[8] = id[8]&0x3f | 0x80
	prefix := hex.EncodeToString(id[:]) + "__lock__"
	var created string
	var err error
	if makeParents {
		created, err = c.Create(dir+"/"+prefix, []byte(identifier), zk.FlagEphemeral|zk.FlagSequence)
	} else {
		created, err = c.createInDir(dir, prefix, []byte(identifier))
	}
	if err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return nil, err
		}
		// The server may have made it before the answer was lost: find
		// it by its unique prefix and withdraw it, so it does not block
		// every other contender for as long as this session lives.
		c.withdraw(dir, prefix)
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	if c.Session() != session {
		// go-zookeeper sends a request it could not send before a
		// session expired in the next session (when the reconnection
		// goes to another server of the ensemble without dropping what
		// was queued): the contender may be the new session's, while
		// the lock would say the old one's and be forgotten as gone,
		// its contender left to block the lock for as long as the new
		// session lives. It is withdrawn instead, and the caller tries
		// again under the new session.
		c.withdraw(dir, prefix)
		return nil, fmt.Errorf("locking %s: the session changed meanwhile: %w", dir, zk.ErrSessionExpired)
	}
	node := strings.TrimPrefix(created, dir+"/")
	children, _, err := c.Children(dir)
	if err != nil {
		c.withdraw(dir, prefix)
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	all := contenders(children)
	if len(all) == 0 || all[0].Name != node {
		if err := c.Delete(dir+"/"+node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			c.withdraw(dir, prefix)
		}
		return nil, ErrLocked
	}
	c.track(dir, node, true)
	return &Lock{c: c, dir: dir, node: node, session: session}, nil
}

// track records a contender as held by a Lock of this process (live) or
// no longer.
func (c *Conn) track(dir, node string, live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !live {
		delete(c.live, dir+"/"+node)
		return
	}
	if c.live == nil {
		c.live = map[string]bool{}
	}
	c.live[dir+"/"+node] = true
}

// AdoptOrphan returns the lock of dir when its holder is a contender of
// this session that no lock of this process holds (nil otherwise): one
// this process made and lost track of, such as a lock taken by a request
// whose answer the connection lost, or a lock dropped while the session
// could not be trusted. Such a contender blocks every contender, this
// process's included, for as long as the session lives; the lock is this
// process's to use and release.
func (c *Conn) AdoptOrphan(dir string) (*Lock, error) {
	l, err := c.OwnedLock(dir)
	if err != nil || l == nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := dir + "/" + l.node
	if c.live[key] {
		return nil, nil // held by a step of this process in flight
	}
	if c.doomed[contenderPrefix(l.node)] {
		// A release or a lock attempt that failed left it to be
		// withdrawn: adopted, it would be deleted under its holder, and
		// another process's contender would hold the lock beside it (two
		// bridges on one request after a ZooKeeper restart, loaded run 10
		// at b42f99c). Its withdrawal frees the lock for a fresh attempt.
		return nil, nil
	}
	if c.live == nil {
		c.live = map[string]bool{}
	}
	c.live[key] = true
	return l, nil
}

// withdraw removes this process's contender of prefix in dir, if the
// server made it. When that cannot be done now (the connection is down),
// it is remembered and done again by Withdrawn: a contender left behind
// by a lost answer would otherwise block the lock for as long as this
// session lives (sessions outlive reconnections, and a ZooKeeper server's
// restart).
func (c *Conn) withdraw(dir, prefix string) {
	c.mu.Lock()
	if c.doomed == nil {
		c.doomed = map[string]bool{}
	}
	c.doomed[prefix] = true
	c.mu.Unlock()
	done := c.withdrawNow(dir, prefix)
	c.mu.Lock()
	defer c.mu.Unlock()
	if done {
		delete(c.doomed, prefix)
		return
	}
	if c.leftover == nil {
		c.leftover = map[string]string{}
	}
	c.leftover[prefix] = dir
}

func (c *Conn) withdrawNow(dir, prefix string) bool {
	children, _, err := c.Children(dir)
	if errors.Is(err, zk.ErrNoNode) {
		return true
	}
	if err != nil {
		return false
	}
	for _, ch := range children {
		if strings.HasPrefix(ch, prefix) {
			if err := c.Delete(dir+"/"+ch, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return false
			}
		}
	}
	return true
}

// Withdrawn withdraws the contenders that could not be withdrawn when
// their lock attempt failed, and reports how many remain.
func (c *Conn) Withdrawn() int {
	c.mu.Lock()
	left := c.leftover
	c.leftover = nil
	c.mu.Unlock()
	for prefix, dir := range left {
		c.withdraw(dir, prefix)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.leftover)
}

// Release gives the lock up (kazoo's release: its contender is deleted).
// A lock of an expired session is gone already.
func (l *Lock) Release() error {
	l.c.track(l.dir, l.node, false)
	if l.session != l.c.Session() {
		return nil
	}
	err := l.c.Delete(l.dir+"/"+l.node, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		// Done again later: a lock kept by mistake blocks everyone.
		l.c.withdraw(l.dir, contenderPrefix(l.node))
		return fmt.Errorf("unlocking %s: %w", l.dir, err)
	}
	return nil
}

// forget stops counting the lock as held by this process, without a
// call to the server: its contender is gone already (with its session,
// or deleted with its directory).
func (l *Lock) forget() { l.c.track(l.dir, l.node, false) }

// Holder reads the identifier of the contender that holds the lock of dir
// ("" and false when nobody does).
func (c *Conn) Holder(dir string) (string, bool, error) {
	all, err := c.Contenders(dir)
	if err != nil || len(all) == 0 {
		return "", false, err
	}
	data, _, err := c.Get(dir + "/" + all[0].Name)
	if errors.Is(err, zk.ErrNoNode) {
		return c.Holder(dir) // released meanwhile: the next one holds it
	}
	if err != nil {
		return "", false, err
	}
	return string(data), true, nil
}

// OwnedLock returns the lock of dir when its holder is a contender of this
// session (nil when another session holds it, or nobody).
func (c *Conn) OwnedLock(dir string) (*Lock, error) {
	session := c.Session()
	if session == 0 || !c.Trusted() {
		return nil, zk.ErrNoServer
	}
	all, err := c.Contenders(dir)
	if err != nil || len(all) == 0 {
		return nil, err
	}
	_, stat, err := c.Get(dir + "/" + all[0].Name)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return nil, nil // released meanwhile
	case err != nil:
		return nil, err
	case stat.EphemeralOwner != session:
		return nil, nil
	}
	return &Lock{c: c, dir: dir, node: all[0].Name, session: session}, nil
}

// createInDir makes an ephemeral sequential child of dir, making dir (but
// not its parent) if it is missing.
func (c *Conn) createInDir(dir, prefix string, data []byte) (string, error) {
	created, err := c.zk().Create(c.full(dir+"/"+prefix), data, zk.FlagEphemeral|zk.FlagSequence, acl)
	if errors.Is(err, zk.ErrNoNode) {
		if _, err = c.zk().Create(c.full(dir), nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return "", err
		}
		created, err = c.zk().Create(c.full(dir+"/"+prefix), data, zk.FlagEphemeral|zk.FlagSequence, acl)
	}
	if err != nil {
		return "", err
	}
	return c.local(created), nil
}

// contenderPrefix is a contender's name without the sequence number the
// server appended (ten digits): the unique prefix its lock attempt chose.
func contenderPrefix(node string) string {
	if len(node) < 10 {
		return node
	}
	return node[:len(node)-10]
}
