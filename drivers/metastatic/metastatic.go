// Package metastatic carves nodes out of bigger "backing" nodes that it
// requests from other providers through the public request path, as any
// requestor would (requestor NodePool:metastatic:<provider>).
//
// Nothing lives only in memory. A backing node that is ours is in-use, held
// by that requestor, and its user_data holds its slot map (which carved node
// has which slot); a slot is given or freed only by a revision-checked update
// of that record, so two processes can never give one slot twice. Every
// label of the provider with the backing node's label as backing-label
// shares it. Each carved node names its backing node and slot in
// driver_data. A backing request names in requestor_data the carved nodes
// waiting for it. After a restart, or in another process, all of it is read
// back from the records, and checked (records.go): a record the driver did
// not write is refused with a reason, never trusted.
package metastatic

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/record"
)

// Requestor is the requestor name of a metastatic provider's backing
// requests and the holder of its backing nodes.
func Requestor(provider string) string { return "NodePool:metastatic:" + provider }

// pollInterval is how often a waiting create machine looks for a slot.
const pollInterval = 250 * time.Millisecond

// Provider is one metastatic provider.
type Provider struct {
	cfg      *config.Provider
	me       string
	js       jetstream.JetStream
	nodes    drivers.Records[record.Node]
	requests drivers.Records[record.Request]
	log      *slog.Logger
	// clock is the time slots, grace-time, max-age, min-retention-time
	// and the manager's passes go by.
	clock clock.Clock
	// filed are the backing requests this process published whose
	// records have not shown up yet (manager.filed). They outlive a term
	// of the manager: a lease lost and taken again (a busy process
	// renewing late) must not publish the same requests again.
	filed map[string]filed

	stopNodes, stopRequests func()
}

// Options are what a metastatic provider is made with besides its
// configuration.
type Options struct {
	// Nodes and Requests are the process's views of the node and request
	// records, shared with its roles; the provider writes its backing
	// nodes' slot maps and deletes its backing requests through them.
	Nodes    drivers.Records[record.Node]
	Requests drivers.Records[record.Request]
	// Clock is the time the provider goes by (nil: the real one): the
	// times written in its slot maps and the grace-time, max-age,
	// min-retention-time and sweeps of its manager, which takes a pass
	// whenever it passes another sync interval.
	Clock clock.Clock
	Log   *slog.Logger
}

// New prepares a metastatic provider and starts following the node and
// request records. It files its backing requests as a requestor does, on
// js; the streams must exist.
func New(js jetstream.JetStream, cfg *config.Provider, o Options) (*Provider, error) {
	if cfg.Driver != "metastatic" {
		return nil, fmt.Errorf("provider %s: driver is %q, not metastatic", cfg.Name, cfg.Driver)
	}
	if o.Nodes == nil || o.Requests == nil {
		return nil, fmt.Errorf("provider %s: no view of the node and request records", cfg.Name)
	}
	if o.Clock == nil {
		o.Clock = clock.Real()
	}
	p := &Provider{
		cfg: cfg, me: Requestor(cfg.Name), js: js, log: o.Log.With("provider", cfg.Name), clock: o.Clock,
		nodes: o.Nodes, requests: o.Requests,
		filed: map[string]filed{},
	}
	p.stopNodes, p.stopRequests = p.nodes.Start(), p.requests.Start()
	return p, nil
}

// Close stops watching.
func (p *Provider) Close() {
	p.stopNodes()
	p.stopRequests()
}

func (p *Provider) synced(ctx context.Context) error {
	if err := p.nodes.WaitSynced(ctx); err != nil {
		return err
	}
	return p.requests.WaitSynced(ctx)
}

// label returns the configuration of a pool's label, if it still exists.
func (p *Provider) label(pool, label string) (*config.PoolLabel, bool) {
	pc, ok := p.cfg.Pool(pool)
	if !ok {
		return nil, false
	}
	for i := range pc.Labels {
		if pc.Labels[i].Name == label {
			return &pc.Labels[i], true
		}
	}
	return nil, false
}

