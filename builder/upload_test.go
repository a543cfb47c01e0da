package builder_test

import (
	"context"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

const threeClouds = `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
labels: []
providers:
  - name: good
    driver: fake
    diskimages: [debian]
    pools: [{name: main}]
  - name: flaky
    driver: fake
    diskimages: [debian]
    pools: [{name: main}]
  - name: broken
    driver: fake
    upload-failure-rate: 1
    diskimages: [debian]
    pools: [{name: main}]
`

// A failing upload is recorded failed and tried again with a growing
// backoff; what failed attempts left in the cloud is removed; a provider
// that always fails never holds up the others, even with one upload worker.
func TestUploadRetriesAndIsolation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, threeClouds)
	b := h.startBuilder("b1", nil, func(o *builder.Options) { o.UploadWorkers = 1 })
	b.fake("flaky").FailUploads(2)
	h.until(20*time.Second, "uploads to good and flaky", func() bool {
		return len(h.uploadsIn("debian", "good", kv.ImageReady)) == 1 && len(h.uploadsIn("debian", "flaky", kv.ImageReady)) == 1
	})
	if u := h.uploadsIn("debian", "flaky", kv.ImageReady)[0]; u.Attempt != 3 {
		t.Errorf("flaky upload ready after %d attempts, want 3", u.Attempt)
	}
	h.until(20*time.Second, "broken tried three times", func() bool {
		us := h.uploadsIn("debian", "broken", "")
		return len(us) == 1 && us[0].State == kv.ImageFailed && us[0].Attempt >= 3
	})
	broken := h.uploadsIn("debian", "broken", "")[0]
	if broken.Reason == "" || broken.Interrupted {
		t.Errorf("broken upload: %+v", broken)
	}
	// The clouds hold only the good uploads: killed images of failed
	// attempts are removed (by the next attempt, or as leaks).
	h.until(10*time.Second, "killed images of flaky removed", func() bool { return h.clouds["flaky"].Len() == 1 })
	if h.clouds["good"].Len() != 1 {
		t.Errorf("good holds %d images", h.clouds["good"].Len())
	}
	h.until(10*time.Second, "broken holds at most the killed image of its current attempt", func() bool { return h.clouds["broken"].Len() <= 1 })
}

// A build made by one builder process is uploaded by another: the image
// file travels through the object store, not the builder's disk.
func TestUploadByAnotherProcess(t *testing.T) {
	t.Parallel()
	h := newHarness(t, twoClouds)
	h.startBuilder("builds-only", nil, func(o *builder.Options) { o.UploadWorkers = 0 })
	h.startBuilder("uploads-only", nil, func(o *builder.Options) { o.BuildWorkers = 0 })
	h.until(20*time.Second, "uploads to both clouds", func() bool {
		return len(h.uploadsIn("debian", "cloud1", kv.ImageReady)) == 1 && len(h.uploadsIn("debian", "cloud2", kv.ImageReady)) == 1
	})
	bl := h.buildsIn("debian", kv.ImageReady)[0]
	if bl.Builder != "builds-only" {
		t.Errorf("built by %s", bl.Builder)
	}
	for _, cloud := range []string{"cloud1", "cloud2"} {
		u := h.uploadsIn("debian", cloud, kv.ImageReady)[0]
		img, _ := h.cloudImage(cloud, u.ExternalID)
		if u.Uploader != "uploads-only" || img.SHA256 != bl.Files[u.Format].SHA256 {
			t.Errorf("%s: uploaded by %s, image sha256 %s, build's %s", cloud, u.Uploader, img.SHA256, bl.Files[u.Format].SHA256)
		}
	}
}

