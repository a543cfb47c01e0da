// Package static hands out existing hosts. Each host of a static pool is
// registered as max-parallel-jobs node records with fixed ids; before a
// record goes into service (ready), the host's SSH host keys are gathered
// by a real handshake and checked against the configured host-key. A used
// node is registered again instead of deleted; a host that leaves the
// configuration leaves the pool once its nodes are not in use.
//
// The registration runs in one process at a time (the drivers.Manager
// lease); everything it knows is in the node records, so another process
// carries on from them.
package static

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/hostkeys"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/record"
)

// maxRecheck bounds the wait between two checks of a host that failed.
const maxRecheck = 2 * time.Minute

// settle is how long a pass waits for a burst of record changes to end.
const settle = 20 * time.Millisecond

// maxParallelChecks bounds the host checks in flight.
const maxParallelChecks = 16

// Provider is one static provider.
type Provider struct {
	cfg   *config.Provider
	nodes drivers.Records[record.Node]
	log   *slog.Logger
	// clock is the time the manager's passes and its host checks' backoff
	// (next_check) go by.
	clock clock.Clock

	stop func()
}

// Options are what a static provider is made with besides its
// configuration.
type Options struct {
	// Nodes are the process's view of the node records, shared with its
	// roles; the provider writes its hosts' nodes through it.
	Nodes drivers.Records[record.Node]
	// Clock is the time the provider goes by (nil: the real one): its
	// manager takes a pass whenever it passes another sync interval, and
	// checks a failing host again when it reaches the host's next_check.
	Clock clock.Clock
	Log   *slog.Logger
}

// New prepares a static provider and starts following the node records.
func New(cfg *config.Provider, o Options) (*Provider, error) {
	if cfg.Driver != "static" {
		return nil, fmt.Errorf("provider %s: driver is %q, not static", cfg.Name, cfg.Driver)
	}
	if o.Nodes == nil {
		return nil, fmt.Errorf("provider %s: no view of the node records", cfg.Name)
	}
	if o.Clock == nil {
		o.Clock = clock.Real()
	}
	p := &Provider{cfg: cfg, nodes: o.Nodes, log: o.Log.With("provider", cfg.Name), clock: o.Clock}
	p.stop = p.nodes.Start()
	return p, nil
}

// Close stops watching.
func (p *Provider) Close() { p.stop() }

// NodeData is what a static node keeps in driver_data.
type NodeData struct {
	// Host and Slot say which host and which of its max-parallel-jobs
	// slots the node is.
	Host string `json:"host"`
	Slot int    `json:"slot"`
	// Spec is a digest of the host's configuration when the node was
	// registered; a node whose host changed is registered again.
	Spec string `json:"spec"`
	// Failures counts the checks that failed in a row; NextCheck is when
	// the host is checked again.
	Failures  int       `json:"failures,omitempty"`
	NextCheck time.Time `json:"next_check,omitzero"`
}

// Bounds of the numbers in a static node's driver_data.
const (
	maxSlot     = 10000
	maxFailures = 1 << 20
)

// Validate checks a static node's driver_data: a host, a slot and a failure
// count within bounds, a spec digest as this driver writes it.
func (d *NodeData) Validate() error {
	var problems []string
	if d.Host == "" {
		problems = append(problems, "host is empty; expected the host's name")
	}
	if d.Slot < 0 || d.Slot >= maxSlot {
		problems = append(problems, fmt.Sprintf("slot is %d; expected 0 to %d", d.Slot, maxSlot-1))
	}
	if len(d.Spec) != 16 || strings.Trim(d.Spec, "0123456789abcdef") != "" {
		problems = append(problems, fmt.Sprintf("spec is %q; expected 16 hex digits", truncate(d.Spec)))
	}
	if d.Failures < 0 || d.Failures > maxFailures {
		problems = append(problems, fmt.Sprintf("failures is %d; expected 0 to %d", d.Failures, maxFailures))
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

func truncate(s string) string {
	if len(s) > 70 {
		return s[:64] + "..."
	}
	return s
}

// decodeNodeData reads a static node's driver_data; the error says what is
// wrong with it.
func decodeNodeData(raw json.RawMessage) (NodeData, error) {
	var d NodeData
	if len(raw) == 0 || string(raw) == "null" {
		return d, errors.New("driver_data is empty")
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return NodeData{}, fmt.Errorf("driver_data is not valid JSON for it: %w", err)
	}
	if err := d.Validate(); err != nil {
		return NodeData{}, fmt.Errorf("driver_data is not valid: %w", err)
	}
	return d, nil
}

// nodeData is a node's driver_data, or nothing when it is not valid: its
// spec then matches no host, so the node is registered again (with data
// of its own) as soon as it is idle.
func nodeData(n *record.Node) NodeData {
	d, _ := decodeNodeData(n.DriverData)
	return d
}

func (d NodeData) raw() json.RawMessage {
	data, _ := json.Marshal(d)
	return data
}

// registration is one node a static pool should have: a slot of a host.
type registration struct {
	id    string
	pool  string
	slot  int
	host  config.StaticNode
	attrs map[string]string // the pool's node-attributes
	spec  string
}

// NodeID is the fixed id of slot n of a host of a pool. A host is who it is
// by name, username and port (unique in a configuration, as in Nodepool).
func NodeID(provider, pool string, host *config.StaticNode, slot int) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{provider, pool, host.Name, host.Username, strconv.Itoa(host.ConnectionPort)}, "\x00")))
	return fmt.Sprintf("static-%s-%d", hex.EncodeToString(sum[:6]), slot)
}

