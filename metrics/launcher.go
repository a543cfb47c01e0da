package metrics

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodepool-nats/nodepool/config"
)

// Launch results, Nodepool's names (nodepool.launch.<result>).
const (
	LaunchReady = "ready"
	// LaunchQuota: the launch failed because the cloud refused for
	// quota.
	LaunchQuota = "error.quota"
	// LaunchError: the launch failed for any other reason.
	LaunchError = "error.unknown"
)

// LaunchFailureKinds are the kinds of nodepool_launch_failures_total: the
// kind of error of a failed launch's last attempt (drivers.ErrorKind, and
// boot_timeout for an instance not ready within boot-timeout).
var LaunchFailureKinds = []string{"quota", "capacity", "boot_timeout", "timeout", "fatal", "not_found", "rate_limited", "uncertain", "other"}

// Bounds of the values learnt from outside the configuration (see
// firstSeen).
const (
	// maxAZs is how many availability zones, over every provider, keep
	// their name in the launch series.
	maxAZs = 64
	// maxRequestors is how many requestors keep their name in the statsd
	// names nodepool.launch.requestor.<requestor>.<result>.
	maxRequestors = 20
)

// Request outcomes counted per pool.
const (
	RequestFulfilled = "fulfilled"
	RequestFailed    = "failed"
	RequestDeclined  = "declined"
)

// Launcher is what one launcher process did since it started.
type Launcher struct {
	reg        *Registry
	cfg        func() *config.Config
	azs        *firstSeen
	requestors *firstSeen

	launches       *prometheus.HistogramVec
	launchFailures *prometheus.CounterVec
	attemptsFailed *prometheus.CounterVec
	cloudWaits     *prometheus.CounterVec
	received       prometheus.Counter
	requests       *prometheus.CounterVec
	fulfilTime     *prometheus.HistogramVec
	allocated      *prometheus.CounterVec
	deleted        *prometheus.CounterVec
	passes         *prometheus.HistogramVec
	interruptions  *prometheus.CounterVec
	deadInstances  *prometheus.CounterVec
}

// launchBuckets span a simulated boot (a tenth of a second) to
// launch-timeout's default (an hour).
var launchBuckets = []float64{.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// passBuckets span a scheduler pass, from 50 µs to 5 s.
var passBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}

// NewLauncher registers a launcher's series in r (a private registry when
// r is nil). cfg is the configuration in force: provider and label names
// that it does not have are counted as Other.
func NewLauncher(r *Registry, cfg func() *config.Config) *Launcher {
	r = orNew(r)
	if cfg == nil {
		cfg = func() *config.Config { return &config.Config{} }
	}
	m := &Launcher{reg: r, cfg: cfg, azs: newFirstSeen(maxAZs), requestors: newFirstSeen(maxRequestors),
		launches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_launch_duration_seconds",
			Help:    "Launches this process ended, from the node's creation to ready or failed; _count counts them. By result (ready, error.quota, error.unknown), provider, availability zone, label and image.",
			Buckets: launchBuckets,
		}, []string{"result", "provider", "az", "label", "image"}),
		launchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_launch_failures_total",
			Help: "Launches this process failed for good (the node failed after its last attempt), by provider and kind of the last attempt's error (" + strings.Join(LaunchFailureKinds, ", ") + ").",
		}, []string{"provider", "kind"}),
		attemptsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_launch_attempts_failed_total",
			Help: "Launch attempts that failed (each failed attempt is retried up to launch-retries), by provider, label and error kind.",
		}, []string{"provider", "label", "kind"}),
		cloudWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_cloud_waits_total",
			Help: "Times a cloud asked a launch to wait (quota, capacity, rate_limited), by provider and kind.",
		}, []string{"provider", "kind"}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodepool_requests_received_total",
			Help: "Request messages this process recorded.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_requests_handled_total",
			Help: "Requests the pools led by this process fulfilled, failed or declined, by provider, pool and result.",
		}, []string{"provider", "pool", "result"}),
		fulfilTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_request_fulfil_duration_seconds",
			Help:    "Time from a request's submission to its fulfilment, by the provider and pool that fulfilled it.",
			Buckets: launchBuckets,
		}, []string{"provider", "pool"}),
		allocated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_ready_nodes_allocated_total",
			Help: "Ready nodes given to requests (reused, not launched for them), by provider and pool.",
		}, []string{"provider", "pool"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_nodes_deleted_total",
			Help: "Nodes this process deleted (instance and record), by provider and label.",
		}, []string{"provider", "label"}),
		passes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_scheduler_pass_duration_seconds",
			Help:    "Passes of the pool schedulers this process leads, by provider and pool.",
			Buckets: passBuckets,
		}, []string{"provider", "pool"}),
		interruptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_interruptions_total",
			Help: "Nodes whose instance the cloud takes back (spot interruptions) that this process acted on: replaced (a ready node) or told (its reason set), by provider and action.",
		}, []string{"provider", "action"}),
		deadInstances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_dead_instances_total",
			Help: "Nodes whose instance the cleanup found gone from the cloud or not running: failed (a ready node, replaced) or told (the instance_down of a node in use or held set), by provider and action.",
		}, []string{"provider", "action"}),
	}
	r.prom.MustRegister(m.launches, m.launchFailures, m.attemptsFailed, m.cloudWaits, m.received, m.requests, m.fulfilTime, m.allocated, m.deleted, m.passes, m.interruptions, m.deadInstances)
	// Failures start at zero for every provider, so that a graph of
	// their rate starts with the first one.
	for _, p := range cfg().Providers {
		for _, k := range LaunchFailureKinds {
			m.launchFailures.WithLabelValues(p.Name, k)
		}
	}
	return m
}

