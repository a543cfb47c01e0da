package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodepool-nats/nodepool/service"
)

// metricsHandler serves the process's Prometheus metrics: Go's and the
// process's, and the series of its roles (package metrics).
func metricsHandler(p *service.Process) http.Handler {
	reg := p.Metrics().Prometheus()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
