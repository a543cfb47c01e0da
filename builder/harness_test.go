package builder_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// leaseTTL is short in tests so that a dead builder is noticed quickly.
const leaseTTL = 2 * time.Second

// harness is one nats-server with the streams and buckets, and watch
// caches of the image records and of each fake cloud's images, so tests
// wait on records instead of sleeping.
type harness struct {
	leaseTTL time.Duration // of the buckets and the builders
	t        *testing.T
	srv      *natstest.Server
	js       jetstream.JetStream
	b        *kv.Buckets
	img      *kv.ImageStores
	cfg      *config.Config
	client   *client.Client
	// dir holds the files the fake-dib script is told to use.
	dir string

	builds  *kv.Cache[kv.ImageBuild]
	uploads *kv.Cache[kv.ImageUpload]
	clouds  map[string]*kv.Cache[fake.ImageRecord]

	mu      sync.Mutex
	history map[string][]kv.ImageBuild // every version of each build seen
}

func testLog(t testing.TB) *slog.Logger {
	if os.Getenv("NODEPOOL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// expand fills {{dib}} (the fake-dib script) and {{dir}} (the test's
// folder) into a configuration.
func (h *harness) expand(yaml string) string {
	dib, err := filepath.Abs("testdata/fake-dib")
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.NewReplacer("{{dib}}", dib, "{{dir}}", h.dir).Replace(yaml)
}

func (h *harness) parse(yaml string) *config.Config {
	h.t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(h.expand(yaml)))
	if err != nil {
		h.t.Fatalf("config: %v", err)
	}
	return cfg
}

func newHarness(t *testing.T, yaml string) *harness {
	t.Helper()
	return newHarnessTTL(t, yaml, leaseTTL)
}

// newHarnessTTL is newHarness with leases of ttl, for a test that does
// not kill builders and must not have its builds lose their leases on a
// loaded machine.
func newHarnessTTL(t *testing.T, yaml string, ttl time.Duration) *harness {
	t.Helper()
	h := &harness{t: t, srv: natstest.Start(t), dir: t.TempDir(), clouds: map[string]*kv.Cache[fake.ImageRecord]{}, leaseTTL: ttl}
	h.cfg = h.parse(yaml)
	nc, js := h.srv.Connect(t)
	h.js = js
	ctx := t.Context()
	if err := events.Ensure(ctx, js, 1, testLog(t)); err != nil {
		t.Fatal(err)
	}
	b, err := kv.Ensure(ctx, js, kv.Options{Replicas: 1, LeaseTTL: h.leaseTTL}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	h.b, h.img = b, kv.NewImageStores(b.Images)
	if h.client, err = client.New(ctx, nc); err != nil {
		t.Fatal(err)
	}
	h.builds, h.uploads = kv.NewCache(h.img.Builds, testLog(t)), kv.NewCache(h.img.Uploads, testLog(t))
	runCache(t, h.builds)
	runCache(t, h.uploads)
	// Every version of every build, from its writes (a cache may skip
	// versions).
	h.history = map[string][]kv.ImageBuild{}
	natstest.Puts(t, nc, kv.BucketImages, "*.*", func(key string, b kv.ImageBuild) {
		h.mu.Lock()
		h.history[key] = append(h.history[key], b)
		h.mu.Unlock()
	})
	for _, p := range h.cfg.Providers {
		if h.clouds[p.Cloud] != nil {
			continue
		}
		bucket, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fake.ImagesBucketName(p.Cloud), History: 1, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		c := kv.NewCache(kv.NewStore[fake.ImageRecord](bucket), testLog(t))
		runCache(t, c)
		h.clouds[p.Cloud] = c
	}
	return h
}

func runCache[T any](t *testing.T, c *kv.Cache[T]) {
	t.Cleanup(c.Start())
	if err := c.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// runningBuilder is a builder running in this test process, with its own
// connection and drivers.
type runningBuilder struct {
	*builder.Builder
	opts      builder.Options
	providers map[string]drivers.Provider
	cancel    context.CancelFunc
	done      chan struct{}
	t         testing.TB
}

// Stop shuts the builder down cleanly and waits, with a deadline: a builder
// that does not stop fails the test with every goroutine's stack (what it
// is stuck on), rather than hanging it until the test binary times out.
func (r *runningBuilder) Stop() {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<22)
		r.t.Errorf("builder %s did not stop within a minute of being told to; goroutines:\n%s", r.opts.ID, buf[:runtime.Stack(buf, true)])
	}
}

// fake returns the builder's fake driver of a provider.
func (r *runningBuilder) fake(name string) *fake.Provider { return r.providers[name].(*fake.Provider) }

// startBuilder runs a builder on a configuration (h.cfg if nil); change
// adjusts its options and may prepare its drivers before it runs.
func (h *harness) startBuilder(id string, cfg *config.Config, change func(*builder.Options)) *runningBuilder {
	h.t.Helper()
	if cfg == nil {
		cfg = h.cfg
	}
	_, js := h.srv.Connect(h.t)
	ctx, cancel := context.WithCancel(context.Background())
	providers, err := service.NewProviders(ctx, js, cfg, service.DriverOptions{Replicas: 1, Log: testLog(h.t)})
	if err != nil {
		h.t.Fatal(err)
	}
	b, err := kv.Open(ctx, js)
	if err != nil {
		h.t.Fatal(err)
	}
	opts := builder.Options{
		ID: id, Config: cfg, Providers: providers, LeaseTTL: h.leaseTTL, SyncInterval: 200 * time.Millisecond,
		BuildWorkers: 1, UploadWorkers: 2, ImagesDir: h.t.TempDir(), BuildLogDir: h.t.TempDir(),
		RetryBase: 200 * time.Millisecond, Register: true, Log: testLog(h.t).With("builder", id),
	}
	if change != nil {
		change(&opts)
	}
	bl, err := builder.New(js, b, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	rb := &runningBuilder{Builder: bl, opts: opts, providers: providers, cancel: cancel, done: make(chan struct{}), t: h.t}
	go func() {
		defer close(rb.done)
		if err := bl.Run(ctx); err != nil {
			h.t.Errorf("builder %s: %v", id, err)
		}
		for _, p := range providers {
			p.Close()
		}
	}()
	var once sync.Once
	h.t.Cleanup(func() { once.Do(rb.Stop) })
	return rb
}

// until waits, with a deadline, until cond holds, re-checking it whenever
// a build, an upload or a cloud image changes.
func (h *harness) until(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	bs := h.builds.Subscribe()
	defer h.builds.Unsubscribe(bs)
	us := h.uploads.Subscribe()
	defer h.uploads.Unsubscribe(us)
	opts := []waitfor.Option{waitfor.Changes(bs), waitfor.Changes(us), waitfor.Detail(h.dump)}
	for _, c := range h.clouds {
		s := c.Subscribe()
		defer c.Unsubscribe(s)
		opts = append(opts, waitfor.Changes(s))
	}
	waitfor.Until(h.t, timeout, what, cond, opts...)
}

// eventually waits, with a deadline, for a condition that no record
// change announces (the state of a consumer), looking every 20ms.
func (h *harness) eventually(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	waitfor.Until(h.t, timeout, what, cond, waitfor.Every(20*time.Millisecond), waitfor.Detail(h.dump))
}

// drained reports whether a worker group has no trigger waiting or in
// progress.
func (h *harness) drained(consumer string) bool {
	c, err := h.js.Consumer(h.t.Context(), events.BuildsStream, consumer)
	if err != nil {
		return false
	}
	info, err := c.Info(h.t.Context())
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

func (h *harness) dump() string {
	var b strings.Builder
	b.WriteString("builds:\n")
	h.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
		v := e.Value
		fmt.Fprintf(&b, "  %s %s builder=%s formats=%v trigger=%d interrupted=%v reason=%q\n", e.Key, v.State, v.BuilderID, v.Formats, v.Trigger, v.Interrupted, v.Reason)
		return true
	})
	b.WriteString("uploads:\n")
	h.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		v := e.Value
		fmt.Fprintf(&b, "  %s %s ext=%s uploader=%s attempt=%d reason=%q\n", e.Key, v.State, v.ExternalID, v.UploaderID, v.Attempt, v.Reason)
		return true
	})
	for cloud, c := range h.clouds {
		fmt.Fprintf(&b, "images of %s:\n", cloud)
		c.Range(func(e *kv.Entry[fake.ImageRecord]) bool {
			fmt.Fprintf(&b, "  %s %s %s upload=%s\n", e.Key, e.Value.Name, e.Value.Status, e.Value.Tags[drivers.TagUpload])
			return true
		})
	}
	return b.String()
}