// spec digests what a node record takes from its host's configuration and
// its pool's node-attributes (all but max-parallel-jobs, which only adds or
// removes slots).
func spec(h *config.StaticNode, attrs map[string]string) string {
	keys := make([]string, 0, len(h.HostKey))
	for _, k := range h.HostKey {
		if nk, err := config.ParseHostKey(k); err == nil {
			keys = append(keys, nk)
		}
	}
	data, _ := json.Marshal([]any{h.Name, []string(h.Labels), h.Username, h.ConnectionType, h.ConnectionPort, keys, h.ChecksHostKey(), h.Timeout.D(),
		h.PythonPath, h.ShellType, attrs})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// registrations lists every node the configuration asks for, by id.
func (p *Provider) registrations() map[string]registration {
	out := map[string]registration{}
	for _, pool := range p.cfg.Pools {
		for _, h := range pool.Nodes {
			attrs := map[string]string(pool.NodeAttributes)
			sp := spec(&h, attrs)
			for slot := range h.MaxParallelJobs {
				id := NodeID(p.cfg.Name, pool.Name, &h, slot)
				out[id] = registration{id: id, pool: pool.Name, slot: slot, host: h, attrs: attrs, spec: sp}
			}
		}
	}
	return out
}

// record fills a node record from its registration: everything but the
// state, the allocation and the host keys.
func (r *registration) record(n *record.Node, provider string) {
	h := &r.host
	n.ID, n.Provider, n.Pool = r.id, provider, r.pool
	n.Labels = slices.Clone([]string(h.Labels))
	n.ExternalID, n.Hostname, n.InterfaceIP = h.Name, h.Name, h.Name
	n.PublicIPv4, n.PublicIPv6 = "", ""
	if ip := net.ParseIP(h.Name); ip != nil {
		if ip.To4() != nil {
			n.PublicIPv4 = h.Name
		} else {
			n.PublicIPv6 = h.Name
		}
	}
	n.Username, n.ConnectionType, n.ConnectionPort = h.Username, h.ConnectionType, h.ConnectionPort
	n.PythonPath, n.ShellType = h.PythonPath, h.ShellType
	n.Resources = record.Resources{}
	n.Attributes = maps.Clone(r.attrs)
	if n.Attributes == nil {
		n.Attributes = map[string]string{}
	}
}

// Reregister puts a used node back in line: state init, allocation and
// holder cleared, host to be checked again at once.
func (p *Provider) Reregister(n *record.Node, now time.Time) {
	n.SetState(record.NodeInit, now)
	n.AllocatedTo, n.Holder, n.LeaseUntil, n.Requestor, n.Tenant = "", "", nil, "", ""
	n.Launcher, n.Reason, n.HoldJob, n.HoldExpiration = "", "", "", nil
	d := nodeData(n)
	d.Failures, d.NextCheck = 0, time.Time{}
	n.DriverData = d.raw()
}

// Manage keeps the pool's node records in step with the configuration and
// checks hosts before their nodes go into service. It runs in the holder of
// the provider's lease.
func (p *Provider) Manage(ctx context.Context, interval time.Duration) {
	if err := p.nodes.WaitSynced(ctx); err != nil {
		return
	}
	changed, stop := p.nodes.Changes()
	defer stop()
	tick := p.clock.NewTicker(interval)
	defer tick.Stop()
	m := &manager{p: p, interval: interval, checking: map[string]bool{}, sem: make(chan struct{}, maxParallelChecks), doneC: make(chan struct{}, 1)}
	defer m.wg.Wait()
	for {
		if !m.safeReconcile(ctx) {
			// No hot loop on a pass that fails: the next one waits for
			// the tick.
			select {
			case <-ctx.Done():
				return
			case <-tick.C():
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C():
		case <-m.doneC:
		}
		// Let a burst of changes settle into one pass (in real time,
		// whatever the provider's clock: it spaces the passes out, and
		// decides nothing).
		select {
		case <-ctx.Done():
			return
		case <-time.After(settle):
		}
	}
}

// safeReconcile runs a pass; it reports false if the pass panicked (a
// record no check caught, or a bug), which is logged.
func (m *manager) safeReconcile(ctx context.Context) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			m.p.log.Error("static pool pass failed; trying again at the next tick", "panic", r, "stack", string(debug.Stack()))
			ok = false
		}
	}()
	m.reconcile(ctx)
	return true
}

