package builder

import "sync/atomic"

// Metrics counts what this builder process did since it started. The
// status server exports them for Prometheus.
type Metrics struct {
	BuildsStarted       atomic.Int64
	BuildsReady         atomic.Int64
	BuildsFailed        atomic.Int64
	BuildsDeleted       atomic.Int64
	UploadsReady        atomic.Int64
	UploadsFailed       atomic.Int64
	UploadsDeleted      atomic.Int64
	LeakedImagesDeleted atomic.Int64
	TriggersDropped     atomic.Int64
}

// Counter is one named counter, for exporters.
type Counter struct {
	Name string
	Help string
	V    *atomic.Int64
}

// Counters lists the counters with names and help texts.
func (m *Metrics) Counters() []Counter {
	return []Counter{
		{"nodepool_image_builds_started_total", "Image builds started by this process.", &m.BuildsStarted},
		{"nodepool_image_builds_ready_total", "Image builds that became ready in this process.", &m.BuildsReady},
		{"nodepool_image_builds_failed_total", "Image builds that failed or were interrupted in this process.", &m.BuildsFailed},
		{"nodepool_image_builds_deleted_total", "Image builds deleted by this process.", &m.BuildsDeleted},
		{"nodepool_image_uploads_ready_total", "Image uploads that became ready in this process.", &m.UploadsReady},
		{"nodepool_image_uploads_failed_total", "Image uploads that failed or were interrupted in this process.", &m.UploadsFailed},
		{"nodepool_image_uploads_deleted_total", "Image uploads deleted by this process.", &m.UploadsDeleted},
		{"nodepool_leaked_images_deleted_total", "Leaked images deleted from providers.", &m.LeakedImagesDeleted},
		{"nodepool_image_triggers_dropped_total", "Build and upload triggers answered without work (duplicates, bad messages).", &m.TriggersDropped},
	}
}