// provider is a provider's name if the configuration has it, else Other.
func (m *Launcher) provider(name string) string {
	if _, ok := m.cfg().Provider(name); ok {
		return name
	}
	return Other
}

// label is a label's name if the configuration has it, else Other.
func (m *Launcher) label(name string) string {
	if _, ok := m.cfg().Label(name); ok {
		return name
	}
	return Other
}

// az is an availability zone as the cloud reported it, if it is one of the
// first maxAZs seen (of a provider in the configuration), else Other.
func (m *Launcher) az(provider, az string) string {
	if az == "" {
		return ""
	}
	if provider == Other || m.azs.name(provider+"/"+az) == Other {
		return Other
	}
	return az
}

// Registry is the registry the series are in.
func (m *Launcher) Registry() *Registry { return m.reg }

// Launch records a launch that ended: Nodepool's nodepool.launch.<result>,
// nodepool.launch.provider.<provider>.<result>,
// nodepool.launch.provider.<provider>.<az>.<result>,
// nodepool.launch.image.<image>.<result> and
// nodepool.launch.requestor.<requestor>.<result> (counter and timer). image
// comes from the configuration; provider and label names it does not have
// are Other; the requestor (free text of whoever published the request)
// is in statsd only, and only the first maxRequestors of them keep their
// name.
func (m *Launcher) Launch(result, provider, az, label, image, requestor string, took time.Duration) {
	provider, label = m.provider(provider), m.label(label)
	az = m.az(provider, az)
	m.launches.WithLabelValues(result, provider, az, label, image).Observe(took.Seconds())
	sd := m.reg.statsd
	if sd == nil {
		return
	}
	keys := [][]string{{"nodepool", "launch", result}, {"nodepool", "launch", "provider", provider, result}}
	if az != "" {
		keys = append(keys, []string{"nodepool", "launch", "provider", provider, az, result})
	}
	if image != "" {
		keys = append(keys, []string{"nodepool", "launch", "image", image, result})
	}
	if requestor != "" {
		keys = append(keys, []string{"nodepool", "launch", "requestor", m.requestors.name(Normalize(requestor)), result})
	}
	for _, k := range keys {
		sd.Timing(took, k...)
		sd.Count(1, k...)
	}
}

// LaunchFailed counts a launch that failed for good, by the kind of its
// last attempt's error (one of LaunchFailureKinds, else other).
func (m *Launcher) LaunchFailed(provider, kind string) {
	if !slices.Contains(LaunchFailureKinds, kind) {
		kind = Other
	}
	m.launchFailures.WithLabelValues(m.provider(provider), kind).Inc()
}

// AttemptFailed records a failed launch attempt.
func (m *Launcher) AttemptFailed(provider, label, kind string) {
	m.attemptsFailed.WithLabelValues(m.provider(provider), m.label(label), kind).Inc()
}

// CloudWait records a cloud's request to wait.
func (m *Launcher) CloudWait(provider, kind string) {
	m.cloudWaits.WithLabelValues(provider, kind).Inc()
}

// RequestReceived records a request message recorded.
func (m *Launcher) RequestReceived() { m.received.Inc() }

// Request records a request a pool fulfilled, failed or declined; waited
// is the request's age when fulfilled (0 otherwise).
func (m *Launcher) Request(provider, pool, result string, waited time.Duration) {
	m.requests.WithLabelValues(provider, pool, result).Inc()
	if result == RequestFulfilled && waited > 0 {
		m.fulfilTime.WithLabelValues(provider, pool).Observe(waited.Seconds())
	}
}

// Allocated records a ready node given to a request.
func (m *Launcher) Allocated(provider, pool string) {
	m.allocated.WithLabelValues(provider, pool).Inc()
}

// NodeDeleted records a node deleted.
func (m *Launcher) NodeDeleted(provider, label string) {
	m.deleted.WithLabelValues(m.provider(provider), m.label(label)).Inc()
}

// Interruption counts a node whose instance the cloud takes back: action
// is "replaced" or "told".
func (m *Launcher) Interruption(provider, action string) {
	m.interruptions.WithLabelValues(provider, action).Inc()
}

// DeadInstance counts a node whose instance was found gone or not
// running: action is "failed" or "told".
func (m *Launcher) DeadInstance(provider, action string) {
	m.deadInstances.WithLabelValues(m.provider(provider), action).Inc()
}

// Pass records a scheduler pass.
func (m *Launcher) Pass(provider, pool string, took time.Duration) {
	m.passes.WithLabelValues(provider, pool).Observe(took.Seconds())
}

// LeakedDeleted counts leaked resources deleted (see Registry).
func (m *Launcher) LeakedDeleted(provider, kind string, n int) {
	m.reg.LeakedDeleted(provider, kind, n)
}

// PassObserver is Pass for one pool, looked up once (passes are many).
func (m *Launcher) PassObserver(provider, pool string) func(time.Duration) {
	o := m.passes.WithLabelValues(provider, pool)
	return func(d time.Duration) { o.Observe(d.Seconds()) }
}
