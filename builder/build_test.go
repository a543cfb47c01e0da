package builder_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/kv"
)

const twoClouds = `
diskimages:
  - name: base
    abstract: true
    dib-cmd: {{dib}}
    elements: [vm]
    env-vars:
      FAKE_DIB_SIZE: "300000"
      FAKE_DIB_COUNT: {{dir}}/count
  - name: debian
    parent: base
    elements: [debian-minimal]
    release: bookworm
    formats: [tar]
    username: debian
labels: [{name: debian}]
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
  - name: cloud2
    driver: fake
    image-format: raw
    upload-delay: 0.1
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
`

// With no build of an image, the scheduler triggers one; the build runs the
// image's command with its elements and environment, keeps its log, stores
// every format a provider takes (and those the image names) in the object
// store, and each provider gets the file of its format.
func TestBuildAndUploadEndToEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t, twoClouds)
	b := h.startBuilder("b1", nil, nil)
	h.until(20*time.Second, "uploads to both clouds", func() bool {
		return len(h.uploadsIn("debian", "cloud1", kv.ImageReady)) == 1 && len(h.uploadsIn("debian", "cloud2", kv.ImageReady)) == 1
	})
	builds := h.buildsIn("debian", "")
	if len(builds) != 1 {
		t.Fatalf("%d builds, want 1\n%s", len(builds), h.dump())
	}
	bl := builds[0]
	if bl.State != kv.ImageReady || bl.ID != "0000000001" || bl.Builder != "b1" || bl.Username != "debian" || bl.PythonPath != "auto" {
		t.Errorf("build = %+v", bl)
	}
	if want := []string{"qcow2", "raw", "tar"}; !slices.Equal(bl.Formats, want) {
		t.Errorf("formats = %v, want %v (the providers' and the image's own)", bl.Formats, want)
	}
	for _, f := range bl.Formats {
		file := bl.Files[f]
		sum, size := h.objectSHA256(file.Object)
		if file.Size != 300000 || size != 300000 || sum != file.SHA256 || file.Object != builder.ObjectName("debian", bl.ID, f) {
			t.Errorf("%s file %+v: object has %d bytes, sha256 %s", f, file, size, sum)
		}
	}
	if bl.Size != 900000 {
		t.Errorf("build size = %d", bl.Size)
	}
	for cloud, format := range map[string]string{"cloud1": "qcow2", "cloud2": "raw"} {
		u := h.uploadsIn("debian", cloud, kv.ImageReady)[0]
		img, ok := h.cloudImage(cloud, u.ExternalID)
		if !ok {
			t.Fatalf("upload %s names image %s, which %s does not have", u.Key(), u.ExternalID, cloud)
		}
		if u.Format != format || img.Format != format || img.SHA256 != bl.Files[format].SHA256 || img.Size != 300000 ||
			img.Tags["nodepool_upload_id"] != u.Key() || u.ExternalName != img.Name || u.Username != "debian" {
			t.Errorf("%s: upload %+v, image %+v", cloud, u, img)
		}
	}
	log, err := os.ReadFile(bl.Log)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(bl.Log) != b.opts.BuildLogDir || filepath.Base(bl.Log) != "debian-0000000001.log" {
		t.Errorf("log path = %s", bl.Log)
	}
	for _, want := range []string{"fake-dib: elements: vm debian-minimal", "fake-dib: formats: qcow2,raw,tar", "release: bookworm",
		"-x -t qcow2,raw,tar --no-tmpfs -o ", "DIB_RELEASE=bookworm", "fake-dib: done"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("build log lacks %q:\n%s", want, log)
		}
	}
	if n := lines(t, filepath.Join(h.dir, "count")); n != 1 {
		t.Errorf("the build command ran %d times", n)
	}
	// The build's local files are gone; the object store has them.
	if entries, _ := os.ReadDir(b.opts.ImagesDir); len(entries) != 0 {
		t.Errorf("images dir still holds %d entries", len(entries))
	}
	comps, err := h.client.Components(t.Context())
	if err != nil || len(comps) != 1 || !slices.Equal(comps[0].Value.Roles, []string{"builder"}) {
		t.Errorf("components = %+v, %v", comps, err)
	}
}

