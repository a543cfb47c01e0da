package metrics

import (
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Image build and upload results.
const (
	ImageReady  = "ready"
	ImageFailed = "failed"
	// ImageInterrupted: the builder stopped or lost its lease; the work
	// is handed back and done again.
	ImageInterrupted = "interrupted"
)

// Workers is what a builder's workers are doing now.
type Workers struct {
	Builds, Uploads         int // configured (NODEPOOL_BUILD_WORKERS, NODEPOOL_UPLOAD_WORKERS)
	BusyBuilds, BusyUploads int
}

// Builder is what one builder process did since it started, and what
// its workers do now.
type Builder struct {
	reg  *Registry
	host string

	builds      *prometheus.HistogramVec
	buildSize   *prometheus.GaugeVec
	buildRC     *prometheus.GaugeVec
	buildLast   *prometheus.GaugeVec
	uploads     *prometheus.HistogramVec
	uploadSize  *prometheus.GaugeVec
	deleted     *prometheus.CounterVec
	dropped     prometheus.Counter
	workers     func() Workers
	workerGauge *prometheus.Desc
	busyGauge   *prometheus.Desc
}

// buildBuckets span an image build or upload, from a second to five
// hours (build-timeout's default is eight).
var buildBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 10800, 18000}

// NewBuilder registers a builder's series in r (a private registry when
// nil); workers reports the workers' counts at each scrape.
func NewBuilder(r *Registry, workers func() Workers) *Builder {
	r = orNew(r)
	host, _ := os.Hostname()
	m := &Builder{reg: r, host: host, workers: workers,
		builds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_image_build_duration_seconds",
			Help:    "Image builds this process ran, by image and result (ready, failed, interrupted); _count counts them.",
			Buckets: buildBuckets,
		}, []string{"image", "result"}),
		buildSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodepool_image_build_size_bytes",
			Help: "Size of the last image this process built, by image and format.",
		}, []string{"image", "format"}),
		buildRC: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodepool_image_build_status",
			Help: "Exit status of the last build of an image this process ran (0: success).",
		}, []string{"image"}),
		buildLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodepool_image_build_last_timestamp_seconds",
			Help: "Unix time the last build of an image this process ran ended.",
		}, []string{"image"}),
		uploads: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodepool_image_upload_duration_seconds",
			Help:    "Image uploads this process ran, by image, provider and result; _count counts them.",
			Buckets: buildBuckets,
		}, []string{"image", "provider", "result"}),
		uploadSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodepool_image_upload_size_bytes",
			Help: "Size of the last image this process uploaded, by image and provider.",
		}, []string{"image", "provider"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodepool_images_deleted_total",
			Help: "Old image builds and uploads this process deleted, by what (build, upload).",
		}, []string{"what"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodepool_image_triggers_dropped_total",
			Help: "Build and upload triggers answered without work (duplicates, bad messages).",
		}),
		workerGauge: prometheus.NewDesc("nodepool_builder_workers", "Build and upload workers of this process (NODEPOOL_BUILD_WORKERS, NODEPOOL_UPLOAD_WORKERS).", []string{"kind"}, nil),
		busyGauge:   prometheus.NewDesc("nodepool_builder_workers_busy", "Build and upload workers of this process busy now.", []string{"kind"}, nil),
	}
	r.prom.MustRegister(m.builds, m.buildSize, m.buildRC, m.buildLast, m.uploads, m.uploadSize, m.deleted, m.dropped, workerCollector{m})
	return m
}

// Registry is the registry the series are in.
func (m *Builder) Registry() *Registry { return m.reg }

