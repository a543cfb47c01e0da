// Package builder runs the image builder's worker groups: build workers
// consume build triggers (nodepool.builds.<image>) and run diskimage-builder,
// upload workers consume upload triggers (nodepool.uploads.<image>.<provider>)
// and upload builds through the providers' drivers, and one scheduler (led
// by a lease) publishes the triggers that are due, fails work whose owner
// went away, and deletes what retention no longer keeps. Builds and uploads
// are records of the nodepool-images bucket; image files live in the
// nodepool-image-files object store, so any process can upload a build made
// by any other.
package builder

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodepool-nats/nodepool/internal/token"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/durable"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// Worker groups (durable consumers of the NODEPOOL_BUILDS stream) and the
// scheduler's lease.
const (
	BuildConsumer  = "image-builds"
	UploadConsumer = "image-uploads"
	SchedulerLease = "image-scheduler"
)

// Defaults of the options.
const (
	DefaultBuildWorkers  = 1
	DefaultUploadWorkers = 4
	DefaultRetryBase     = 10 * time.Second
)

// Retention, as in Nodepool: builds and uploads kept per image (and per
// provider for uploads).
const (
	KeepBuilds  = 2
	KeepUploads = 2
	// keepFailed bounds the failed builds kept after the newest ready one
	// (they count consecutive failures for the retry backoff).
	keepFailed = 7
	// maxInterrupted is how many times one trigger's build is started
	// again after its builder went away before the trigger is given up.
	maxInterrupted = 3
)

// Options configure a builder.
type Options struct {
	// ID is this process's identity (NODEPOOL_ID).
	ID     string
	Config *config.Config
	// Providers are the constructed drivers, by provider name; uploads go
	// to those that implement drivers.ImageProvider.
	Providers map[string]drivers.Provider
	// LeaseTTL must match the TTL of the locks bucket.
	LeaseTTL time.Duration
	// SyncInterval is how often the scheduler looks at every image.
	SyncInterval time.Duration
	// BuildWorkers and UploadWorkers are this process's share of the
	// worker groups; 0 takes no builds (or uploads).
	BuildWorkers  int
	UploadWorkers int
	// ImagesDir is where builds write their files before they are stored;
	// BuildLogDir keeps the build logs.
	ImagesDir   string
	BuildLogDir string
	// Replicas of the image files object store.
	Replicas int
	// RetryBase is the wait before a failed build or upload is tried
	// again; it doubles with each failure, up to 64 times.
	RetryBase time.Duration
	// Register writes this process's component record (a process that also
	// runs the launcher has one already).
	Register bool
	Version  string
	Log      *slog.Logger
	// Metrics is the process's metrics registry (nil: a private one).
	Metrics *metrics.Registry
	// Pacer paces the providers' API calls (image uploads, deletes and
	// listings), shared with the launcher of the same process (nil: one
	// of the builder's own).
	Pacer *drivers.Pacer
	// Leases is the process's one watch of the locks bucket, shared with
	// the launcher's leases (nil: the scheduler's lease watches its key).
	Leases *kv.LeaseWatch
	// Views are the process's caches (nil: caches of the builder's own):
	// the image records', fed by one watch, and the components'.
	Views *kv.Views
}

// Builder is one process's share of the builder's worker groups.
type Builder struct {
	opts Options
	// live is the configuration in force and its drivers; a reload swaps
	// it whole.
	live  atomic.Pointer[liveConfig]
	js    jetstream.JetStream
	b     *kv.Buckets
	img   *kv.ImageStores
	files jetstream.ObjectStore
	log   *slog.Logger
	// runID names this run of the process: the holder of its leases and the
	// owner recorded on the builds and uploads it runs.
	runID string
	// install names this nodepool installation (see BuildEnv).
	install string

	images  *kv.Cache[kv.DiskImage]
	builds  *kv.Cache[kv.ImageBuild]
	uploads *kv.Cache[kv.ImageUpload]

	mu     sync.Mutex
	active map[string]bool // builds and uploads running in this process

	// ids holds, by image, the highest build and upload ids seen given
	// out (see nextID).
	idsMu sync.Mutex
	ids   map[string][2]uint64

	metrics *metrics.Builder

	// up is true while every worker group of this builder is running.
	up atomic.Bool
}

