package builder_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/kv"
)

// A diskimage with delete-after-upload loses each format's file once every
// provider that takes the format has it uploaded, except the keep-formats
// and formats no provider takes; its metadata tag the uploaded images.
func TestDeleteAfterUploadAndMetadata(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `
diskimages:
  - name: debian
    dib-cmd: {{dib}}
    formats: [tar]
    delete-after-upload: true
    keep-formats: [raw]
    metadata: {team: ci, nodepool_image_name: not-this}
    env-vars: {FAKE_DIB_SIZE: "1000"}
labels: [{name: debian}]
providers:
  - name: cloud1
    driver: fake
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
  - name: cloud2
    driver: fake
    image-format: raw
    diskimages: [debian]
    pools: [{name: main, labels: [{name: debian, diskimage: debian}]}]
`)
	h.startBuilder("b1", nil, nil)
	var bl kv.ImageBuild
	h.until(20*time.Second, "the qcow2 file deleted after its upload", func() bool {
		builds := h.buildsIn("debian", kv.ImageReady)
		if len(builds) == 1 {
			bl = builds[0]
		}
		return bl.Files["qcow2"].Deleted
	})
	if bl.Files["raw"].Deleted || bl.Files["tar"].Deleted {
		t.Errorf("kept formats marked deleted: %+v", bl.Files)
	}
	// (The object goes after the record says so, and no record changes
	// then: look now and then.)
	h.eventually(10*time.Second, "the qcow2 object gone", func() bool {
		return !slices.Contains(h.objects(), builder.ObjectName("debian", bl.ID, "qcow2"))
	})
	for _, f := range []string{"raw", "tar"} {
		if !slices.Contains(h.objects(), builder.ObjectName("debian", bl.ID, f)) {
			t.Errorf("the %s object is gone; objects: %v", f, h.objects())
		}
	}
	for _, cloud := range []string{"cloud1", "cloud2"} {
		// cloud2 takes the raw file, whose upload may still run when
		// cloud1's qcow2 upload is done and its file deleted.
		var u []kv.ImageUpload
		h.until(20*time.Second, cloud+"'s upload ready", func() bool {
			u = h.uploadsIn("debian", cloud, kv.ImageReady)
			return len(u) > 0
		})
		if len(u) != 1 {
			t.Fatalf("%s: %d ready uploads\n%s", cloud, len(u), h.dump())
		}
		img, ok := h.cloudImage(cloud, u[0].ExternalID)
		if !ok || img.Tags["team"] != "ci" || img.Tags["nodepool_image_name"] != "debian" {
			t.Errorf("%s image tags = %v", cloud, img.Tags)
		}
	}
	// No upload is attempted again from the deleted file.
	if n := len(h.uploadsIn("debian", "cloud1", "")); n != 1 {
		t.Errorf("cloud1 has %d uploads, want 1\n%s", n, h.dump())
	}
}
