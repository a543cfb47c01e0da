// Package metastatic carves nodes out of bigger "backing" nodes that it
// requests from other providers through the public request path, as any
// requestor would (requestor NodePool:metastatic:<provider>).
//
// Nothing lives only in memory. A backing node that is ours is in-use, held
// by that requestor, and its user_data holds its slot map (which carved node
// has which slot); a slot is given or freed only by a revision-checked update
// of that record, so two processes can never give one slot twice. Each
// carved node names its backing node and slot in driver_data. A backing
// request names in requestor_data the carved nodes waiting for it. After a
// restart, or in another process, all of it is read back from the records.
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
	"github.com/nodepool-nats/nodepool/kv"
)

// Requestor is the requestor name of a metastatic provider's backing
// requests and the holder of its backing nodes.
func Requestor(provider string) string { return "NodePool:metastatic:" + provider }

// Steps of a carved node's create machine.
const (
	StepWaiting   = "waiting"   // no free slot yet: waiting for a backing node
	StepAllocated = "allocated" // has its slot
)

// pollInterval is how often a waiting create machine looks for a slot.
const pollInterval = 250 * time.Millisecond

// BackingData is what a backing node holds in user_data while it is ours.
type BackingData struct {
	Owner string `json:"owner"`
	Pool  string `json:"pool"`
	Label string `json:"label"`
	// Slots is the number of carved nodes the backing node takes
	// (max-parallel-jobs when it was taken).
	Slots int `json:"slots"`
	// Allocations has one entry per slot: the carved node's id, or "".
	Allocations []string `json:"allocations"`
	// Request is the backing request it was taken for.
	Request string    `json:"request"`
	Taken   time.Time `json:"taken"`
	// IdleSince is when its last slot was freed (or when it was taken
	// without any); grace-time runs from here.
	IdleSince *time.Time `json:"idle_since,omitempty"`
	// Released is when it was given back.
	Released *time.Time `json:"released,omitempty"`
}

// Used counts the allocated slots.
func (d *BackingData) Used() int {
	n := 0
	for _, a := range d.Allocations {
		if a != "" {
			n++
		}
	}
	return n
}

// SlotOf returns the slot of a carved node, or -1.
func (d *BackingData) SlotOf(nodeID string) int { return slices.Index(d.Allocations, nodeID) }

// allocate gives the first free slot to a carved node; -1 if none is free.
func (d *BackingData) allocate(nodeID string) int {
	if s := d.SlotOf(nodeID); s >= 0 {
		return s
	}
	s := slices.Index(d.Allocations, "")
	if s >= 0 {
		d.Allocations[s] = nodeID
		d.IdleSince = nil
	}
	return s
}

// free frees a carved node's slot; when it was the last one, the backing
// node is idle from now.
func (d *BackingData) free(nodeID string, now time.Time) bool {
	s := d.SlotOf(nodeID)
	if s < 0 {
		return false
	}
	d.Allocations[s] = ""
	if d.Used() == 0 {
		d.IdleSince = &now
	}
	return true
}

// CarvedData is a carved node's driver_data.
type CarvedData struct {
	Step        string `json:"step"`
	BackingNode string `json:"backing_node,omitempty"`
	Slot        int    `json:"slot"`
}

// RequestData is a backing request's requestor_data.
type RequestData struct {
	Provider string `json:"provider"`
	Pool     string `json:"pool"`
	Label    string `json:"label"`
	Slots    int    `json:"slots"`
	// Nodes are the carved nodes waiting for this backing node; they get
	// its first slots when it is taken.
	Nodes []string `json:"nodes"`
}

func decodeJSON[T any](raw json.RawMessage) (T, bool) {
	var v T
	if len(raw) == 0 {
		return v, false
	}
	err := json.Unmarshal(raw, &v)
	return v, err == nil
}

func encodeJSON(v any) json.RawMessage {
	data, _ := json.Marshal(v)
	return data
}

// Provider is one metastatic provider.
type Provider struct {
	cfg      *config.Provider
	me       string
	js       jetstream.JetStream
	b        *kv.Buckets
	nodes    *kv.Cache[kv.Node]
	requests *kv.Cache[kv.Request]
	log      *slog.Logger

	stopNodes, stopRequests func()
}