// seen returns the first version of a build seen in a state (builds may be
// deleted by retention soon after).
func (h *harness) seen(image, id string, state kv.ImageState) (kv.ImageBuild, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range h.history[kv.BuildKey(image, id)] {
		if b.State == state {
			return b, true
		}
	}
	return kv.ImageBuild{}, false
}

// trigger publishes a manual build trigger, as `nodepool image-build` does.
func (h *harness) trigger(image string) {
	h.t.Helper()
	if err := h.client.RequestBuild(h.t.Context(), image, "test"); err != nil {
		h.t.Fatal(err)
	}
}

// buildsIn lists the builds of an image in a state ("" for any), oldest
// first.
func (h *harness) buildsIn(image string, state kv.ImageState) []kv.ImageBuild {
	var out []kv.ImageBuild
	h.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
		if e.Value.Image == image && (state == "" || e.Value.State == state) {
			out = append(out, e.Value)
		}
		return true
	})
	kv.SortBuildsNewestFirst(out)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// uploadsIn lists the uploads of an image to a provider in a state ("" for
// any).
func (h *harness) uploadsIn(image, provider string, state kv.ImageState) []kv.ImageUpload {
	var out []kv.ImageUpload
	h.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		u := e.Value
		if u.Image == image && u.Provider == provider && (state == "" || u.State == state) {
			out = append(out, u)
		}
		return true
	})
	return out
}

