package web

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// History is what the fleet did in the last hour, minute by minute, as
// this process saw it in the node and request records: launches that
// ended ready or failed, failed launch attempts, requests fulfilled (and
// how long they waited) and failed, in all and per provider. It is kept
// in memory, in a ring of one sample per minute: nothing is stored
// anywhere else, and a process that starts knows only what its records
// still show (ready nodes, requests not yet deleted, with their times).
type History struct {
	now func() time.Time

	mu      sync.Mutex
	minutes [historyMinutes]historyMinute
}

const (
	// historyMinutes is how many minutes the ring keeps.
	historyMinutes = 60
	// latencySamples bounds the request latencies a minute keeps to
	// compute its median and 95th percentile (a random sample of them
	// beyond that).
	latencySamples = 128
	// historyProviders bounds the providers a minute counts by name
	// (provider names come from records: anyone may write one); the
	// rest are counted under otherProviders.
	historyProviders = 64
	otherProviders   = "(others)"
)

// historyMinute is one minute's sample.
type historyMinute struct {
	// minute is the Unix time of the minute's start, in minutes (0: the
	// slot is empty).
	minute int64
	historyCounts
	latencies  []float64 // a sample of the latencies, in seconds
	latencyN   int       // how many requests were fulfilled
	latencyMax float64
	providers  map[string]*providerCounts
}

// historyCounts are the events counted in a minute.
type historyCounts struct {
	Launches          int `json:"launches"`
	LaunchFailures    int `json:"launch_failures"`
	AttemptsFailed    int `json:"attempts_failed"`
	RequestsFulfilled int `json:"requests_fulfilled"`
	RequestsFailed    int `json:"requests_failed"`
}

// providerCounts are a provider's events in a minute, with the last
// reason something failed for.
type providerCounts struct {
	historyCounts
	lastFailure     string
	lastFailureTime time.Time
}

// NewHistory makes an empty history; now is the clock (nil: time.Now).
func NewHistory(now func() time.Time) *History {
	if now == nil {
		now = time.Now
	}
	return &History{now: now}
}

// slot returns the sample of the minute of t, or nil when t is not in the
// last hour (or more than a minute ahead: a clock that is wrong). The
// caller holds mu.
func (h *History) slot(t time.Time) *historyMinute {
	now := h.now().Unix() / 60
	m := t.Unix() / 60
	if m > now {
		if m > now+1 {
			return nil
		}
		m = now
	}
	if m <= now-historyMinutes {
		return nil
	}
	s := &h.minutes[m%historyMinutes]
	if s.minute != m {
		*s = historyMinute{minute: m}
	}
	return s
}

// provider returns a minute's counts of a provider. The caller holds mu.
func (s *historyMinute) provider(name string) *providerCounts {
	if s.providers == nil {
		s.providers = map[string]*providerCounts{}
	}
	p, ok := s.providers[name]
	if !ok {
		if len(s.providers) >= historyProviders {
			name = otherProviders
			if p, ok = s.providers[name]; ok {
				return p
			}
		}
		p = &providerCounts{}
		s.providers[name] = p
	}
	return p
}

// ObserveNode counts a change of a node record: a node that became ready
// after its launch, one that failed while launching, and each failed
// launch attempt (a building node whose attempt number grows; the last
// one fails the node). Kept as events at the record's state time, so the
// records a process finds at its start count where they belong; only
// changes of state count, so a record seen again does not.
func (h *History) ObserveNode(ch kv.Change[kv.Node]) {
	if ch.New == nil {
		return
	}
	n := &ch.New.Value
	var old *kv.Node
	if ch.Old != nil {
		old = &ch.Old.Value
	}
	launching := old == nil || old.State == kv.NodeInit || old.State == kv.NodeBuilding
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case n.State == kv.NodeReady && launching && (old == nil || old.State != kv.NodeReady):
		if s := h.slot(n.StateTime); s != nil {
			s.Launches++
			s.provider(n.Provider).Launches++
		}
	case n.State == kv.NodeFailed && old != nil && launching:
		// A failed node seen first at the start may have failed after
		// its launch (a machine found dead): only the change counts.
		if s := h.slot(n.StateTime); s != nil {
			s.LaunchFailures++
			s.AttemptsFailed++
			p := s.provider(n.Provider)
			p.LaunchFailures++
			p.AttemptsFailed++
			p.noteFailure(n.Reason, n.StateTime)
		}
	case n.State == kv.NodeBuilding && old != nil && old.State == kv.NodeBuilding && n.Attempt > old.Attempt && old.Attempt > 0:
		// A retry: the attempt before failed, now (the state time is
		// the launch's start).
		at := h.now()
		if s := h.slot(at); s != nil {
			k := n.Attempt - old.Attempt
			s.AttemptsFailed += k
			p := s.provider(n.Provider)
			p.AttemptsFailed += k
			p.noteFailure(n.Reason, at)
		}
	}
}