// New prepares a metastatic provider and starts watching the node and
// request records. The buckets and streams must exist.
func New(ctx context.Context, js jetstream.JetStream, cfg *config.Provider, log *slog.Logger) (*Provider, error) {
	if cfg.Driver != "metastatic" {
		return nil, fmt.Errorf("provider %s: driver is %q, not metastatic", cfg.Name, cfg.Driver)
	}
	b, err := kv.Open(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", cfg.Name, err)
	}
	log = log.With("provider", cfg.Name)
	p := &Provider{
		cfg: cfg, me: Requestor(cfg.Name), js: js, b: b, log: log,
		nodes: kv.NewCache(b.Nodes, log), requests: kv.NewCache(b.Requests, log),
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

// backing is a backing node of ours with its slot map.
type backing struct {
	kv.Entry[kv.Node]
	data BackingData
}

// owned reports whether a node is one of our backing nodes, and its data.
func (p *Provider) owned(n *kv.Node) (BackingData, bool) {
	if n.State != kv.NodeInUse || n.Holder != p.me {
		return BackingData{}, false
	}
	d, ok := decodeJSON[BackingData](n.UserData)
	if !ok || d.Owner != p.me || len(d.Allocations) != d.Slots {
		return BackingData{}, false
	}
	return d, true
}

// backings lists our backing nodes.
func (p *Provider) backings() []backing {
	var out []backing
	p.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if d, ok := p.owned(&e.Value); ok {
			out = append(out, backing{Entry: *e, data: d})
		}
		return true
	})
	return out
}

// retired reports whether a backing node is past max-age: it takes no new
// slots and is given back once empty. A label gone from the configuration
// retires its backing nodes too.
func (p *Provider) retired(b *backing, now time.Time) bool {
	lc, ok := p.label(b.data.Pool, b.data.Label)
	if !ok {
		return true
	}
	return lc.MaxAge > 0 && now.Sub(b.Value.Created) >= lc.MaxAge.D()
}

// errNoSlot: the backing node has no free slot (any more).
var errNoSlot = errors.New("no free slot")

// allocate finds a carved node's slot: the one it has already (a resumed
// machine), or a free one on a backing node of its pool and label, taken
// with a revision-checked update. It returns "" when there is none.
func (p *Provider) allocate(ctx context.Context, nodeID, pool, label string) (string, int, error) {
	now := time.Now().UTC()
	all := p.backings()
	for _, b := range all {
		if s := b.data.SlotOf(nodeID); s >= 0 {
			return b.Key, s, nil
		}
	}
	var candidates []backing
	for _, b := range all {
		if b.data.Pool == pool && b.data.Label == label && b.data.Used() < b.data.Slots && !p.retired(&b, now) {
			candidates = append(candidates, b)
		}
	}
	// Fill the fullest first, so that idle ones empty out and go back.
	slices.SortFunc(candidates, func(a, b backing) int {
		if a.data.Used() != b.data.Used() {
			return b.data.Used() - a.data.Used()
		}
		return a.Value.Created.Compare(b.Value.Created)
	})
	for _, b := range candidates {
		slot := -1
		_, err := p.nodes.Modify(ctx, b.Key, func(n *kv.Node) error {
			d, ok := p.owned(n)
			if !ok || d.Pool != pool || d.Label != label {
				return errNoSlot
			}
			if slot = d.allocate(nodeID); slot < 0 {
				return errNoSlot
			}
			n.UserData = encodeJSON(d)
			return nil
		})
		switch {
		case err == nil:
			p.log.Debug("slot allocated", "node", nodeID, "backing_node", b.Key, "slot", slot)
			return b.Key, slot, nil
		case errors.Is(err, errNoSlot), errors.Is(err, kv.ErrNotFound):
			continue
		default:
			return "", -1, err
		}
	}
	return "", -1, nil
}

// deallocate frees a carved node's slot, wherever it is.
func (p *Provider) deallocate(ctx context.Context, nodeID string) error {
	for _, b := range p.backings() {
		if b.data.SlotOf(nodeID) < 0 {
			continue
		}
		_, err := p.nodes.Modify(ctx, b.Key, func(n *kv.Node) error {
			d, ok := p.owned(n)
			if !ok || !d.free(nodeID, time.Now().UTC()) {
				return kv.ErrSkip
			}
			n.UserData = encodeJSON(d)
			return nil
		})
		if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		if err == nil {
			p.log.Debug("slot freed", "node", nodeID, "backing_node", b.Key)
		}
	}
	return nil
}

