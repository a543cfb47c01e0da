package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// imageRecords watches the build and upload records of a server.
type imageRecords struct {
	t       *testing.T
	client  *client.Client
	builds  *kv.Cache[kv.ImageBuild]
	uploads *kv.Cache[kv.ImageUpload]

	mu      sync.Mutex
	history map[string][]kv.ImageBuild // every version of each build seen
}

func watchImages(t *testing.T, url string) *imageRecords {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var c *client.Client
	// The buckets exist once a nodepool process created them (no event
	// announces them: polled).
	waitfor.UntilErr(t, 30*time.Second, "the buckets a nodepool process makes", func(ctx context.Context) (bool, error) {
		c, err = client.New(ctx, nc)
		return err == nil, err
	}, waitfor.Every(50*time.Millisecond))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &imageRecords{t: t, client: c, builds: kv.NewCache(c.Images().Builds, log), uploads: kv.NewCache(c.Images().Uploads, log),
		history: map[string][]kv.ImageBuild{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{r.builds.Run, r.uploads.Run} {
		wg.Go(func() { _ = run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	// Every version of every build: every write from now on (a cache may
	// skip versions), after those the buckets held before.
	natstest.Puts(t, nc, kv.BucketImages, "*.*", func(key string, b kv.ImageBuild) {
		r.mu.Lock()
		r.history[key] = append(r.history[key], b)
		r.mu.Unlock()
	})
	if err := r.builds.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
		r.history[e.Key] = append([]kv.ImageBuild{e.Value}, r.history[e.Key]...)
		return true
	})
	r.mu.Unlock()
	return r
}

// until waits for cond, re-checking it on every change of the records and
// every 50ms for what records do not announce (files, processes).
func (r *imageRecords) until(timeout time.Duration, what string, cond func() bool) {
	r.t.Helper()
	sb, su := r.builds.Subscribe(), r.uploads.Subscribe()
	defer r.builds.Unsubscribe(sb)
	defer r.uploads.Unsubscribe(su)
	waitfor.Until(r.t, timeout, what, cond, waitfor.Every(50*time.Millisecond), waitfor.Changes(sb), waitfor.Changes(su), waitfor.Detail(func() string {
		var b strings.Builder
		r.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
			fmt.Fprintf(&b, "  %s %s by %s %q\n", e.Key, e.Value.State, e.Value.Builder, e.Value.Reason)
			return true
		})
		r.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
			fmt.Fprintf(&b, "  %s %s by %s %q\n", e.Key, e.Value.State, e.Value.Uploader, e.Value.Reason)
			return true
		})
		return b.String()
	}))
}

func (r *imageRecords) build(image, id string) (kv.ImageBuild, bool) {
	e, ok := r.builds.Get(kv.BuildKey(image, id))
	return e.Value, ok
}

// seen returns the first version of a build seen in a state.
func (r *imageRecords) seen(image, id string, state kv.ImageState) (kv.ImageBuild, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.history[kv.BuildKey(image, id)] {
		if b.State == state {
			return b, true
		}
	}
	return kv.ImageBuild{}, false
}

func (r *imageRecords) readyUploads(image, provider string) []kv.ImageUpload {
	var out []kv.ImageUpload
	r.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if e.Value.Image == image && e.Value.Provider == provider && e.Value.State == kv.ImageReady {
			out = append(out, e.Value)
		}
		return true
	})
	return out
}

func fakeDib(t *testing.T) string {
	t.Helper()
	path, err := filepath.Abs("../../builder/testdata/fake-dib")
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && len(data) > i+2 && data[i+2] != 'Z' && data[i+2] != 'X'
}

