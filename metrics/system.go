package metrics

import (
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
)

// SystemSource is what the gauges of the whole system are computed from:
// the records as one launcher's watch caches hold them, the live pools
// (from the component records) and the process's configuration. Leader
// tells whether this process exports them now: one process at a time
// does, so that a sum over every process's scrape counts each node once.
type SystemSource struct {
	Leader   func() bool
	Nodes    func(yield func(*kv.Node) bool)
	Requests func(yield func(*kv.Request) bool)
	Pools    func() []kv.ComponentPool
	Config   func() *config.Config
	// Removed, if set, returns a test of whether a node's provider, pool
	// or label was removed from the configuration (the node is drained);
	// Draining, if set, counts the removed providers the process drains
	// and those whose drain cannot go on.
	Removed  func() func(*kv.Node) bool
	Draining func() (draining, stuck int)
}

// System exports the gauges of the whole system, from the process that
// leads (see SystemSource), to Prometheus at each scrape and to statsd
// with Send.
type System struct {
	src SystemSource
	sd  *Statsd

	nodes, labelNodes, requests, addressable, quotaLimit, quotaUsed, maxServers, tenantLimits, waiting *prometheus.Desc
	drainingNodes, drainingProviders                                                                   *prometheus.Desc
}

// Node and request states, in the order gauges list them.
var (
	NodeStates    = []kv.NodeState{kv.NodeInit, kv.NodeBuilding, kv.NodeReady, kv.NodeInUse, kv.NodeUsed, kv.NodeHold, kv.NodeDeleting, kv.NodeFailed, kv.NodeAborted}
	RequestStates = []kv.RequestState{kv.RequestRequested, kv.RequestPending, kv.RequestFulfilled, kv.RequestFailed}
)

// NewSystem registers the system gauges in r.
func NewSystem(r *Registry, src SystemSource) *System {
	r = orNew(r)
	s := &System{src: src, sd: r.statsd,
		nodes:        prometheus.NewDesc("nodepool_nodes", "Nodes of the whole system by provider, pool and state (each node once).", []string{"provider", "pool", "state"}, nil),
		labelNodes:   prometheus.NewDesc("nodepool_label_nodes", "Nodes of the whole system by provider, label and state (a node with several labels counts under each).", []string{"provider", "label", "state"}, nil),
		requests:     prometheus.NewDesc("nodepool_requests", "Node requests of the whole system by state.", []string{"state"}, nil),
		addressable:  prometheus.NewDesc("nodepool_pool_addressable_requests", "Open requests (requested or pending) whose every label a live pool provides.", []string{"provider", "pool"}, nil),
		quotaLimit:   prometheus.NewDesc("nodepool_pool_quota_limit", "A pool's configured limit (max-servers: instances, max-cores: cores, max-ram: ram); absent when unlimited.", []string{"provider", "pool", "resource"}, nil),
		quotaUsed:    prometheus.NewDesc("nodepool_pool_quota_used", "What a pool's nodes hold against its quota.", []string{"provider", "pool", "resource"}, nil),
		maxServers:   prometheus.NewDesc("nodepool_provider_max_servers", "The sum of a provider's pools' max-servers (pools without one left out).", []string{"provider"}, nil),
		tenantLimits: prometheus.NewDesc("nodepool_tenant_limit", "A tenant's configured resource limit (tenant-resource-limits).", []string{"tenant", "resource"}, nil),
		waiting:      prometheus.NewDesc("nodepool_pool_waiting_for_quota", "1 when a live pool waits for quota (its leader holds requests back), else 0.", []string{"provider", "pool"}, nil),
		drainingNodes: prometheus.NewDesc("nodepool_draining_nodes",
			"Nodes of a provider, pool or label removed from the configuration, being deleted (in use: once given back), by state.", []string{"state"}, nil),
		drainingProviders: prometheus.NewDesc("nodepool_draining_providers",
			"Providers removed from the configuration whose nodes, instances or uploads are being deleted (state draining), and those of them whose drain cannot go on (state stuck: the driver cannot be made, the cloud's calls fail).", []string{"state"}, nil),
	}
	r.prom.MustRegister(s)
	return s
}

