package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodepool-nats/nodepool/drivers"
)

// DriverCalls measures the calls made through drivers.Measured: latency
// per provider and method, and errors by kind.
type DriverCalls struct {
	took   *prometheus.HistogramVec
	errors *prometheus.CounterVec
	sd     *Statsd
}

// callBuckets span a local call (a millisecond) to an image upload.
var callBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

func newDriverCalls(r *Registry) *DriverCalls {
	d := &DriverCalls{
		took: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_driver_call_duration_seconds",
			Help:    "Calls to a provider's driver (state machine steps, listings, quota reads, image uploads), by provider and method.",
			Buckets: callBuckets,
		}, []string{"provider", "method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_driver_call_errors_total",
			Help: "Driver calls that returned an error, by provider, method and kind (quota, capacity, not_found, rate_limited, fatal, canceled, timeout, other).",
		}, []string{"provider", "method", "kind"}),
		sd: r.statsd,
	}
	r.prom.MustRegister(d.took, d.errors)
	return d
}

// ObserveCall implements drivers.CallObserver.
func (d *DriverCalls) ObserveCall(provider, method string, took time.Duration, err error) {
	d.took.WithLabelValues(provider, method).Observe(took.Seconds())
	if err != nil {
		d.errors.WithLabelValues(provider, method, drivers.ErrorKind(err)).Inc()
	}
	d.sd.Timing(took, "nodepool", "task", provider, method)
}

var _ drivers.CallObserver = (*DriverCalls)(nil)
