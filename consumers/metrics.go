package consumers

import "sync/atomic"

// Metrics counts what this launcher process did since it started. The
// status server exports them for Prometheus.
type Metrics struct {
	RequestsReceived     atomic.Int64
	RequestsFulfilled    atomic.Int64
	RequestsFailed       atomic.Int64
	RequestsDeclined     atomic.Int64
	NodesLaunched        atomic.Int64
	NodesDeleted         atomic.Int64
	NodesReused          atomic.Int64
	LaunchAttemptsFailed atomic.Int64
	LaunchesFailed       atomic.Int64
	CloudWaits           atomic.Int64
	LeakedDeleted        atomic.Int64
	Interruptions        atomic.Int64
	SchedulerPasses      atomic.Int64
	SchedulerPassNanos   atomic.Int64
}

// NewMetrics returns zeroed counters.
func NewMetrics() *Metrics { return &Metrics{} }

// Counter is one named counter, for exporters.
type Counter struct {
	Name string
	Help string
	V    *atomic.Int64
}

// Counters lists the counters with names and help texts.
func (m *Metrics) Counters() []Counter {
	return []Counter{
		{"nodepool_requests_received_total", "Request messages recorded.", &m.RequestsReceived},
		{"nodepool_requests_fulfilled_total", "Requests fulfilled by this process.", &m.RequestsFulfilled},
		{"nodepool_requests_failed_total", "Requests failed by this process.", &m.RequestsFailed},
		{"nodepool_requests_declined_total", "Requests declined by a pool led by this process.", &m.RequestsDeclined},
		{"nodepool_nodes_launched_total", "Nodes that became ready through this process.", &m.NodesLaunched},
		{"nodepool_nodes_deleted_total", "Nodes deleted by this process.", &m.NodesDeleted},
		{"nodepool_nodes_reused_total", "Ready nodes allocated to requests.", &m.NodesReused},
		{"nodepool_launch_attempts_failed_total", "Launch attempts that failed.", &m.LaunchAttemptsFailed},
		{"nodepool_launches_failed_total", "Launches that failed after their last attempt.", &m.LaunchesFailed},
		{"nodepool_cloud_waits_total", "Times a cloud asked to wait (quota, capacity, rate).", &m.CloudWaits},
		{"nodepool_leaked_instances_deleted_total", "Leaked instances deleted.", &m.LeakedDeleted},
		{"nodepool_interruptions_total", "Nodes whose instance the cloud took back (spot interruptions), replaced or told.", &m.Interruptions},
		{"nodepool_scheduler_passes_total", "Passes of the pool schedulers led by this process.", &m.SchedulerPasses},
		{"nodepool_scheduler_pass_seconds_total", "Time spent in scheduler passes, in nanoseconds.", &m.SchedulerPassNanos},
	}
}