// Describe implements prometheus.Collector.
func (s *System) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.nodes, s.labelNodes, s.requests, s.addressable, s.quotaLimit, s.quotaUsed, s.maxServers, s.tenantLimits, s.waiting, s.drainingNodes, s.drainingProviders} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: nothing unless this process
// leads.
func (s *System) Collect(ch chan<- prometheus.Metric) {
	if !s.src.Leader() {
		return
	}
	f := s.figures()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for k, v := range f.nodes {
		gauge(s.nodes, float64(v), k.provider, k.pool, k.state)
	}
	for k, v := range f.labelNodes {
		gauge(s.labelNodes, float64(v), k.provider, k.label, k.state)
	}
	for st, v := range f.requests {
		gauge(s.requests, float64(v), st)
	}
	for k, v := range f.addressable {
		gauge(s.addressable, float64(v), k.provider, k.pool)
	}
	for k, v := range f.quotaLimit {
		gauge(s.quotaLimit, float64(v), k.provider, k.pool, k.resource)
	}
	for k, v := range f.quotaUsed {
		gauge(s.quotaUsed, float64(v), k.provider, k.pool, k.resource)
	}
	for p, v := range f.maxServers {
		gauge(s.maxServers, float64(v), p)
	}
	for k, v := range f.tenantLimits {
		gauge(s.tenantLimits, float64(v), k.tenant, k.resource)
	}
	for k, v := range f.waiting {
		gauge(s.waiting, float64(v), k.provider, k.pool)
	}
	for st, v := range f.drainingNodes {
		gauge(s.drainingNodes, float64(v), st)
	}
	if s.src.Draining != nil {
		draining, stuck := s.src.Draining()
		gauge(s.drainingProviders, float64(draining), "draining")
		gauge(s.drainingProviders, float64(stuck), "stuck")
	}
}

// Send sends the system gauges under Nodepool's statsd names
// (nodepool.nodes.<state>, nodepool.provider.<provider>.nodes.<state>,
// nodepool.label.<label>.nodes.<state>,
// nodepool.provider.<provider>.pool.<pool>.addressable_requests,
// nodepool.provider.<provider>.max_servers,
// nodepool.tenant_limits.<tenant>.<limit>), if this process leads and
// statsd is on.
func (s *System) Send() {
	if s.sd == nil || !s.src.Leader() {
		return
	}
	f := s.figures()
	total := map[string]int{}
	perProvider := map[[2]string]int{}
	for k, v := range f.nodes {
		total[k.state] += v
		perProvider[[2]string{k.provider, k.state}] += v
	}
	perLabel := map[[2]string]int{}
	for k, v := range f.labelNodes {
		perLabel[[2]string{k.label, k.state}] += v
	}
	for st, v := range total {
		s.sd.Gauge(int64(v), "nodepool", "nodes", st)
	}
	for k, v := range perProvider {
		s.sd.Gauge(int64(v), "nodepool", "provider", k[0], "nodes", k[1])
	}
	for k, v := range perLabel {
		s.sd.Gauge(int64(v), "nodepool", "label", k[0], "nodes", k[1])
	}
	for k, v := range f.addressable {
		s.sd.Gauge(int64(v), "nodepool", "provider", k.provider, "pool", k.pool, "addressable_requests")
	}
	for p, v := range f.maxServers {
		s.sd.Gauge(int64(v), "nodepool", "provider", p, "max_servers")
	}
	for k, v := range f.tenantLimits {
		s.sd.Gauge(int64(v), "nodepool", "tenant_limits", Normalize(k.tenant), Normalize(k.resource))
	}
}

type poolKey struct{ provider, pool string }
type poolState struct{ provider, pool, state string }
type labelState struct{ provider, label, state string }
type poolResource struct{ provider, pool, resource string }
type tenantResource struct{ tenant, resource string }

type figures struct {
	nodes        map[poolState]int
	labelNodes   map[labelState]int
	requests     map[string]int
	addressable  map[poolKey]int
	quotaLimit   map[poolResource]int
	quotaUsed    map[poolResource]int
	maxServers   map[string]int
	tenantLimits map[tenantResource]int
	waiting      map[poolKey]int
	// drainingNodes counts, by state, the nodes of what was removed from
	// the configuration (they are in nodes too, under their names if a
	// live pool still has them, else under Other).
	drainingNodes map[string]int
}

