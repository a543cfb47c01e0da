package web

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
)

// Overview is what the dashboard shows above the records: each pool's
// capacity in use against its limits, each provider's cloud quota and
// failures, and the last hour. It is computed from the watch caches, the
// configuration in force and the process's History; /dashboard/overview
// serves it as JSON.
type Overview struct {
	Time      time.Time      `json:"time"`
	Pools     []PoolView     `json:"pools"`
	Providers []ProviderView `json:"providers"`
	History   HistoryReport  `json:"history"`
}

// Usage is what nodes hold against quota: every node the scheduler
// counts (any state; a node is at least one instance).
type Usage struct {
	Instances int `json:"instances"`
	Cores     int `json:"cores"`
	RAM       int `json:"ram"`
}

func (u *Usage) add(n *kv.Node) {
	u.Instances += max(n.Resources.Instances, 1)
	u.Cores += n.Resources.Cores
	u.RAM += n.Resources.RAM
}

// PoolView is a pool's capacity and what waits in it.
type PoolView struct {
	Provider string   `json:"provider"`
	Pool     string   `json:"pool"`
	Labels   []string `json:"labels"`
	// Configured: the pool is in this process's nodepool.yaml (its
	// limits are known).
	Configured bool `json:"configured"`
	// MaxServers, MaxCores and MaxRAM are the pool's limits; absent
	// where there is none.
	MaxServers *int `json:"max_servers,omitempty"`
	MaxCores   *int `json:"max_cores,omitempty"`
	MaxRAM     *int `json:"max_ram,omitempty"`
	// Used is what the pool's nodes hold; States counts them by state.
	Used   Usage                `json:"used"`
	States map[kv.NodeState]int `json:"states"`
	// WaitingForQuota: the pool's leader found a request that does not
	// fit in its limits or the cloud's quota, and holds it until nodes
	// are deleted (pools of lower priority take what they can).
	WaitingForQuota bool `json:"waiting_for_quota"`
	// Waiting counts the requests that wait in the pool, and WaitReason
	// says why the oldest waits, as its record does.
	Waiting    int    `json:"waiting"`
	WaitReason string `json:"wait_reason,omitempty"`
	// Launchers are the live launchers that serve the pool.
	Launchers []string `json:"launchers"`
}

// ProviderView is a provider's use of its cloud's quota and its last
// hour.
type ProviderView struct {
	Name string `json:"name"`
	// Used is what its nodes hold, every pool together.
	Used Usage `json:"used"`
	// CloudQuota is the cloud's quota as a pool's leader last read it
	// (absent when none has: no leader alive, or every pool ignores the
	// provider's quota).
	CloudQuota *kv.CloudQuota `json:"cloud_quota,omitempty"`
	// Hour is what it did in the last hour (History).
	Hour            historyCounts `json:"hour"`
	LastFailure     string        `json:"last_failure,omitempty"`
	LastFailureTime *time.Time    `json:"last_failure_time,omitempty"`
	// Failing: failingAfter or more requests, or launches, failed in the
	// last hour; Failing says so in words.
	Failing string `json:"failing,omitempty"`
}

// failingAfter is how many failed requests (or launches) in the last
// hour make a provider one that keeps failing.
const failingAfter = 3