// ObserveRequest counts a change of a request record: fulfilled (with
// the time from its submission) or failed.
func (h *History) ObserveRequest(ch kv.Change[kv.Request]) {
	if ch.New == nil {
		return
	}
	r := &ch.New.Value
	if ch.Old != nil && ch.Old.Value.State == r.State {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch r.State {
	case kv.RequestFulfilled:
		s := h.slot(r.StateTime)
		if s == nil {
			return
		}
		s.RequestsFulfilled++
		s.provider(r.Provider).RequestsFulfilled++
		took := r.StateTime.Sub(r.Created).Seconds()
		if r.Created.IsZero() || took < 0 {
			return
		}
		s.latencyN++
		s.latencyMax = max(s.latencyMax, took)
		if len(s.latencies) < latencySamples {
			s.latencies = append(s.latencies, took)
		} else if i := rand.IntN(s.latencyN); i < latencySamples {
			s.latencies[i] = took // reservoir sampling: each kept alike
		}
	case kv.RequestFailed:
		s := h.slot(r.StateTime)
		if s == nil {
			return
		}
		s.RequestsFailed++
		if r.Provider != "" {
			p := s.provider(r.Provider)
			p.RequestsFailed++
			p.noteFailure(r.Reason, r.StateTime)
		}
	}
}

func (p *providerCounts) noteFailure(reason string, at time.Time) {
	if !at.Before(p.lastFailureTime) {
		p.lastFailure, p.lastFailureTime = reason, at
	}
}

// HistoryReport is the last hour as the dashboard shows it.
type HistoryReport struct {
	// Minutes are the last historyMinutes minutes, the oldest first, the
	// current one last.
	Minutes []MinuteReport `json:"minutes"`
	// Hour adds up the minutes.
	Hour historyCounts `json:"hour"`
	// LatencyP50 and LatencyP95 are over the hour's requests fulfilled
	// (of the sample the minutes keep), in seconds.
	LatencyP50 float64 `json:"latency_p50"`
	LatencyP95 float64 `json:"latency_p95"`
	LatencyMax float64 `json:"latency_max"`
	// Providers are the hour's counts per provider, by name.
	Providers []ProviderReport `json:"providers"`
}

// MinuteReport is one minute of the report.
type MinuteReport struct {
	Start time.Time `json:"start"`
	historyCounts
	// Latencies of the requests fulfilled in the minute, in seconds.
	LatencyP50 float64 `json:"latency_p50"`
	LatencyP95 float64 `json:"latency_p95"`
	LatencyMax float64 `json:"latency_max"`
}

// ProviderReport is a provider's hour.
type ProviderReport struct {
	Name string `json:"name"`
	historyCounts
	LastFailure     string     `json:"last_failure,omitempty"`
	LastFailureTime *time.Time `json:"last_failure_time,omitempty"`
}

// Report returns the last hour.
func (h *History) Report() HistoryReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now().Unix() / 60
	out := HistoryReport{Minutes: make([]MinuteReport, 0, historyMinutes)}
	var hour []weighted
	providers := map[string]*providerCounts{}
	for m := now - historyMinutes + 1; m <= now; m++ {
		r := MinuteReport{Start: time.Unix(m*60, 0).UTC()}
		s := &h.minutes[m%historyMinutes]
		if s.minute == m {
			r.historyCounts = s.historyCounts
			mine := s.weighted()
			r.LatencyP50, r.LatencyP95 = percentiles(mine)
			r.LatencyMax = s.latencyMax
			out.LatencyMax = max(out.LatencyMax, s.latencyMax)
			hour = append(hour, mine...)
			out.Hour.add(s.historyCounts)
			for name, c := range s.providers {
				p, ok := providers[name]
				if !ok {
					p = &providerCounts{}
					providers[name] = p
				}
				p.add(c.historyCounts)
				p.noteFailure(c.lastFailure, c.lastFailureTime)
			}
		}
		out.Minutes = append(out.Minutes, r)
	}
	out.LatencyP50, out.LatencyP95 = percentiles(hour)
	for name, p := range providers {
		r := ProviderReport{Name: name, historyCounts: p.historyCounts, LastFailure: p.lastFailure}
		if !p.lastFailureTime.IsZero() {
			t := p.lastFailureTime
			r.LastFailureTime = &t
		}
		out.Providers = append(out.Providers, r)
	}
	sort.Slice(out.Providers, func(i, j int) bool { return out.Providers[i].Name < out.Providers[j].Name })
	return out
}

func (c *historyCounts) add(o historyCounts) {
	c.Launches += o.Launches
	c.LaunchFailures += o.LaunchFailures
	c.AttemptsFailed += o.AttemptsFailed
	c.RequestsFulfilled += o.RequestsFulfilled
	c.RequestsFailed += o.RequestsFailed
}

// weighted is a latency of a minute's sample, with the number of
// requests it stands for.
type weighted struct{ seconds, weight float64 }

// weighted returns the minute's sample, each latency standing for its
// share of the minute's requests.
func (s *historyMinute) weighted() []weighted {
	out := make([]weighted, len(s.latencies))
	for i, l := range s.latencies {
		out[i] = weighted{l, float64(s.latencyN) / float64(len(s.latencies))}
	}
	return out
}

// percentiles returns the median and the 95th percentile of weighted
// samples (the smallest latency at or above which the share lies), 0 for
// none.
func percentiles(samples []weighted) (p50, p95 float64) {
	if len(samples) == 0 {
		return 0, 0
	}
	s := slices.Clone(samples)
	slices.SortFunc(s, func(a, b weighted) int { return cmp.Compare(a.seconds, b.seconds) })
	var total float64
	for _, w := range s {
		total += w.weight
	}
	at := func(p float64) float64 {
		var sum float64
		for _, w := range s {
			sum += w.weight
			if sum >= p*total-1e-9 {
				return w.seconds
			}
		}
		return s[len(s)-1].seconds
	}
	return at(0.5), at(0.95)
}