// New prepares a builder; Run starts it.
func New(js jetstream.JetStream, b *kv.Buckets, opts Options) (*Builder, error) {
	if opts.ID == "" {
		return nil, errors.New("builder needs an id")
	}
	if opts.Config == nil {
		return nil, errors.New("builder needs a configuration")
	}
	if opts.ImagesDir == "" || opts.BuildLogDir == "" {
		return nil, errors.New("builder needs an images folder and a build log folder")
	}
	// Builds run in folders of their own: relative paths (the default data
	// folder is ./data) must not be read from there.
	for _, dir := range []*string{&opts.ImagesDir, &opts.BuildLogDir} {
		abs, err := filepath.Abs(*dir)
		if err != nil {
			return nil, fmt.Errorf("folder %s: %w", *dir, err)
		}
		*dir = abs
	}
	if opts.BuildWorkers < 0 || opts.UploadWorkers < 0 {
		return nil, fmt.Errorf("worker counts must be 0 or more, got %d build and %d upload workers", opts.BuildWorkers, opts.UploadWorkers)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	switch {
	case b.LeaseTTL > 0 && opts.LeaseTTL != 0 && opts.LeaseTTL != b.LeaseTTL:
		opts.Log.Warn("the builder's lease TTL differs from the buckets' TTL; using the buckets'", "configured", opts.LeaseTTL, "buckets", b.LeaseTTL)
		opts.LeaseTTL = b.LeaseTTL
	case opts.LeaseTTL == 0 && b.LeaseTTL > 0:
		opts.LeaseTTL = b.LeaseTTL
	case opts.LeaseTTL == 0:
		opts.LeaseTTL = 10 * time.Second
	}
	if opts.SyncInterval == 0 {
		opts.SyncInterval = 5 * time.Second
	}
	if opts.RetryBase == 0 {
		opts.RetryBase = DefaultRetryBase
	}
	if opts.Pacer == nil {
		opts.Pacer = drivers.NewPacer(opts.Log)
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	runID := opts.ID + "#" + hex.EncodeToString(nonce[:])
	log := opts.Log.With("builder", opts.ID)
	img := kv.NewImageStores(b.Images)
	caches := opts.Views.Images(b, log)
	bl := &Builder{
		opts: opts, js: js, b: b, img: img, log: log, runID: runID,
		images:  caches.Images,
		builds:  caches.Builds,
		uploads: caches.Uploads,
		active:  map[string]bool{},
		ids:     map[string][2]uint64{},
	}
	bl.images.Observe(bl.noteIDs)
	bl.live.Store(&liveConfig{cfg: opts.Config, providers: bl.pace(opts.Config, opts.Providers)})
	bl.metrics = metrics.NewBuilder(opts.Metrics, bl.workers)
	return bl, nil
}

// liveConfig is a configuration and its drivers.
type liveConfig struct {
	cfg       *config.Config
	providers map[string]drivers.Provider
}

// config is the configuration in force.
func (b *Builder) config() *config.Config { return b.live.Load().cfg }

// providers are the drivers of the configuration in force.
func (b *Builder) providers() map[string]drivers.Provider { return b.live.Load().providers }

// Reload makes a new configuration and its drivers the builder's: the
// scheduler's next pass schedules by its diskimages and providers; builds
// and uploads in flight finish with what they started with.
func (b *Builder) Reload(cfg *config.Config, providers map[string]drivers.Provider) {
	b.live.Store(&liveConfig{cfg: cfg, providers: b.pace(cfg, providers)})
	b.log.Info("builder configuration reloaded", "images", len(cfg.DiskimageNames()))
}

// pace makes the drivers' calls go through the process's limiters (the
// providers' rate), as the launcher's do.
func (b *Builder) pace(cfg *config.Config, providers map[string]drivers.Provider) map[string]drivers.Provider {
	out := make(map[string]drivers.Provider, len(providers))
	for name, p := range providers {
		rate := 0.0
		if pc, ok := cfg.Provider(name); ok {
			rate = pc.CallsPerSecond()
		}
		out[name] = b.opts.Pacer.Pace(name, p, rate)
	}
	return out
}

// Metrics returns the builder's series.
func (b *Builder) Metrics() *metrics.Builder { return b.metrics }

// workers counts the workers and what they do now.
func (b *Builder) workers() metrics.Workers {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := metrics.Workers{Builds: b.opts.BuildWorkers, Uploads: b.opts.UploadWorkers}
	for k := range b.active {
		if strings.HasPrefix(k, "build/") {
			w.BusyBuilds++
		} else {
			w.BusyUploads++
		}
	}
	return w
}

// Builds is the builder's view of the build records.
func (b *Builder) Builds() *kv.Cache[kv.ImageBuild] { return b.builds }

// Uploads is the builder's view of the upload records.
func (b *Builder) Uploads() *kv.Cache[kv.ImageUpload] { return b.uploads }

// Images is the builder's view of the image records (pause, ids).
func (b *Builder) Images() *kv.Cache[kv.DiskImage] { return b.images }

// Running reports whether the builder has started every worker group and
// is not stopping (readiness).
func (b *Builder) Running() bool { return b.up.Load() }

// ackWait is how long a trigger stays with a worker that stopped telling
// the server it still works on it: long enough for the worker's leases to
// expire first, so that the next worker finds the work orphaned.
func (b *Builder) ackWait() time.Duration { return max(3*b.opts.LeaseTTL, 3*time.Second) }

// keepAliveEvery is how often a running build or upload tells the server
// that its message is still being worked on.
func (b *Builder) keepAliveEvery() time.Duration { return b.opts.LeaseTTL / 3 }

// Run runs the builder's worker groups until ctx ends. Builds and uploads
// in progress are then stopped, recorded as interrupted and their triggers
// handed back, so another process takes them at once. A ctx that ends
// while the builder is still starting is a shutdown too: Run then returns
// nil.
func (b *Builder) Run(ctx context.Context) error {
	err := b.run(ctx)
	if err != nil && ctx.Err() != nil {
		b.log.Info("builder stopped while starting", "error", err)
		return nil
	}
	return err
}

func (b *Builder) run(ctx context.Context) error {
	for _, dir := range []string{b.opts.ImagesDir, b.opts.BuildLogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("builder: %w", err)
		}
	}
	files, err := EnsureFiles(ctx, b.js, b.opts.Replicas, b.log)
	if err != nil {
		return err
	}
	b.files = files
	if st, err := b.b.Images.Status(ctx); err == nil {
		if bst, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			b.install = strconv.FormatInt(bst.StreamInfo().Created.UnixNano(), 36)
		}
	}

	// One watch feeds the three caches (and the web API's, in the same
	// process); it runs while any of them is started.
	stops := []func(){b.images.Start(), b.builds.Start(), b.uploads.Start()}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for _, c := range []interface{ WaitSynced(context.Context) error }{b.images, b.builds, b.uploads} {
		if err := c.WaitSynced(ctx); err != nil {
			return err
		}
	}

	b.killEarlierRuns()
	b.cleanBuildDirs()

	var wg sync.WaitGroup
	if b.opts.Register {
		if err := b.heartbeat(ctx); err != nil {
			return fmt.Errorf("registering builder: %w", err)
		}
		wg.Go(func() { b.keepHeartbeat(ctx) })
		// A builder on its own keeps its share of the rates (with a
		// launcher in the process, the launcher does).
		components := b.opts.Views.Components(b.b, b.log)
		stops = append(stops, components.Start())
		wg.Go(func() {
			if components.WaitSynced(ctx) == nil {
				b.opts.Pacer.Share(ctx, components)
			}
		})
	}
	if err := b.startWorkers(ctx, &wg, BuildConsumer, "image builds", events.BuildsSubject, b.opts.BuildWorkers, b.handleBuild); err != nil {
		return err
	}
	if err := b.startWorkers(ctx, &wg, UploadConsumer, "image uploads", events.UploadsSubject, b.opts.UploadWorkers, b.handleUpload); err != nil {
		return err
	}
	sched := newScheduler(b)
	lease := kv.NewLease(b.b.Locks, SchedulerLease, b.runID, b.opts.LeaseTTL, b.log, kv.WithWatch(b.opts.Leases))
	wg.Go(func() { lease.Elect(ctx, sched.run) })

	b.log.Info("builder running", "build_workers", b.opts.BuildWorkers, "upload_workers", b.opts.UploadWorkers,
		"images", len(b.config().DiskimageNames()), "images_dir", b.opts.ImagesDir, "build_log_dir", b.opts.BuildLogDir)
	b.up.Store(true)
	<-ctx.Done()
	b.up.Store(false)
	b.log.Info("builder stopping")
	wg.Wait()
	if b.opts.Register {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if e, err := b.b.Components.Get(sctx, b.opts.ID); err == nil {
			_ = b.b.Components.Delete(sctx, b.opts.ID, e.Revision)
		}
	}
	b.log.Info("builder stopped")
	return nil
}