// manager is one term of Manage.
type manager struct {
	p        *Provider
	interval time.Duration
	wg       sync.WaitGroup
	sem      chan struct{}
	doneC    chan struct{}

	mu       sync.Mutex
	checking map[string]bool // nodes with a check in flight
}

func (m *manager) busy(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checking[id]
}

// reconcile compares the records with the configuration: it registers
// missing nodes, re-registers idle nodes of changed hosts, removes idle
// nodes of removed hosts, and starts the checks that are due.
func (m *manager) reconcile(ctx context.Context) {
	p := m.p
	want := p.registrations()
	have := map[string]record.Entry[record.Node]{}
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		if e.Value.Provider == p.cfg.Name {
			have[e.Key] = *e
		}
		return true
	})
	now := m.p.clock.Now().UTC()
	for id, r := range want {
		if _, ok := have[id]; !ok {
			m.register(ctx, r, now)
		}
	}
	for id, e := range have {
		if m.busy(id) {
			continue
		}
		n := &e.Value
		r, wanted := want[id]
		idle := n.State == record.NodeInit || (n.State == record.NodeReady && n.AllocatedTo == "")
		d := nodeData(n)
		switch {
		case !wanted:
			if idle {
				m.remove(ctx, e)
			}
		case d.Spec != r.spec:
			if idle {
				why := "host configuration changed"
				if _, err := decodeNodeData(n.DriverData); err != nil {
					why = err.Error()
				}
				m.update(ctx, r, why, now)
			}
		case n.State == record.NodeInit && !now.Before(d.NextCheck):
			m.check(ctx, r)
		}
	}
}

// register creates the record of a node the configuration asks for.
func (m *manager) register(ctx context.Context, r registration, now time.Time) {
	n := &record.Node{State: record.NodeInit, HostKeys: []string{}, Created: now, StateTime: now}
	r.record(n, m.p.cfg.Name)
	n.DriverData = NodeData{Host: r.host.Name, Slot: r.slot, Spec: r.spec}.raw()
	_, err := m.p.nodes.Create(ctx, r.id, n)
	switch {
	case err == nil:
		m.p.log.Info("registered static node", "node", r.id, "host", r.host.Name, "slot", r.slot, "pool", r.pool)
	case !errors.Is(err, record.ErrExists) && ctx.Err() == nil:
		m.p.log.Warn("could not register static node", "node", r.id, "err", err)
	}
}

// update re-registers an idle node whose host's configuration changed, or
// whose driver_data is not valid (why says which).
func (m *manager) update(ctx context.Context, r registration, why string, now time.Time) {
	_, err := m.p.nodes.Modify(ctx, r.id, func(n *record.Node) error {
		if n.State != record.NodeInit && (n.State != record.NodeReady || n.AllocatedTo != "") {
			return record.ErrSkip
		}
		r.record(n, m.p.cfg.Name)
		n.SetState(record.NodeInit, now)
		n.HostKeys, n.Reason = []string{}, ""
		n.DriverData = NodeData{Host: r.host.Name, Slot: r.slot, Spec: r.spec}.raw()
		return nil
	})
	if err == nil {
		m.p.log.Info("registering a node again", "node", r.id, "host", r.host.Name, "why", why)
	}
}

// remove deletes the record of an idle node whose host left the
// configuration; a revision check makes sure nobody took it meanwhile.
func (m *manager) remove(ctx context.Context, e record.Entry[record.Node]) {
	err := m.p.nodes.Delete(ctx, e.Key, e.Revision)
	switch {
	case err == nil:
		m.p.log.Info("host left the configuration; node removed", "node", e.Key, "host", e.Value.Hostname)
	case errors.Is(err, record.ErrConflict), errors.Is(err, record.ErrNotFound):
		// Changed meanwhile: the next pass looks again.
	case ctx.Err() == nil:
		m.p.log.Warn("could not remove static node", "node", e.Key, "err", err)
	}
}