// backingLabel returns the backing label of a pool's label ("" if the
// label is gone from the configuration).
func (p *Provider) backingLabel(pool, label string) string {
	if lc, ok := p.label(pool, label); ok {
		return lc.BackingLabel
	}
	return ""
}

// settings returns how backing nodes of a backing label are shared and
// given back: the keys of the provider's first label with that
// backing-label (labels sharing a backing label agree on them; the
// configuration refuses them otherwise). ok is false when no label of the
// provider uses the backing label any more.
func (p *Provider) settings(backingLabel string) (*config.PoolLabel, bool) {
	if backingLabel == "" {
		return nil, false
	}
	for i := range p.cfg.Pools {
		for j := range p.cfg.Pools[i].Labels {
			if lc := &p.cfg.Pools[i].Labels[j]; lc.BackingLabel == backingLabel {
				return lc, true
			}
		}
	}
	return nil, false
}

// slotsOf is the number of slots of a new backing node of a backing label.
func slotsOf(lc *config.PoolLabel) int { return min(max(lc.MaxParallelJobs, 1), MaxSlots) }

// backing is a backing node of ours with its slot map; group is its label,
// the backing label of the carved labels that share it.
type backing struct {
	record.Entry[record.Node]
	data  BackingData
	group string
}

// held reports whether a node is held by this provider (in-use, holder
// ours): a backing node of ours, whose slot map is read and checked.
// err says why a node we hold has no valid slot map.
func (p *Provider) held(n *record.Node) (d BackingData, held bool, err error) {
	if n.State != record.NodeInUse || n.Holder != p.me {
		return BackingData{}, false, nil
	}
	d, err = decodeBacking(n.UserData)
	switch {
	case err != nil:
		return d, true, fmt.Errorf("user_data is not a valid slot map: %w", err)
	case d.Owner != p.me:
		return d, true, fmt.Errorf("user_data names owner %q; expected %q", truncate(d.Owner), p.me)
	case len(n.Labels) != 1:
		return d, true, fmt.Errorf("it has %d labels; expected the one backing label", len(n.Labels))
	}
	return d, true, nil
}

// owned reports whether a node is one of our backing nodes with a valid
// slot map, and its data.
func (p *Provider) owned(n *record.Node) (BackingData, bool) {
	d, held, err := p.held(n)
	return d, held && err == nil
}

// backings lists our backing nodes.
func (p *Provider) backings() []backing {
	var out []backing
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		if d, ok := p.owned(&e.Value); ok {
			out = append(out, backing{Entry: *e, data: d, group: e.Value.Labels[0]})
		}
		return true
	})
	return out
}

// retired reports whether a backing node takes no new slots and is given
// back once empty: past max-age, failed a host-key check, its instance
// gone or down (instance_down), or no label of the provider uses its
// backing label any more.
func (p *Provider) retired(b *backing, now time.Time) bool {
	lc, ok := p.settings(b.group)
	if !ok || b.data.Failed != "" || b.Value.InstanceDown != "" {
		return true
	}
	return lc.MaxAge > 0 && now.Sub(b.Value.Created) >= lc.MaxAge.D()
}

// errNoSlot: the backing node has no free slot (any more).
var errNoSlot = errors.New("no free slot")

// allocate finds a carved node's slot: the one it has already (a resumed
// machine), or a free one on a backing node of its backing label, taken
// with a revision-checked update. It returns "" when there is none, and
// while the node waits for a backing request not yet fulfilled: as in
// Nodepool, a node counted on a backing node that is booting waits for
// it, and leaves the free slots to the nodes the manager counted on them.
func (p *Provider) allocate(ctx context.Context, nodeID, group string) (string, int, error) {
	now := p.clock.Now().UTC()
	all := p.backings()
	for _, b := range all {
		if s := b.data.SlotOf(nodeID); s >= 0 {
			return b.Key, s, nil
		}
	}
	if p.awaitsBackingNode(nodeID) {
		return "", -1, nil
	}
	for _, b := range p.candidates(all, group, now) {
		slot, err := p.takeSlot(ctx, b.Key, nodeID, group)
		switch {
		case err == nil:
			p.log.Debug("slot allocated", "node", nodeID, "backing_node", b.Key, "slot", slot)
			return b.Key, slot, nil
		case errors.Is(err, errNoSlot), errors.Is(err, record.ErrNotFound):
			continue
		default:
			return "", -1, err
		}
	}
	return "", -1, nil
}