// Retention keeps the two newest ready builds and uploads; image-delete of
// the newest upload rolls launches back to the previous one (it is not
// uploaded again); dib-image-delete of the newest build does the same for
// every provider.
func TestRetentionAndRollback(t *testing.T) {
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
    diskimages: [debian]
    pools: [{name: main}]
`)
	h.startBuilder("b1", nil, nil)
	newest := func(provider string) kv.ImageUpload {
		var us []kv.ImageUpload
		h.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool { us = append(us, e.Value); return true })
		u, _ := kv.NewestReadyUpload(us, "debian", provider)
		return u
	}
	for i := 1; i <= 3; i++ {
		id := kv.ImageSeqID(uint64(i))
		h.until(20*time.Second, "build "+id+" uploaded everywhere", func() bool {
			return newest("cloud1").BuildID == id && newest("cloud2").BuildID == id
		})
		if i < 3 {
			h.trigger("debian")
		}
	}
	h.until(20*time.Second, "build 1 and its uploads deleted", func() bool {
		_, there := h.builds.Get(kv.BuildKey("debian", kv.ImageSeqID(1)))
		return !there && len(h.uploadsIn("debian", "cloud1", "")) == 2 && len(h.uploadsIn("debian", "cloud2", "")) == 2 &&
			h.clouds["cloud1"].Len() == 2 && h.clouds["cloud2"].Len() == 2
	})
	for _, name := range h.objects() {
		if name == builder.ObjectName("debian", kv.ImageSeqID(1), "qcow2") {
			t.Errorf("build 1's file %s is still stored", name)
		}
	}

	// image-delete the newest upload to cloud1: cloud1 falls back to build 2.
	bad := newest("cloud1")
	if err := h.client.DeleteUpload(t.Context(), "debian", bad.BuildID, "cloud1", bad.ID); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "the upload deleted", func() bool {
		e, ok := h.uploads.Get(bad.Key())
		_, inCloud := h.cloudImage("cloud1", bad.ExternalID)
		return ok && e.Value.State == kv.ImageDeleted && !inCloud
	})
	if u := newest("cloud1"); u.BuildID != kv.ImageSeqID(2) {
		t.Errorf("newest upload to cloud1 is of build %s, want 2", u.BuildID)
	}
	// Asked to, the upload workers do not upload build 3 there again.
	if err := events.PublishUpload(t.Context(), h.js, "debian", "cloud1", events.UploadMessage{}, ""); err != nil {
		t.Fatal(err)
	}
	h.eventually(10*time.Second, "the upload trigger answered", func() bool { return h.drained(builder.UploadConsumer) })
	if u := newest("cloud1"); u.BuildID != kv.ImageSeqID(2) {
		t.Errorf("build 3 was uploaded to cloud1 again")
	}
	if u := newest("cloud2"); u.BuildID != kv.ImageSeqID(3) {
		t.Errorf("cloud2 lost build 3")
	}

	// dib-image-delete build 3: every provider falls back to build 2, and
	// the image is not rebuilt (build 2 is fresh).
	if err := h.client.DeleteBuild(t.Context(), "debian", kv.ImageSeqID(3)); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "build 3 gone", func() bool {
		_, there := h.builds.Get(kv.BuildKey("debian", kv.ImageSeqID(3)))
		return !there && newest("cloud2").BuildID == kv.ImageSeqID(2) && len(h.uploadsIn("debian", "cloud1", "")) == 1 &&
			h.clouds["cloud2"].Len() == 1
	})
	h.eventually(10*time.Second, "triggers answered", func() bool {
		return h.drained(builder.BuildConsumer) && h.drained(builder.UploadConsumer)
	})
	if n := len(h.buildsIn("debian", "")); n != 1 {
		t.Errorf("%d builds after the rollback, want build 2 alone\n%s", n, h.dump())
	}
}

// Uploads to a provider that no longer lists the image are deleted from it.
func TestUploadsToUnlistingProviderDeleted(t *testing.T) {
	t.Parallel()
	const listed = `
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
    diskimages: [debian]
    pools: [{name: main}]
`
	h := newHarness(t, listed)
	b := h.startBuilder("b1", nil, nil)
	h.until(20*time.Second, "uploads to both clouds", func() bool {
		return len(h.uploadsIn("debian", "cloud1", kv.ImageReady)) == 1 && len(h.uploadsIn("debian", "cloud2", kv.ImageReady)) == 1
	})
	b.Stop()
	unlisted := h.parse(`
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
    pools: [{name: main}]
`)
	h.startBuilder("b1", unlisted, nil)
	h.until(20*time.Second, "the upload to cloud2 deleted", func() bool {
		return len(h.uploadsIn("debian", "cloud2", "")) == 0 && h.clouds["cloud2"].Len() == 0
	})
	if len(h.uploadsIn("debian", "cloud1", kv.ImageReady)) != 1 || h.clouds["cloud1"].Len() != 1 {
		t.Errorf("cloud1 lost its upload\n%s", h.dump())
	}
}

// Images tagged as ours that no upload accounts for are listed as aliens
// and deleted on their second sighting; other images are left alone.
func TestLeakedImagesAreDeleted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    pause: true
labels: []
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main}]
`)
	b := h.startBuilder("b1", nil, func(o *builder.Options) { o.BuildWorkers, o.UploadWorkers = 0, 0 })
	drv := b.fake("cloud1")
	leaked, err := drv.InjectImage(t.Context(), "debian-0000000007", map[string]string{
		drivers.TagProvider: "cloud1", drivers.TagUpload: kv.UploadKey("debian", kv.ImageSeqID(7), "cloud1", kv.ImageSeqID(9)),
	})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := drv.InjectImage(t.Context(), "someone-elses", map[string]string{"owner": "them"})
	if err != nil {
		t.Fatal(err)
	}
	aliens, err := builder.AlienImages(t.Context(), "cloud1", drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(aliens) != 1 || aliens[0].ExternalID != leaked {
		t.Errorf("aliens = %+v, want only %s", aliens, leaked)
	}
	h.until(10*time.Second, "the leaked image deleted", func() bool {
		_, there := h.cloudImage("cloud1", leaked)
		return !there
	})
	if _, there := h.cloudImage("cloud1", foreign); !there {
		t.Error("an image that is not ours was deleted")
	}
	h.eventually(5*time.Second, "the deletion counted", func() bool {
		return b.Metrics().Registry().Sum("nodepool_leaked_resources_deleted_total", "kind=images") == 1
	})
}