// cloudImage returns an image of a fake cloud.
// cloudImage reads an image of a fake cloud from its bucket (not the
// cache, which may be behind the upload records).
func (h *harness) cloudImage(cloud, id string) (fake.ImageRecord, bool) {
	h.t.Helper()
	bucket, err := h.js.KeyValue(h.t.Context(), fake.ImagesBucketName(cloud))
	if err != nil {
		h.t.Fatal(err)
	}
	e, err := kv.NewStore[fake.ImageRecord](bucket).Get(h.t.Context(), id)
	return e.Value, err == nil
}

// objectSHA256 reads an object of the image files store and hashes it.
func (h *harness) objectSHA256(name string) (string, int64) {
	h.t.Helper()
	obs, err := h.js.ObjectStore(h.t.Context(), builder.FilesBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	r, err := obs.Get(h.t.Context(), name)
	if err != nil {
		return "", -1
	}
	defer r.Close()
	hash := sha256.New()
	n, err := io.Copy(hash, r)
	if err != nil {
		h.t.Fatal(err)
	}
	return hex.EncodeToString(hash.Sum(nil)), n
}

// objects lists the names in the image files store.
func (h *harness) objects() []string {
	h.t.Helper()
	obs, err := h.js.ObjectStore(h.t.Context(), builder.FilesBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	infos, err := obs.List(h.t.Context())
	if err != nil {
		return nil
	}
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
	}
	return names
}

// lines counts the lines of a file (0 if it does not exist).
func lines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// gate is a fifo the fake-dib script waits on (FAKE_DIB_GATE).
type gate string

func newGate(t *testing.T, dir string) gate {
	t.Helper()
	path := filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return gate(path)
}

// open lets one waiting build go on.
func (g gate) open(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(string(g), os.O_WRONLY, 0) // blocks until the build reads
		if err == nil {
			_, err = f.WriteString("go\n")
			_ = f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no build waited at the gate")
	}
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && len(data) > i+2 && data[i+2] != 'Z' && data[i+2] != 'X'
}

// pids reads the pids the first hanging fake-dib wrote (itself and its
// child).
func pids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	var out []int
	for _, f := range strings.Fields(first) {
		var p int
		if _, err := fmt.Sscanf(f, "%d", &p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// jetstreamSubjects asks stream info for the subjects matching a filter.
func jetstreamSubjects(filter string) jetstream.StreamInfoOpt {
	return jetstream.WithSubjectFilter(filter)
}
