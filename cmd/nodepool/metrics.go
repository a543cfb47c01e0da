package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodepool-nats/nodepool/service"
)

// metricsHandler serves the process's Prometheus metrics: Go's and the
// process's, and the counters of its roles.
func metricsHandler(p *service.Process) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if l := p.Launcher(); l != nil {
		for _, c := range l.Metrics().Counters() {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.Name, Help: c.Help},
				func() float64 { return float64(c.V.Load()) }))
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodepool_nodes", Help: "Node records seen by this process."},
			func() float64 { return float64(l.Nodes().Len()) }))
	}
	if b := p.Builder(); b != nil {
		for _, c := range b.Metrics().Counters() {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.Name, Help: c.Help},
				func() float64 { return float64(c.V.Load()) }))
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