// failedRequestFor returns a failed backing request that a carved node was
// waiting for.
func (p *Provider) failedRequestFor(nodeID string) (kv.Request, bool) {
	var found kv.Request
	ok := false
	p.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := &e.Value
		if r.Requestor != p.me || r.State != kv.RequestFailed {
			return true
		}
		if d, valid := decodeJSON[RequestData](r.RequestorData); valid && d.Provider == p.cfg.Name && slices.Contains(d.Nodes, nodeID) {
			found, ok = *r, true
			return false
		}
		return true
	})
	return found, ok
}

// Create returns the machine of a carved node: it takes a slot of a backing
// node (waiting for one as long as needed) and copies the backing node's
// connection details.
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	m := &createMachine{p: p, req: req}
	if len(state) > 0 && string(state) != "null" {
		if err := json.Unmarshal(state, &m.st); err != nil {
			return nil, fmt.Errorf("metastatic: resuming create of node %s: %w", req.NodeID, err)
		}
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
	if _, ok := p.label(m.req.Pool, m.req.Label); !ok {
		return drivers.Step{}, fmt.Errorf("%w: pool %s/%s has no label %q", drivers.ErrFatal, p.cfg.Name, m.req.Pool, m.req.Label)
	}
	bid, slot, err := p.allocate(ctx, m.req.NodeID, m.req.Pool, m.req.Label)
	if err != nil {
		// A passing trouble with the records: look again shortly.
		p.log.Warn("could not allocate a slot; trying again", "node", m.req.NodeID, "err", err)
		return drivers.Step{Wait: time.Second}, nil
	}
	if bid == "" {
		if r, failed := p.failedRequestFor(m.req.NodeID); failed {
			label := ""
			if len(r.Labels) > 0 {
				label = r.Labels[0]
			}
			return drivers.Step{}, fmt.Errorf("%w: backing request %s for a %s node failed: %s", drivers.ErrFatal, r.ID, label, r.Reason)
		}
		m.st = CarvedData{Step: StepWaiting}
		return drivers.Step{Wait: pollInterval}, nil
	}
	bn, ok := p.nodes.Get(bid)
	if !ok {
		return drivers.Step{Wait: pollInterval}, nil
	}
	m.st = CarvedData{Step: StepAllocated, BackingNode: bid, Slot: slot}
	inst := instanceOf(&bn.Value, m.req.NodeID, m.req.Hostname, m.req.Tags)
	return drivers.Step{Done: true, Instance: &inst}, nil
}

// instanceOf is a carved node as an instance: the backing node's connection
// details under the carved node's id.
func instanceOf(bn *kv.Node, nodeID, name string, tags map[string]string) drivers.Instance {
	return drivers.Instance{
		ExternalID: nodeID, Name: name, Tags: tags,
		Region: bn.Region, AZ: bn.AZ,
		InterfaceIP: bn.InterfaceIP, PublicIPv4: bn.PublicIPv4, PrivateIPv4: bn.PrivateIPv4, PublicIPv6: bn.PublicIPv6,
		Username: bn.Username, ConnectionType: bn.ConnectionType, ConnectionPort: bn.ConnectionPort,
		PythonPath: bn.PythonPath, ShellType: bn.ShellType,
		HostKeys:   slices.Clone(bn.HostKeys),
		Attributes: maps.Clone(bn.Attributes),
		Resources:  drivers.Resources{Instances: 1},
	}
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
// cleanup and freed through Delete.
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	if err := p.synced(ctx); err != nil {
		return nil, err
	}
	var out []drivers.Instance
	for _, b := range p.backings() {
		for _, id := range b.data.Allocations {
			if id == "" {
				continue
			}
			out = append(out, instanceOf(&b.Value, id, "", map[string]string{
				drivers.TagProvider: p.cfg.Name, drivers.TagPool: b.data.Pool, drivers.TagNode: id, drivers.TagLabel: b.data.Label,
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