// cleanBuildDirs removes what builds killed with an earlier run of this
// process left in the images folder.
func (b *Builder) cleanBuildDirs() {
	entries, err := os.ReadDir(b.opts.ImagesDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		image, build, err := kv.ParseBuildName(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		if cur, ok := b.builds.Get(kv.BuildKey(image, build)); ok && cur.Value.State == kv.ImageBuilding && cur.Value.BuilderID != b.runID &&
			cur.Value.Builder != b.opts.ID {
			continue // another process on this host may be building it
		}
		if err := os.RemoveAll(filepath.Join(b.opts.ImagesDir, e.Name())); err == nil {
			b.log.Info("removed the files of an earlier build", "dir", e.Name())
		}
	}
}

// triggerMaxDeliver bounds the deliveries of a build or upload trigger: one
// that could not be acted on (NATS errors, a build interrupted again and
// again) is given up past it, and the image scheduler triggers again what
// is still needed.
const triggerMaxDeliver = 20

// nakLater hands a trigger back to be delivered again after a delay that
// grows with its deliveries (1 s doubling up to a minute, less up to a
// quarter at random).
func nakLater(msg jetstream.Msg) {
	n := uint64(1)
	if meta, err := msg.Metadata(); err == nil {
		n = meta.NumDelivered
	}
	d := time.Minute
	if n < 7 {
		d = time.Second << (n - 1)
	}
	_ = msg.NakWithDelay(d - time.Duration(mrand.Int64N(int64(d)/4+1)))
}

// handleGuarded runs a trigger's handler; one that panics is logged and
// the trigger terminated with the reason (never delivered again), and the
// worker goes on. A build or upload it had recorded loses its lease and is
// failed by the image scheduler.
func (b *Builder) handleGuarded(ctx context.Context, msg jetstream.Msg, what string, handle func(context.Context, jetstream.Msg)) {
	defer func() {
		if p := recover(); p != nil {
			b.log.Error("handling a trigger panicked; dropping it", "group", what, "subject", msg.Subject(), "panic", p, "stack", string(debug.Stack()))
			b.metrics.TriggerDropped()
			_ = msg.TermWithReason(fmt.Sprintf("internal error (a bug, please report it): %v", p))
		}
	}()
	handle(ctx, msg)
}

// startWorkers creates a worker group's durable consumer (made again if it
// is deleted, see internal/durable) and runs n workers that each take one
// trigger at a time, so a trigger waits in the stream, not in a process,
// until a worker is free.
func (b *Builder) startWorkers(ctx context.Context, wg *sync.WaitGroup, name, what, subject string, n int,
	handle func(context.Context, jetstream.Msg)) error {
	if n == 0 {
		return nil
	}
	cons, err := durable.Open(ctx, b.js, durable.Options{
		Stream: events.BuildsStream,
		Config: jetstream.ConsumerConfig{
			Durable:       name,
			Description:   what,
			FilterSubject: subject,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       b.ackWait(),
			MaxDeliver:    triggerMaxDeliver,
			MaxAckPending: 1000,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		},
		Missing: b.b.ReportMissing,
		Log:     b.log,
	})
	if err != nil {
		return fmt.Errorf("creating the %s consumer: %w", what, err)
	}
	var workers sync.WaitGroup
	for range n {
		workers.Go(func() { b.work(ctx, cons, what, handle) })
	}
	wg.Go(func() {
		workers.Wait()
		cons.Stop()
	})
	return nil
}

func (b *Builder) work(ctx context.Context, cons *durable.Consumer, what string, handle func(context.Context, jetstream.Msg)) {
	for ctx.Err() == nil {
		// A pull lost with a server of the cluster stops hearing its
		// heartbeats and is made again within seconds; an idle worker
		// pulls twice a minute.
		msg, err := cons.Next(ctx, 30*time.Second)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout) ||
				errors.Is(err, context.DeadlineExceeded) || errors.Is(err, durable.ErrUnavailable) {
				continue // nothing to do for a while, or the consumer is being made again
			}
			b.log.Warn("could not fetch a trigger; retrying", "group", what, "err", err)
			wait.Sleep(ctx, time.Second)
			continue
		}
		b.handleGuarded(ctx, msg, what, handle)
	}
}