// Chunks of an image file that a killed builder left half stored (no
// object names them, and they stop growing) are purged.
func TestHalfStoredFilesArePurged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages: []
labels: []
providers: []
`)
	h.startBuilder("b1", nil, nil)
	obs, err := builder.EnsureFiles(t.Context(), h.js, 1, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	// A real object, and chunks of one whose storing never finished.
	if _, err := obs.PutBytes(t.Context(), "debian/0000000001.qcow2", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	orphan := "$O." + builder.FilesBucket + ".C.ORPHANNUID"
	for range 3 {
		if _, err := h.js.Publish(t.Context(), orphan, []byte("chunk")); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := h.js.Stream(t.Context(), "OBJ_"+builder.FilesBucket)
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() map[string]uint64 {
		info, err := stream.Info(context.WithoutCancel(t.Context()), jetstreamSubjects("$O."+builder.FilesBucket+".C.>"))
		if err != nil {
			return nil
		}
		return info.State.Subjects
	}
	h.eventually(15*time.Second, "the orphaned chunks purged", func() bool {
		_, there := subjects()[orphan]
		return !there
	})
	if data, err := obs.GetBytes(t.Context(), "debian/0000000001.qcow2"); err != nil || string(data) != "kept" {
		t.Errorf("the stored object was damaged: %q, %v", data, err)
	}
	if n := len(subjects()); n != 1 {
		t.Errorf("%d chunk subjects left, want the stored object's", n)
	}
}