// candidates are the backing nodes of a backing label that have a free
// slot and are not retired, in the order they are to be filled: the
// fullest first, so that idle ones empty out and go back, then the oldest.
func (p *Provider) candidates(all []backing, group string, now time.Time) []backing {
	var candidates []backing
	for _, b := range all {
		if b.group == group && b.data.Used() < b.data.Slots && !p.retired(&b, now) {
			candidates = append(candidates, b)
		}
	}
	slices.SortFunc(candidates, func(a, b backing) int {
		if a.data.Used() != b.data.Used() {
			return b.data.Used() - a.data.Used()
		}
		return a.Value.Created.Compare(b.Value.Created)
	})
	return candidates
}

// takeSlot gives a carved node a free slot of a backing node, with a
// revision-checked update; errNoSlot says it has none (any more).
func (p *Provider) takeSlot(ctx context.Context, backingNode, nodeID, group string) (int, error) {
	slot := -1
	_, err := p.nodes.Modify(ctx, backingNode, func(n *record.Node) error {
		d, ok := p.owned(n)
		if !ok || n.Labels[0] != group || d.Failed != "" || n.InstanceDown != "" {
			return errNoSlot
		}
		if slot = d.allocate(nodeID, p.waiting); slot < 0 {
			return errNoSlot
		}
		n.UserData = encodeJSON(d)
		return nil
	})
	return slot, err
}

// waiting reports whether a carved node still waits for its slot (its
// record is building).
func (p *Provider) waiting(id string) bool {
	e, ok := p.nodes.Get(id)
	return ok && e.Value.State == record.NodeBuilding
}

// deallocate frees a carved node's slot, wherever it is.
func (p *Provider) deallocate(ctx context.Context, nodeID string) error {
	for _, b := range p.backings() {
		if b.data.SlotOf(nodeID) < 0 {
			continue
		}
		_, err := p.nodes.Modify(ctx, b.Key, func(n *record.Node) error {
			d, ok := p.owned(n)
			if !ok || !d.free(nodeID, p.clock.Now().UTC()) {
				return record.ErrSkip
			}
			n.UserData = encodeJSON(d)
			return nil
		})
		if err != nil && !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) {
			return err
		}
		if err == nil {
			p.log.Debug("slot freed", "node", nodeID, "backing_node", b.Key)
		}
	}
	return nil
}

// backingRequest reads a request of ours: ok when its requestor is this
// provider; err says why its requestor_data is not valid.
func (p *Provider) backingRequest(r *record.Request) (d RequestData, ok bool, err error) {
	if r.Requestor != p.me {
		return RequestData{}, false, nil
	}
	d, err = decodeRequest(r.RequestorData)
	switch {
	case err != nil:
		return d, true, fmt.Errorf("requestor_data is not valid: %w", err)
	case d.Provider != p.cfg.Name:
		return d, true, fmt.Errorf("requestor_data names provider %q; expected %q, the provider of requestor %s", truncate(d.Provider), p.cfg.Name, p.me)
	case len(r.Labels) != 1:
		return d, true, fmt.Errorf("it asks for %d nodes; expected one backing node", len(r.Labels))
	}
	return d, true, nil
}

// awaitsBackingNode reports whether a carved node is listed by a backing
// request of ours that is not fulfilled yet.
func (p *Provider) awaitsBackingNode(nodeID string) bool {
	found := false
	p.requests.Range(func(e *record.Entry[record.Request]) bool {
		r := &e.Value
		if r.State != record.RequestRequested && r.State != record.RequestPending {
			return true
		}
		if d, ours, err := p.backingRequest(r); ours && err == nil && slices.Contains(d.Nodes, nodeID) {
			found = true
		}
		return !found
	})
	return found
}