// claim marks a build or upload as running in this process; false if it
// runs already (another worker of this process has it).
func (b *Builder) claim(key string) bool {
	b.mu.Lock()
	if b.active[key] {
		b.mu.Unlock()
		return false
	}
	b.active[key] = true
	b.mu.Unlock()
	b.workersChanged(key, true)
	return true
}

func (b *Builder) unclaim(key string) {
	b.mu.Lock()
	delete(b.active, key)
	b.mu.Unlock()
	b.workersChanged(key, false)
}

// workersChanged tells statsd what the workers do now.
func (b *Builder) workersChanged(key string, busy bool) {
	parts := strings.Split(key, "/")
	switch {
	case len(parts) == 2:
		b.metrics.WorkersChanged(parts[1], "", busy)
	case len(parts) >= 3:
		b.metrics.WorkersChanged(parts[1], strings.Join(parts[2:], "/"), busy)
	}
}

func (b *Builder) running(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active[key]
}

// Lease keys and local claim keys of builds and uploads.
func buildLease(image string) string { return "build." + token.Encode(image) }
func uploadLease(image, provider string) string {
	return "upload." + token.Encode(image) + "." + token.Encode(provider)
}
func buildClaim(image string) string            { return "build/" + image }
func uploadClaim(image, provider string) string { return "upload/" + image + "/" + provider }