// overview computes the overview from the caches now.
func (v *Views) overview(cfg *config.Config) Overview {
	out := Overview{Time: time.Now().UTC(), History: v.History.Report()}
	pools := map[string]*PoolView{}
	providers := map[string]*ProviderView{}
	var poolOrder, providerOrder []string
	provider := func(name string) *ProviderView {
		p, ok := providers[name]
		if !ok {
			p = &ProviderView{Name: name}
			providers[name] = p
			providerOrder = append(providerOrder, name)
		}
		return p
	}
	pool := func(prov, name string) *PoolView {
		ref := kv.PoolRef(prov, name)
		p, ok := pools[ref]
		if !ok {
			provider(prov)
			p = &PoolView{Provider: prov, Pool: name, States: map[kv.NodeState]int{}, Labels: []string{}, Launchers: []string{}}
			pools[ref] = p
			poolOrder = append(poolOrder, ref)
		}
		return p
	}
	limit := func(v int) *int {
		if v == config.Unlimited {
			return nil
		}
		v = max(v, 0)
		return &v
	}
	if cfg != nil {
		for _, pc := range cfg.Providers {
			provider(pc.Name)
			for i := range pc.Pools {
				c := &pc.Pools[i]
				p := pool(pc.Name, c.Name)
				p.Configured = true
				p.MaxServers, p.MaxCores, p.MaxRAM = limit(c.MaxServers), limit(c.MaxCores), limit(c.MaxRAM)
				for _, l := range c.Labels {
					p.Labels = addName(p.Labels, l.Name)
				}
				for _, sn := range c.Nodes {
					for _, l := range sn.Labels {
						p.Labels = addName(p.Labels, l)
					}
				}
			}
		}
	}
	// The live launchers: who serves each pool, whether it waits for
	// quota (any report of it wins: only the leader knows), and the
	// newest reading of each provider's cloud quota.
	v.Components.Range(func(e *kv.Entry[kv.Component]) bool {
		for _, cp := range e.Value.Pools {
			p := pool(cp.Provider, cp.Pool)
			p.Launchers = addName(p.Launchers, e.Value.ID)
			p.WaitingForQuota = p.WaitingForQuota || cp.Paused
			for _, l := range cp.Labels {
				p.Labels = addName(p.Labels, l)
			}
			if q := cp.CloudQuota; q != nil {
				pv := provider(cp.Provider)
				if pv.CloudQuota == nil || q.Read.After(pv.CloudQuota.Read) {
					pv.CloudQuota = q
				}
			}
		}
		return true
	})
	v.Nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := &e.Value
		if n.Provider == "" {
			return true
		}
		p := pool(n.Provider, n.Pool)
		p.States[n.State]++
		if n.Accountable() {
			p.Used.add(n)
			provider(n.Provider).Used.add(n)
		}
		return true
	})
	// Requests that wait in a pool say so in their reason (the leader
	// writes "waiting in pool <provider>/<pool>: why").
	oldest := map[string]time.Time{}
	v.Requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := &e.Value
		if r.Done() || !strings.HasPrefix(r.Reason, "waiting in pool ") {
			return true
		}
		ref, why, ok := strings.Cut(strings.TrimPrefix(r.Reason, "waiting in pool "), ": ")
		if !ok {
			return true
		}
		p, known := pools[ref]
		if !known {
			return true
		}
		p.Waiting++
		if t, seen := oldest[ref]; !seen || r.Created.Before(t) {
			oldest[ref] = r.Created
			p.WaitReason = why
		}
		return true
	})
	for _, h := range out.History.Providers {
		p := provider(h.Name)
		p.Hour, p.LastFailure, p.LastFailureTime = h.historyCounts, h.LastFailure, h.LastFailureTime
		var what []string
		if h.RequestsFailed >= failingAfter {
			what = append(what, plural(h.RequestsFailed, "request"))
		}
		if h.LaunchFailures >= failingAfter {
			what = append(what, plural(h.LaunchFailures, "launch"))
		}
		if len(what) > 0 {
			p.Failing = strings.Join(what, " and ") + " failed in the last hour"
		}
	}
	// The configuration's order first, then the others by name.
	configured := len(poolOrder)
	if cfg != nil {
		configured = 0
		for _, pc := range cfg.Providers {
			configured += len(pc.Pools)
		}
	}
	slices.Sort(poolOrder[configured:])
	for _, ref := range poolOrder {
		out.Pools = append(out.Pools, *pools[ref])
	}
	known := 0
	if cfg != nil {
		known = len(cfg.Providers)
	}
	slices.Sort(providerOrder[known:])
	for _, name := range providerOrder {
		out.Providers = append(out.Providers, *providers[name])
	}
	return out
}

// addName adds a name to a list unless it has it.
func addName(list []string, name string) []string {
	if name == "" || slices.Contains(list, name) {
		return list
	}
	return append(list, name)
}

// plural says "1 request", "3 requests".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "h") {
		return strconv.Itoa(n) + " " + what + "es"
	}
	return strconv.Itoa(n) + " " + what + "s"
}