// failedRequestFor returns a failed backing request that a carved node was
// waiting for.
func (p *Provider) failedRequestFor(nodeID string) (record.Request, bool) {
	var found record.Request
	ok := false
	p.requests.Range(func(e *record.Entry[record.Request]) bool {
		r := &e.Value
		if r.State != record.RequestFailed {
			return true
		}
		if d, ours, err := p.backingRequest(r); ours && err == nil && slices.Contains(d.Nodes, nodeID) {
			found, ok = *r, true
			return false
		}
		return true
	})
	return found, ok
}

// Create returns the machine of a carved node: it takes a slot of a backing
// node (waiting for one as long as needed) and copies the backing node's
// connection details. A state that is not valid fails the node, saying why.
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	m := &createMachine{p: p, req: req}
	if len(state) > 0 && string(state) != "null" {
		st, err := decodeCarved(state)
		if err != nil {
			return nil, fmt.Errorf("%w: metastatic: resuming create of node %s: driver_data is not valid: %w", drivers.ErrFatal, req.NodeID, err)
		}
		m.st = st
	}
	return m, nil
}

type createMachine struct {
	p   *Provider
	req drivers.CreateRequest
	st  CarvedData
}

func (m *createMachine) State() json.RawMessage { return encodeJSON(m.st) }

func (m *createMachine) ExternalID() string {
	if m.st.Step == StepAllocated {
		return m.req.NodeID
	}
	return ""
}

func (m *createMachine) Advance(ctx context.Context) (drivers.Step, error) {
	p := m.p
	if err := p.synced(ctx); err != nil {
		return drivers.Step{}, err
	}
	lc, ok := p.label(m.req.Pool, m.req.Label)
	if !ok {
		return drivers.Step{}, fmt.Errorf("%w: pool %s/%s has no label %q", drivers.ErrFatal, p.cfg.Name, m.req.Pool, m.req.Label)
	}
	bid, slot, err := p.allocate(ctx, m.req.NodeID, lc.BackingLabel)
	if err != nil {
		// A passing trouble with the records: look again shortly.
		p.log.Warn("could not allocate a slot; trying again", "node", m.req.NodeID, "err", err)
		return drivers.Step{Wait: time.Second}, nil
	}
	if bid == "" {
		if r, failed := p.failedRequestFor(m.req.NodeID); failed {
			return drivers.Step{}, fmt.Errorf("%w: backing request %s for a %s node failed: %s", drivers.ErrFatal, r.ID, lc.BackingLabel, r.Reason)
		}
		m.st = CarvedData{Step: StepWaiting}
		return drivers.Step{Wait: pollInterval}, nil
	}
	m.st = CarvedData{Step: StepAllocated, BackingNode: bid, Slot: slot}
	bn, ok := p.nodes.Get(bid)
	if !ok {
		return drivers.Step{Wait: pollInterval}, nil
	}
	inst := instanceOf(&bn.Value, m.req.NodeID, m.req.Hostname, m.req.Tags)
	if lc.ChecksHostKey() {
		keys, err := p.checkConnection(ctx, &bn.Value)
		if err != nil {
			if ctx.Err() != nil {
				return drivers.Step{}, ctx.Err()
			}
			// The attempt fails (its slot is freed) and the next one
			// goes to another backing node.
			p.failBacking(ctx, bid, err)
			return drivers.Step{}, fmt.Errorf("backing node %s failed the host-key check: %w", bid, err)
		}
		inst.HostKeys = keys
	}
	return drivers.Step{Done: true, Instance: &inst}, nil
}