// A `nodepool builder` killed (SIGKILL) in the middle of a build leaves no
// build stuck in building: another builder finds it orphaned, kills what
// is left of its processes, marks it failed and builds the image again;
// a third process, which builds nothing and has none of the files on its
// disk, uploads that build.
func TestBuilderKilledMidBuild(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	url := srv.ClientURL()
	dir := t.TempDir()
	cfg := writeConfig(t, fmt.Sprintf(`
diskimages:
  - name: debian
    dib-cmd: %s
    elements: [debian-minimal]
    env-vars:
      FAKE_DIB_SIZE: "200000"
      FAKE_DIB_HANG_ONCE: %s/hung
      FAKE_DIB_PIDFILE: %s/pids
labels: [{name: debian}]
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
`, fakeDib(t), dir, dir))
	env := func(id string, builds, uploads int) map[string]string {
		return map[string]string{
			"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_DATA_DIR": t.TempDir(), "NODEPOOL_HTTP_ADDR": "127.0.0.1:0",
			// A lease of 6 s: with 2 s, on a loaded machine, builder-a lost
			// its build's lease (no renewal answered in 1.3 s) and gave the
			// hanging build up before the test saw it building.
			"NODEPOOL_LEASE_TTL": "6s", "NODEPOOL_SYNC_INTERVAL": "200ms",
			"NODEPOOL_BUILD_WORKERS": fmt.Sprint(builds), "NODEPOOL_UPLOAD_WORKERS": fmt.Sprint(uploads),
		}
	}
	a := startDaemon(t, env("builder-a", 1, 0), "builder", "-c", cfg)
	a.waitLog("builder running", 30*time.Second)
	rec := watchImages(t, url)
	var hung []int
	rec.until(20*time.Second, "builder-a building", func() bool {
		b, ok := rec.build("debian", "0000000001")
		data, _ := os.ReadFile(filepath.Join(dir, "pids"))
		if !ok || b.State != kv.ImageBuilding || len(data) == 0 {
			return false
		}
		for _, f := range strings.Fields(string(data)) {
			var pid int
			fmt.Sscan(f, &pid)
			hung = append(hung, pid)
		}
		return true
	})
	_ = a.stop(syscall.SIGKILL, 10*time.Second)

	b := startDaemon(t, env("builder-b", 1, 0), "builder", "-c", cfg)
	c := startDaemon(t, env("uploader-c", 0, 1), "builder", "-c", cfg)
	rec.until(30*time.Second, "the image rebuilt by builder-b and uploaded by uploader-c", func() bool {
		ups := rec.readyUploads("debian", "cloud1")
		return len(ups) == 1 && ups[0].BuildID == "0000000002"
	})
	first, _ := rec.seen("debian", "0000000001", kv.ImageFailed)
	if first.State != kv.ImageFailed || !first.Interrupted || first.Builder != "builder-a" || !strings.Contains(first.Reason, "builder-a went away") {
		t.Errorf("the killed build: %+v", first)
	}
	second, _ := rec.build("debian", "0000000002")
	up := rec.readyUploads("debian", "cloud1")[0]
	if second.State != kv.ImageReady || second.Builder != "builder-b" || up.Uploader != "uploader-c" {
		t.Errorf("build by %s (%s), upload by %s", second.Builder, second.State, up.Uploader)
	}
	// The uploaded image holds exactly the build's bytes.
	bucket, err := rec.client.JetStream().KeyValue(t.Context(), fake.ImagesBucketName("cloud1"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := kv.NewStore[fake.ImageRecord](bucket).Get(t.Context(), up.ExternalID)
	if err != nil || img.Value.SHA256 != second.Files["qcow2"].SHA256 || img.Value.Size != 200000 {
		t.Errorf("uploaded image %+v (%v), build file %+v", img.Value, err, second.Files["qcow2"])
	}
	rec.until(10*time.Second, "the killed build's processes gone", func() bool {
		for _, pid := range hung {
			if processAlive(pid) {
				return false
			}
		}
		return true
	})
	for _, p := range []*proc{b, c} {
		if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
			t.Errorf("builder exited with %v", err)
		}
		if !strings.Contains(p.output(), "builder stopped") {
			t.Error("no clean shutdown in a builder's log")
		}
	}
}

// The image commands against `nodepool run` (launcher and builder in one
// process): a request for a diskimage label waits for the first build and
// upload; image-build, the lists, image-delete (rollback), dib-image-delete,
// image-pause and alien-image-list.
func TestCLIImages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := writeConfig(t, fmt.Sprintf(`
diskimages:
  - name: debian
    dib-cmd: %s
    env-vars: {FAKE_DIB_COUNT: %s/count}
labels: [{name: debian}]
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
`, fakeDib(t), dir))
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	env["NODEPOOL_SYNC_INTERVAL"] = "5s" // leaks are deleted on their second sighting: leave time to list one
	p := startRun(t, env, "-c", cfg)
	p.waitLog("builder running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	cli := map[string]string{"NODEPOOL_NATS_URL": url, "NODEPOOL_CONFIG": cfg}
	rec := watchImages(t, url)

	// The request waits for the image, then boots from its upload.
	out, errOut, code := nodepool(t, cli, "request", "--json", "--timeout", "60s", "debian")
	if code != 0 {
		t.Fatalf("request: %s", errOut)
	}
	var nodes []kv.Node
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatal(err)
	}
	first := rec.readyUploads("debian", "cloud1")
	if len(first) != 1 || nodes[0].ImageID != first[0].ExternalID {
		t.Fatalf("node booted from %q; uploads %+v", nodes[0].ImageID, first)
	}

	out, _, code = nodepool(t, cli, "dib-image-list")
	if code != 0 || !strings.Contains(out, "debian-0000000001") || !strings.Contains(out, "ready") {
		t.Errorf("dib-image-list: %d\n%s", code, out)
	}
	out, _, code = nodepool(t, cli, "image-list")
	if code != 0 || !strings.Contains(out, first[0].ExternalID) || !strings.Contains(strings.Split(out, "\n")[1], "| Build ID ") {
		t.Errorf("image-list: %d\n%s", code, out)
	}

	out, errOut, code = nodepool(t, cli, "image-build", "debian")
	if code != 0 || !strings.Contains(out, "build of debian requested") {
		t.Fatalf("image-build: %d %s %s", code, out, errOut)
	}
	rec.until(20*time.Second, "build 2 uploaded", func() bool { return len(rec.readyUploads("debian", "cloud1")) == 2 })
	var second kv.ImageUpload
	for _, u := range rec.readyUploads("debian", "cloud1") {
		if u.BuildID == "0000000002" {
			second = u
		}
	}

	// Roll cloud1 back to build 1.
	_, errOut, code = nodepool(t, cli, "image-delete", "--provider", "cloud1", "--image", "debian", "--build-id", "0000000002", "--upload-id", second.ID)
	if code != 0 {
		t.Fatalf("image-delete: %s", errOut)
	}
	rec.until(10*time.Second, "the upload deleted", func() bool {
		e, _ := rec.uploads.Get(second.Key())
		return e.Value.State == kv.ImageDeleted
	})
	out, errOut, code = nodepool(t, cli, "request", "--json", "debian")
	if code != 0 {
		t.Fatalf("request after the rollback: %s", errOut)
	}
	nodes = nil
	_ = json.Unmarshal([]byte(out), &nodes)
	if len(nodes) != 1 || nodes[0].ImageID != first[0].ExternalID {
		t.Errorf("after the rollback a node booted from %+v, want %s", nodes, first[0].ExternalID)
	}

	_, errOut, code = nodepool(t, cli, "dib-image-delete", "debian-0000000002")
	if code != 0 {
		t.Fatalf("dib-image-delete: %s", errOut)
	}
	rec.until(10*time.Second, "build 2 gone", func() bool {
		_, ok := rec.build("debian", "0000000002")
		return !ok
	})

	if _, errOut, code = nodepool(t, cli, "image-pause", "debian"); code != 0 {
		t.Fatalf("image-pause: %s", errOut)
	}
	out, _, _ = nodepool(t, cli, "image-status", "--json")
	var status []map[string]any
	if err := json.Unmarshal([]byte(out), &status); err != nil || len(status) != 1 || status[0]["paused"] != true || status[0]["build_id"] != "0000000001" {
		t.Errorf("image-status: %v\n%s", err, out)
	}
	if _, errOut, code = nodepool(t, cli, "image-unpause", "debian"); code != 0 {
		t.Fatalf("image-unpause: %s", errOut)
	}

	// An image tagged as ours that no upload accounts for is an alien.
	bucket, err := rec.client.JetStream().KeyValue(t.Context(), fake.ImagesBucketName("cloud1"))
	if err != nil {
		t.Fatal(err)
	}
	leaked := fake.ImageRecord{ID: "img-leaked", Name: "debian-0000000009", Status: fake.ImageActive, Created: time.Now().UTC(),
		Tags: map[string]string{drivers.TagProvider: "cloud1", drivers.TagUpload: "debian.0000000009.cloud1.0000000042"}}
	if _, err := kv.NewStore[fake.ImageRecord](bucket).Create(t.Context(), leaked.ID, &leaked); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = nodepool(t, cli, "alien-image-list")
	if code != 0 || !strings.Contains(out, "img-leaked") || strings.Contains(out, first[0].ExternalID) {
		t.Errorf("alien-image-list: %d %s\n%s", code, errOut, out)
	}

	// Bad arguments are named.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"image-build", "centos"}, `no image "centos"`},
		{[]string{"dib-image-delete", "debian"}, "expected <image>-<build-id>"},
		{[]string{"dib-image-delete", "debian-0000000077"}, "no build debian-0000000077"},
		{[]string{"image-delete", "--image", "debian"}, `required flag(s) "build-id", "provider", "upload-id" not set`},
		{[]string{"image-pause", "centos"}, `no image "centos"`},
		{[]string{"alien-image-list", "nowhere"}, `no provider "nowhere"`},
	} {
		_, errOut, code := nodepool(t, cli, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, %q; want %q", c.args, code, errOut, c.want)
		}
	}
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("nodepool run exited with %v", err)
	}
}
