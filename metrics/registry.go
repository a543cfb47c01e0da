// Package metrics holds nodepool's Prometheus series and the statsd names
// of Nodepool that they carry: what each process did (launches, requests,
// driver calls, image builds and uploads) and, exported by one process
// only, the gauges of the whole system (nodes, requests, pool quota).
package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Registry is one process's metrics: the Prometheus registry its status
// port serves and, when statsd is configured, the client that sends
// Nodepool's statsd names. The series both roles of a process share
// (leaked resources, driver calls) are made here, once.
type Registry struct {
	prom   *prometheus.Registry
	statsd *Statsd

	leaked *prometheus.CounterVec
	calls  *DriverCalls
}

// New makes a process's registry; sd may be nil (statsd off).
func New(sd *Statsd) *Registry {
	r := &Registry{prom: prometheus.NewRegistry(), statsd: sd}
	r.leaked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodepool_leaked_resources_deleted_total",
		Help: "Leaked resources (instances, images...) this process deleted, by provider and kind.",
	}, []string{"provider", "kind"})
	r.prom.MustRegister(r.leaked)
	r.calls = newDriverCalls(r)
	return r
}

// orNew returns r, or a private registry when r is nil (a role made
// without one, as tests do).
func orNew(r *Registry) *Registry {
	if r == nil {
		return New(nil)
	}
	return r
}

// Prometheus is the registry the status port serves.
func (r *Registry) Prometheus() *prometheus.Registry { return r.prom }

// Statsd is the statsd client (nil when statsd is off).
func (r *Registry) Statsd() *Statsd { return r.statsd }

// DriverCalls measures driver calls (see drivers.Measured).
func (r *Registry) DriverCalls() *DriverCalls { return r.calls }

// LeakedDeleted counts leaked resources of a kind deleted from a provider
// (instances, images, floatingips, ports, volumes...): Nodepool's
// nodepool.provider.<provider>.leaked.<kind>.
func (r *Registry) LeakedDeleted(provider, kind string, n int) {
	if n <= 0 {
		return
	}
	r.leaked.WithLabelValues(provider, kind).Add(float64(n))
	r.statsd.Count(int64(n), "nodepool", "provider", provider, "leaked", kind)
}

// Sum adds up the samples of a metric family whose labels match the given
// name=value pairs (counters, gauges, and a histogram's count). It is for
// tests and tools that read a process's figures without scraping.
func (r *Registry) Sum(name string, labels ...string) float64 {
	fams, err := r.prom.Gather()
	if err != nil {
		return 0
	}
	want := map[string]string{}
	for _, l := range labels {
		if k, v, ok := strings.Cut(l, "="); ok {
			want[k] = v
		}
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !matches(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}