// check starts a check of a node's host; the result goes into the record.
func (m *manager) check(ctx context.Context, r registration) {
	m.mu.Lock()
	m.checking[r.id] = true
	m.mu.Unlock()
	m.wg.Go(func() {
		defer func() {
			m.mu.Lock()
			delete(m.checking, r.id)
			m.mu.Unlock()
			select {
			case m.doneC <- struct{}{}:
			default:
			}
		}()
		select {
		case m.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-m.sem }()
		keys, err := CheckHost(ctx, &r.host)
		if ctx.Err() != nil {
			return
		}
		now := m.p.clock.Now().UTC()
		_, merr := m.p.nodes.Modify(ctx, r.id, func(n *record.Node) error {
			d := nodeData(n)
			if n.State != record.NodeInit || d.Spec != r.spec {
				return record.ErrSkip
			}
			if err != nil {
				d.Failures++
				d.NextCheck = now.Add(m.recheckAfter(d.Failures))
				n.Reason = fmt.Sprintf("%v (check %d failed; next at %s)", err, d.Failures, d.NextCheck.Format(time.RFC3339))
				n.DriverData = d.raw()
				return nil
			}
			d.Failures, d.NextCheck = 0, time.Time{}
			n.DriverData = d.raw()
			n.HostKeys = keys
			n.Reason = ""
			n.SetState(record.NodeReady, now)
			return nil
		})
		switch {
		case merr != nil:
		case err != nil:
			m.p.log.Warn("static host out of service", "node", r.id, "host", r.host.Name, "err", err)
		default:
			m.p.log.Debug("static node ready", "node", r.id, "host", r.host.Name)
		}
	})
}

// recheckAfter is the wait before check number failures+1 of a host.
func (m *manager) recheckAfter(failures int) time.Duration {
	return min(m.interval<<min(max(failures-1, 0), 8), maxRecheck)
}

// CheckHost checks that a host can go into service and returns its host
// keys: with host-key-checking, an SSH host's keys are gathered by a
// handshake and must include every configured host-key; a winrm host must
// accept a TCP connection. Without host-key-checking the host is not
// contacted and the configured host-key is taken as it is.
func CheckHost(ctx context.Context, h *config.StaticNode) ([]string, error) {
	configured := make([]string, 0, len(h.HostKey))
	for _, k := range h.HostKey {
		nk, err := config.ParseHostKey(k)
		if err != nil {
			return nil, err
		}
		configured = append(configured, nk)
	}
	if !h.ChecksHostKey() {
		return configured, nil
	}
	addr := net.JoinHostPort(h.Name, strconv.Itoa(h.ConnectionPort))
	if !h.GathersHostKeys() {
		dctx, cancel := context.WithTimeout(ctx, h.Timeout.D())
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(dctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("host %s is unreachable: %w", addr, err)
		}
		_ = c.Close()
		return []string{}, nil
	}
	keys, err := hostkeys.Scan(ctx, addr, h.Timeout.D())
	if err != nil {
		return nil, fmt.Errorf("host %s is unreachable: %w", addr, err)
	}
	var missing []string
	for _, k := range configured {
		if !slices.Contains(keys, k) {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("host key mismatch: %s does not offer the configured host-key %s (it offers %s)", addr, strings.Join(missing, ", "), strings.Join(keys, ", "))
	}
	return keys, nil
}

// Create refuses: static nodes are registered, never launched (the
// scheduler does not create nodes in static pools).
func (p *Provider) Create(req drivers.CreateRequest, _ json.RawMessage) (drivers.StateMachine, error) {
	return nil, fmt.Errorf("%w: provider %s is static: its nodes are the hosts of its configuration, not launched", drivers.ErrFatal, p.cfg.Name)
}

// Delete returns a machine that does nothing: a static host is not ours to
// delete. Deleting a node's record (an operator's delete) registers the host
// again.
func (p *Provider) Delete(externalID string, _ json.RawMessage) (drivers.StateMachine, error) {
	return deleteMachine{host: externalID}, nil
}

type deleteMachine struct{ host string }

func (m deleteMachine) Advance(context.Context) (drivers.Step, error) {
	return drivers.Step{Done: true}, nil
}
func (m deleteMachine) State() json.RawMessage { return nil }
func (m deleteMachine) ExternalID() string     { return m.host }

// ListInstances lists nothing: a static provider creates no instances, so
// none can leak.
func (p *Provider) ListInstances(context.Context) ([]drivers.Instance, error) { return nil, nil }

// QuotaLimits is unlimited: a static pool is bounded by its hosts.
func (p *Provider) QuotaLimits(context.Context) (drivers.Resources, error) {
	return drivers.Resources{Cores: drivers.Unlimited, RAM: drivers.Unlimited, Instances: drivers.Unlimited}, nil
}

// QuotaForLabel is one instance.
func (p *Provider) QuotaForLabel(string, string) (drivers.Resources, error) {
	return drivers.Resources{Instances: 1}, nil
}