// paused reports whether builds of an image are paused, by the
// configuration or by `nodepool image-pause`.
func (b *Builder) paused(di *config.Diskimage) bool {
	if di.Pause {
		return true
	}
	e, ok := b.images.Get(kv.DiskImageKey(di.Name))
	return ok && e.Value.Paused
}

// imageProvider returns the driver of a provider if it takes images.
func (b *Builder) imageProvider(name string) (drivers.ImageProvider, bool) {
	return drivers.As[drivers.ImageProvider](b.providers()[name])
}

// formats lists the formats a build of the image must have: those of its
// `formats` key and those the providers that list it take. An image no
// provider lists and with no formats is not built (as in Nodepool).
func (b *Builder) formats(di *config.Diskimage) []string {
	out := slices.Clone(di.Formats)
	for _, p := range b.config().ImageProviders(di.Name) {
		if ip, ok := b.imageProvider(p.Name); ok {
			out = append(out, ip.ImageFormat())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// backoff is the wait after n failures in a row (n >= 1).
func (b *Builder) backoff(n int) time.Duration {
	return b.opts.RetryBase << min(max(n-1, 0), 6)
}

// heartbeat writes the component record of a builder-only process.
func (b *Builder) heartbeat(ctx context.Context) error {
	host, _ := os.Hostname()
	now := time.Now().UTC()
	c := kv.Component{ID: b.opts.ID, Roles: []string{config.RoleBuilder}, Hostname: host, PID: os.Getpid(),
		Version: b.opts.Version, Heartbeat: now, Started: now, Providers: []string{}}
	// The providers it uploads to are not drained while it lives.
	for _, p := range b.config().Providers {
		c.Providers = append(c.Providers, p.Name)
	}
	_, err := b.b.Components.Upsert(ctx, b.opts.ID, func(cur *kv.Component, found bool) {
		started := cur.Started
		*cur = c
		if found && !started.IsZero() {
			cur.Started = started
		}
	})
	return err
}

func (b *Builder) keepHeartbeat(ctx context.Context) {
	t := time.NewTicker(b.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			hctx, cancel := context.WithTimeout(ctx, b.opts.LeaseTTL/3)
			if err := b.heartbeat(hctx); err != nil && ctx.Err() == nil {
				b.log.Warn("heartbeat failed", "err", err)
			}
			cancel()
		}
	}
}

// keepAlive keeps a lease (renewed every quarter of the TTL, see
// kv.Lease.Keep) and tells the server every keepAliveEvery that a message
// is still being worked on, until stop is called. It cancels the work as
// soon as the lease may be lost (taken, or not renewed in time: a third of
// the TTL before it can expire), since another process may then take over.
func (b *Builder) keepAlive(ctx context.Context, msg jetstream.Msg, lease *kv.Lease, cancel context.CancelCauseFunc) (stop func()) {
	kctx, stopKeep := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		lease.Keep(kctx, func(err error) { cancel(fmt.Errorf("%w: %v", errLeaseLost, err)) })
	})
	wg.Go(func() {
		t := time.NewTicker(b.keepAliveEvery())
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	return func() {
		stopKeep()
		wg.Wait()
	}
}

// Reasons work stops before it is done.
var (
	errLeaseLost = errors.New("lease lost")
	errStopping  = errors.New("the builder is stopping")
)

// writeCtx is a context for the writes that record how work ended: they
// must happen even when the worker's context ended.
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}