// instanceOf is a carved node as an instance: the backing node's connection
// details under the carved node's id.
func instanceOf(bn *record.Node, nodeID, name string, tags map[string]string) drivers.Instance {
	inst := drivers.Instance{
		ExternalID: nodeID, Name: name, Tags: tags,
		Region: bn.Region, AZ: bn.AZ,
		InterfaceIP: bn.InterfaceIP, PublicIPv4: bn.PublicIPv4, PrivateIPv4: bn.PrivateIPv4, PublicIPv6: bn.PublicIPv6,
		Username: bn.Username, ConnectionType: bn.ConnectionType, ConnectionPort: bn.ConnectionPort,
		PythonPath: bn.PythonPath, ShellType: bn.ShellType,
		HostKeys:   slices.Clone(bn.HostKeys),
		Attributes: maps.Clone(bn.Attributes),
		Resources:  drivers.Resources{Instances: 1},
		Run:        drivers.Running, Status: "running",
	}
	if bn.InstanceDown != "" {
		inst.Run, inst.Status = drivers.Down, "down with backing node "+bn.ID+" ("+bn.InstanceDown+")"
	}
	return inst
}

var _ drivers.Liveness = (*Provider)(nil)

// ListingAge is 0: a listing holds every change made before the call.
func (p *Provider) ListingAge() time.Duration { return 0 }

var _ drivers.Owner = (*Provider)(nil)

// Owns reports whether the slot named is the node's own: a carved node's
// slot is allocated under its node id, which is its external id. (A node
// record naming another node's slot must not free it: that node still
// runs there.)
func (p *Provider) Owns(_ context.Context, externalID, nodeID string) (bool, error) {
	return externalID == nodeID, nil
}

// Delete returns a machine that frees a carved node's slot.
func (p *Provider) Delete(externalID string, _ json.RawMessage) (drivers.StateMachine, error) {
	return &deleteMachine{p: p, id: externalID}, nil
}

type deleteMachine struct {
	p  *Provider
	id string
}

func (m *deleteMachine) State() json.RawMessage { return nil }
func (m *deleteMachine) ExternalID() string     { return m.id }

func (m *deleteMachine) Advance(ctx context.Context) (drivers.Step, error) {
	if err := m.p.synced(ctx); err != nil {
		return drivers.Step{}, err
	}
	if err := m.p.deallocate(ctx, m.id); err != nil {
		return drivers.Step{}, err
	}
	return drivers.Step{Done: true}, nil
}

// ListInstances lists the allocated slots as instances, tagged with their
// carved node: a slot whose node record is gone is then found as leaked by
// cleanup and freed through Delete. The listing holds every change of the
// records made before the call. A slot runs while its backing node is
// ours (held, in use) and its instance runs: a carved node whose backing
// node is gone is missing from the listing, and one whose backing node's
// instance is gone or down (its instance_down) is Down.
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	if err := p.synced(ctx); err != nil {
		return nil, err
	}
	if err := p.nodes.Sync(ctx); err != nil {
		return nil, err
	}
	var out []drivers.Instance
	for _, b := range p.backings() {
		for _, id := range b.data.Allocations {
			if id == "" {
				continue
			}
			pool, label := b.data.Pool, b.data.Label
			if cn, ok := p.nodes.Get(id); ok && cn.Value.Provider == p.cfg.Name && len(cn.Value.Labels) > 0 {
				pool, label = cn.Value.Pool, cn.Value.Labels[0]
			}
			out = append(out, instanceOf(&b.Value, id, "", map[string]string{
				drivers.TagProvider: p.cfg.Name, drivers.TagPool: pool, drivers.TagNode: id, drivers.TagLabel: label,
			}))
		}
	}
	return out, nil
}

// QuotaLimits is unlimited: the backing nodes count in their own provider,
// and max-servers bounds the carved nodes of a pool.
func (p *Provider) QuotaLimits(context.Context) (drivers.Resources, error) {
	return drivers.Resources{Cores: drivers.Unlimited, RAM: drivers.Unlimited, Instances: drivers.Unlimited}, nil
}

// QuotaForLabel: each carved node is one instance of the metastatic pool.
func (p *Provider) QuotaForLabel(pool, label string) (drivers.Resources, error) {
	if _, ok := p.label(pool, label); !ok {
		return drivers.Resources{}, fmt.Errorf("pool %s/%s has no label %q", p.cfg.Name, pool, label)
	}
	return drivers.Resources{Instances: 1}, nil
}

// newRequestID returns a fresh backing request id.
func newRequestID() string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b [13]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "metastatic-" + string(b[:])
}