// Triggers for an image that is building start no second build, whether
// they reach the same builder or another; a trigger published after a
// build finished starts a new one.
func TestDuplicateTriggersStartOneBuild(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    formats: [raw]
    env-vars: {FAKE_DIB_GATE: "{{dir}}/gate", FAKE_DIB_COUNT: "{{dir}}/count"}
labels: []
providers: []
`)
	g := newGate(t, h.dir)
	two := func(o *builder.Options) { o.BuildWorkers = 2 }
	h.startBuilder("b1", nil, two)
	h.startBuilder("b2", nil, two)
	// The scheduler triggers the first build: no build exists.
	h.until(10*time.Second, "a build running", func() bool { return len(h.buildsIn("debian", kv.ImageBuilding)) == 1 })
	for range 5 {
		h.trigger("debian")
	}
	h.eventually(10*time.Second, "duplicate triggers answered", func() bool {
		c, err := h.js.Consumer(t.Context(), "NODEPOOL_BUILDS", builder.BuildConsumer)
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 1
	})
	g.open(t)
	h.until(10*time.Second, "the build ready", func() bool { return len(h.buildsIn("debian", kv.ImageReady)) == 1 })
	h.eventually(10*time.Second, "every trigger answered", func() bool { return h.drained(builder.BuildConsumer) })
	if n := lines(t, filepath.Join(h.dir, "count")); n != 1 || len(h.buildsIn("debian", "")) != 1 {
		t.Fatalf("%d build runs, %d builds for 6 triggers of one build\n%s", n, len(h.buildsIn("debian", "")), h.dump())
	}
	// A trigger after the build starts another.
	h.trigger("debian")
	g.open(t)
	h.until(10*time.Second, "a second build ready", func() bool { return len(h.buildsIn("debian", kv.ImageReady)) == 2 })
	if n := lines(t, filepath.Join(h.dir, "count")); n != 2 {
		t.Errorf("%d build runs, want 2", n)
	}
}

// The scheduler rebuilds an image whose newest build is older than
// rebuild-age, and one whose newest build lacks a format a provider takes;
// retention keeps the two newest ready builds and deletes the others with
// their files.
func TestScheduledRebuildsAndBuildRetention(t *testing.T) {
	t.Parallel()
	t.Run("rebuild-age", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    rebuild-age: 1s
labels: []
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main}]
`)
		h.startBuilder("b1", nil, nil)
		h.until(30*time.Second, "a fourth build ready and the first two deleted", func() bool {
			ready := h.buildsIn("debian", kv.ImageReady)
			all := h.buildsIn("debian", "")
			return len(ready) >= 2 && ready[len(ready)-1].ID >= "0000000004" && all[0].ID >= "0000000003"
		})
		for _, bl := range h.buildsIn("debian", "") {
			if bl.ID < "0000000003" {
				t.Errorf("build %s is still there (%s)", bl.ID, bl.State)
			}
		}
		h.eventually(10*time.Second, "the deleted builds' files gone", func() bool { // no record says when
			for _, name := range h.objects() {
				if strings.HasPrefix(name, "debian/0000000001.") || strings.HasPrefix(name, "debian/0000000002.") {
					return false
				}
			}
			return true
		})
	})
	t.Run("missing format", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
labels: []
providers:
  - name: cloud1
    driver: fake
    image-format: vhd
    diskimages: [debian]
    pools: [{name: main}]
`)
		// A fresh build from before, without the vhd file cloud1 takes.
		now := time.Now().UTC()
		old := kv.ImageBuild{Image: "debian", ID: kv.ImageSeqID(1), State: kv.ImageReady, StateTime: now, Created: now,
			Formats: []string{"qcow2"}, Files: map[string]kv.ImageFile{"qcow2": {Object: "debian/0000000001.qcow2", Size: 1}}}
		if _, err := h.img.Images.Create(t.Context(), "debian", &kv.DiskImage{Name: "debian", BuildSeq: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.img.Builds.Create(t.Context(), old.Key(), &old); err != nil {
			t.Fatal(err)
		}
		h.startBuilder("b1", nil, nil)
		h.until(10*time.Second, "a build with vhd uploaded", func() bool {
			ready := h.uploadsIn("debian", "cloud1", kv.ImageReady)
			return len(ready) == 1 && ready[0].BuildID == "0000000002" && ready[0].Format == "vhd"
		})
	})
}

// A build that fails is recorded failed with the reason and its log, and
// tried again after a growing backoff; a build that runs past build-timeout
// is killed with every process it started; build-log-retention bounds the
// logs kept.
func TestBuildFailureTimeoutAndLogs(t *testing.T) {
	t.Parallel()
	// Leases of 6 s: the slow build must end by its build-timeout, not
	// by a lease whose 500 ms renewals a loaded machine held back for
	// 1.3 s (seen once at a load average of 15).
	h := newHarnessTTL(t, `
build-log-retention: 1
diskimages:
  - name: broken
    dib-cmd: {{dib}}
    formats: [qcow2]
    env-vars: {FAKE_DIB_FAIL: "1"}
  - name: slow
    dib-cmd: {{dib}}
    formats: [qcow2]
    build-timeout: 1s
    env-vars: {FAKE_DIB_HANG: "1", FAKE_DIB_PIDFILE: "{{dir}}/pids"}
labels: []
providers: []
`, 6*time.Second)
	b := h.startBuilder("b1", nil, func(o *builder.Options) { o.BuildWorkers = 2 })
	h.until(20*time.Second, "three failed builds of broken", func() bool { return len(h.buildsIn("broken", kv.ImageFailed)) >= 3 })
	failed := h.buildsIn("broken", kv.ImageFailed)
	for _, bl := range failed {
		if !strings.Contains(bl.Reason, "exit status 3") || !strings.Contains(bl.Reason, "fake-dib: failing as told") || bl.Interrupted {
			t.Errorf("build %s: reason %q", bl.ID, bl.Reason)
		}
	}
	// Waits between attempts grow: 200ms, then 400ms.
	if gap := failed[2].Created.Sub(failed[1].StateTime); gap < 400*time.Millisecond {
		t.Errorf("third attempt %s after the second failed; want at least 400ms", gap)
	}
	if gap := failed[1].Created.Sub(failed[0].StateTime); gap < 200*time.Millisecond {
		t.Errorf("second attempt %s after the first failed; want at least 200ms", gap)
	}
	// One old log and the newest are kept.
	h.until(10*time.Second, "logs pruned", func() bool {
		entries, _ := os.ReadDir(b.opts.BuildLogDir)
		n := 0
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "broken-") {
				n++
			}
		}
		return n <= 2
	})
	last := h.buildsIn("broken", "")
	if data, err := os.ReadFile(last[len(last)-1].Log); err != nil || !strings.Contains(string(data), "failing as told") {
		t.Errorf("the newest log: %v\n%s", err, data)
	}

	h.until(20*time.Second, "the slow build timed out", func() bool { return len(h.buildsIn("slow", kv.ImageFailed)) >= 1 })
	slow := h.buildsIn("slow", kv.ImageFailed)[0]
	if !strings.Contains(slow.Reason, "build-timeout exceeded") || slow.Interrupted {
		t.Errorf("slow build: %q", slow.Reason)
	}
	if slow.StateTime.Sub(slow.Created) > 10*time.Second {
		t.Errorf("the slow build took %s to be stopped after a 1s timeout", slow.StateTime.Sub(slow.Created))
	}
	for _, pid := range pids(t, filepath.Join(h.dir, "pids")) {
		if alive(pid) {
			t.Errorf("process %d of the timed-out build is still running", pid)
		}
	}
}

// Bad triggers (unknown image, bad body, malformed subject, a provider that
// does not list the image) are dropped with a log line; the workers go on.
func TestBadTriggersAreDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    pause: true
    formats: [raw]
  - name: other
    dib-cmd: {{dib}}
labels: []
providers:
  - name: cloud1
    driver: fake
    diskimages: [other]
    pools: [{name: main}]
`)
	b := h.startBuilder("b1", nil, nil)
	for subject, body := range map[string]string{
		"nodepool.builds.nope":            "",
		"nodepool.builds.other":           `{"reason": "whim"}`,
		"nodepool.builds.debian":          "",  // paused
		"nodepool.builds.a.b":             "",  // not a build subject
		"nodepool.uploads.other":          "",  // no provider
		"nodepool.uploads.debian.cloud1":  "",  // cloud1 does not list debian
		"nodepool.uploads.other.nowhere":  "",  // no such provider
		"nodepool.uploads.other.cloud1":   "[", // bad body
		"nodepool.builds.other.x.y.z.w.v": "",
	} {
		if _, err := h.js.Publish(t.Context(), subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually(10*time.Second, "every trigger answered", func() bool {
		return h.drained(builder.BuildConsumer) && h.drained(builder.UploadConsumer)
	})
	if len(h.buildsIn("debian", "")) != 0 {
		t.Error("a paused image was built")
	}
	if n := int64(b.Metrics().Registry().Sum("nodepool_image_triggers_dropped_total")); n < 8 {
		t.Errorf("%d triggers dropped, want at least 8", n)
	}
	// The workers still build: other is built (by the scheduler) and uploaded.
	h.until(10*time.Second, "other uploaded", func() bool { return len(h.uploadsIn("other", "cloud1", kv.ImageReady)) == 1 })
}

// image-pause stops builds of an image (scheduled and manual) until
// image-unpause; a provider's pause stops uploads to it only.
func TestPause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
labels: []
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main}]
  - name: cloud2
    driver: fake
    diskimages: [{name: debian, pause: true}]
    pools: [{name: main}]