// BuildEnded records a build: Nodepool's
// nodepool.dib_image_build.<image>.status.rc, .status.duration,
// .status.last_build and .<format>.size.
func (m *Builder) BuildEnded(image, result string, rc int, took time.Duration, sizes map[string]int64) {
	m.builds.WithLabelValues(image, result).Observe(took.Seconds())
	if result == ImageInterrupted {
		return
	}
	now := time.Now()
	m.buildRC.WithLabelValues(image).Set(float64(rc))
	m.buildLast.WithLabelValues(image).Set(float64(now.Unix()))
	for f, n := range sizes {
		m.buildSize.WithLabelValues(image, f).Set(float64(n))
	}
	sd := m.reg.statsd
	sd.Gauge(int64(rc), "nodepool", "dib_image_build", image, "status", "rc")
	sd.Timing(took, "nodepool", "dib_image_build", image, "status", "duration")
	sd.Gauge(now.Unix(), "nodepool", "dib_image_build", image, "status", "last_build")
	for f, n := range sizes {
		sd.Gauge(n, "nodepool", "dib_image_build", image, f, "size")
	}
}

// UploadEnded records an upload: Nodepool's
// nodepool.image_update.<image>.<provider> (counter and timer).
func (m *Builder) UploadEnded(image, provider, result string, took time.Duration, size int64) {
	m.uploads.WithLabelValues(image, provider, result).Observe(took.Seconds())
	if result == ImageReady {
		m.uploadSize.WithLabelValues(image, provider).Set(float64(size))
		m.reg.statsd.Timing(took, "nodepool", "image_update", image, provider)
		m.reg.statsd.Count(1, "nodepool", "image_update", image, provider)
	}
}

// WorkersChanged sends the workers' gauges to statsd (Nodepool's
// nodepool.builder.<hostname>.current_builds, .current_uploads,
// .build_workers, .upload_workers) and, for an image whose build or
// upload started or ended, its state (.image.<image>.build.state: 1
// building, 0 idle; .image.<image>.provider.<provider>.upload.state: 2
// uploading, 0 idle).
func (m *Builder) WorkersChanged(image, provider string, busy bool) {
	sd := m.reg.statsd
	if sd == nil {
		return
	}
	w := m.workers()
	host := Normalize(m.host)
	sd.Gauge(int64(w.BusyBuilds), "nodepool", "builder", host, "current_builds")
	sd.Gauge(int64(w.BusyUploads), "nodepool", "builder", host, "current_uploads")
	sd.Gauge(int64(w.Builds), "nodepool", "builder", host, "build_workers")
	sd.Gauge(int64(w.Uploads), "nodepool", "builder", host, "upload_workers")
	state := int64(0)
	switch {
	case provider == "":
		if busy {
			state = 1
		}
		sd.Gauge(state, "nodepool", "builder", host, "image", image, "build", "state")
	default:
		if busy {
			state = 2
		}
		sd.Gauge(state, "nodepool", "builder", host, "image", image, "provider", provider, "upload", "state")
	}
}

// Deleted counts an old build or upload deleted.
func (m *Builder) Deleted(what string) { m.deleted.WithLabelValues(what).Inc() }

// TriggerDropped counts a trigger answered without work.
func (m *Builder) TriggerDropped() { m.dropped.Inc() }

// LeakedDeleted counts leaked images deleted (see Registry).
func (m *Builder) LeakedDeleted(provider, kind string, n int) { m.reg.LeakedDeleted(provider, kind, n) }

// workerCollector reads the workers' counts at each scrape.
type workerCollector struct{ m *Builder }

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.workerGauge
	ch <- c.m.busyGauge
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.m.workers()
	ch <- prometheus.MustNewConstMetric(c.m.workerGauge, prometheus.GaugeValue, float64(w.Builds), "build")
	ch <- prometheus.MustNewConstMetric(c.m.workerGauge, prometheus.GaugeValue, float64(w.Uploads), "upload")
	ch <- prometheus.MustNewConstMetric(c.m.busyGauge, prometheus.GaugeValue, float64(w.BusyBuilds), "build")
	ch <- prometheus.MustNewConstMetric(c.m.busyGauge, prometheus.GaugeValue, float64(w.BusyUploads), "upload")
}