// figures computes every system gauge from the records. Every state of
// every live pool and of each of its labels is there, at zero when no
// node is in it, so that graphs show zeros rather than gaps (as
// Nodepool's gauges do). A record's provider, pool, label or state that
// neither the configuration nor a live pool has is counted as Other: a
// record cannot make new series.
func (s *System) figures() figures {
	f := figures{
		nodes: map[poolState]int{}, labelNodes: map[labelState]int{}, requests: map[string]int{},
		addressable: map[poolKey]int{}, quotaLimit: map[poolResource]int{}, quotaUsed: map[poolResource]int{},
		maxServers: map[string]int{}, tenantLimits: map[tenantResource]int{}, waiting: map[poolKey]int{},
		drainingNodes: map[string]int{},
	}
	removed := func(*kv.Node) bool { return false }
	if s.src.Removed != nil {
		removed = s.src.Removed()
		for _, st := range NodeStates {
			f.drainingNodes[string(st)] = 0
		}
	}
	pools := s.src.Pools()
	sort.Slice(pools, func(i, j int) bool { return pools[i].Provider+"/"+pools[i].Pool < pools[j].Provider+"/"+pools[j].Pool })
	for _, p := range pools {
		for _, st := range NodeStates {
			f.nodes[poolState{p.Provider, p.Pool, string(st)}] += 0
			for _, lb := range p.Labels {
				f.labelNodes[labelState{p.Provider, lb, string(st)}] += 0
			}
		}
		k := poolKey{p.Provider, p.Pool}
		f.addressable[k] += 0
		if p.Paused {
			f.waiting[k] = 1
		} else {
			f.waiting[k] += 0
		}
	}
	for _, st := range RequestStates {
		f.requests[string(st)] = 0
	}
	cfg := s.src.Config()
	limited := map[poolKey]bool{}
	known := newKnownNames(pools)
	if cfg != nil {
		for _, lb := range cfg.Labels {
			known.labels[lb.Name] = true
		}
		for _, prov := range cfg.Providers {
			known.providers[prov.Name] = true
			for _, pool := range prov.Pools {
				k := poolKey{prov.Name, pool.Name}
				limited[k] = true
				known.pools[k] = true
				for res, v := range map[string]int{"instances": pool.MaxServers, "cores": pool.MaxCores, "ram": pool.MaxRAM} {
					if v != config.Unlimited {
						f.quotaLimit[poolResource{prov.Name, pool.Name, res}] = max(v, 0)
					}
					f.quotaUsed[poolResource{prov.Name, pool.Name, res}] += 0
				}
				if pool.MaxServers != config.Unlimited && pool.MaxServers > 0 {
					f.maxServers[prov.Name] += pool.MaxServers
				}
			}
		}
		for _, tl := range cfg.TenantResourceLimits {
			for res, v := range map[string]int{"instances": tl.MaxServers, "cores": tl.MaxCores, "ram": tl.MaxRAM} {
				if v != config.Unlimited {
					f.tenantLimits[tenantResource{tl.TenantName, res}] = v
				}
			}
		}
	}
	s.src.Nodes(func(n *kv.Node) bool {
		st := known.nodeState(n.State)
		if removed(n) {
			f.drainingNodes[st]++
		}
		provider, pool := known.pool(n.Provider, n.Pool)
		f.nodes[poolState{provider, pool, st}]++
		for _, lb := range n.Labels {
			f.labelNodes[labelState{provider, known.label(lb), st}]++
		}
		if k := (poolKey{n.Provider, n.Pool}); limited[k] {
			size := n.Resources
			size.Instances = max(size.Instances, 1)
			f.quotaUsed[poolResource{k.provider, k.pool, "instances"}] += size.Instances
			f.quotaUsed[poolResource{k.provider, k.pool, "cores"}] += size.Cores
			f.quotaUsed[poolResource{k.provider, k.pool, "ram"}] += size.RAM
		}
		return true
	})
	s.src.Requests(func(r *kv.Request) bool {
		f.requests[known.requestState(r.State)]++
		if r.State != kv.RequestRequested && r.State != kv.RequestPending {
			return true
		}
		for _, p := range pools {
			if providesAll(p.Labels, r.Labels) {
				f.addressable[poolKey{p.Provider, p.Pool}]++
			}
		}
		return true
	})
	return f
}

// knownNames are the names labels may take: those of the configuration and
// of the live pools (which other processes' configurations name).
type knownNames struct {
	providers map[string]bool
	pools     map[poolKey]bool
	labels    map[string]bool
}

func newKnownNames(pools []kv.ComponentPool) knownNames {
	k := knownNames{providers: map[string]bool{}, pools: map[poolKey]bool{}, labels: map[string]bool{}}
	for _, p := range pools {
		k.providers[p.Provider] = true
		k.pools[poolKey{p.Provider, p.Pool}] = true
		for _, lb := range p.Labels {
			k.labels[lb] = true
		}
	}
	return k
}

// pool is a provider and pool as known, else Other for what is not.
func (k knownNames) pool(provider, pool string) (string, string) {
	switch {
	case k.pools[poolKey{provider, pool}]:
		return provider, pool
	case k.providers[provider]:
		return provider, Other
	}
	return Other, Other
}

func (k knownNames) label(name string) string {
	if k.labels[name] {
		return name
	}
	return Other
}

func (k knownNames) nodeState(st kv.NodeState) string {
	if slices.Contains(NodeStates, st) {
		return string(st)
	}
	return Other
}

func (k knownNames) requestState(st kv.RequestState) string {
	if slices.Contains(RequestStates, st) {
		return string(st)
	}
	return Other
}

func providesAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return len(want) > 0
}