`)
	if err := h.client.PauseImage(t.Context(), "debian", true, "test"); err != nil {
		t.Fatal(err)
	}
	b := h.startBuilder("b1", nil, nil)
	h.trigger("debian")
	h.eventually(10*time.Second, "the manual trigger answered", func() bool {
		return h.drained(builder.BuildConsumer) && int64(b.Metrics().Registry().Sum("nodepool_image_triggers_dropped_total")) >= 1
	})
	if n := len(h.buildsIn("debian", "")); n != 0 {
		t.Fatalf("%d builds of a paused image", n)
	}
	if err := h.client.PauseImage(t.Context(), "debian", false, "test"); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "built and uploaded to cloud1", func() bool { return len(h.uploadsIn("debian", "cloud1", kv.ImageReady)) == 1 })
	h.eventually(10*time.Second, "upload triggers answered", func() bool { return h.drained(builder.UploadConsumer) })
	if n := len(h.uploadsIn("debian", "cloud2", "")); n != 0 {
		t.Errorf("%d uploads to cloud2, whose upload of debian is paused", n)
	}
}

// A builder stopped in the middle of a build kills it, records it as
// interrupted and hands the trigger back: another builder builds at once.
func TestStoppedBuilderHandsOver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    formats: [raw]
    env-vars: {FAKE_DIB_HANG_ONCE: "{{dir}}/hung", FAKE_DIB_PIDFILE: "{{dir}}/pids"}
labels: []
providers: []
`)
	b1 := h.startBuilder("b1", nil, nil)
	h.eventually(10*time.Second, "b1 building", func() bool {
		return len(h.buildsIn("debian", kv.ImageBuilding)) == 1 && lines(t, filepath.Join(h.dir, "pids")) == 1
	})
	h.startBuilder("b2", nil, nil)
	b1.Stop()
	h.eventually(15*time.Second, "b1's build failed and b2's ready", func() bool {
		_, failed := h.seen("debian", kv.ImageSeqID(1), kv.ImageFailed)
		_, ready := h.seen("debian", kv.ImageSeqID(2), kv.ImageReady)
		// (and the cache read below has it too)
		return failed && ready && len(h.buildsIn("debian", kv.ImageReady)) == 1
	})
	first, _ := h.seen("debian", kv.ImageSeqID(1), kv.ImageFailed)
	second, _ := h.seen("debian", kv.ImageSeqID(2), kv.ImageReady)
	if !first.Interrupted || first.Builder != "b1" || second.Builder != "b2" || len(h.buildsIn("debian", kv.ImageReady)) != 1 {
		t.Errorf("first build %+v, second by %q\n%s", first, second.Builder, h.dump())
	}
	for _, pid := range pids(t, filepath.Join(h.dir, "pids")) {
		if alive(pid) {
			t.Errorf("process %d of the stopped build is still running", pid)
		}
	}
}
