package fake_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
)

const imageCloud = `
diskimages: [{name: debian}]
labels: [{name: debian}]
providers:
  - name: p
    driver: fake
    upload-failure-rate: %s
    diskimages: [debian]
    pools:
      - name: main
        labels: [{name: debian, diskimage: debian}]
`

func upload(t *testing.T, p *fake.Provider, data []byte, key string) (drivers.Image, error) {
	t.Helper()
	sum := sha256.Sum256(data)
	return p.UploadImage(t.Context(), drivers.ImageUpload{
		Name: "debian-0000000001", Format: p.ImageFormat(), Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]),
		Tags: map[string]string{drivers.TagProvider: "p", drivers.TagUpload: key}, Data: bytes.NewReader(data),
	})
}

func TestImageUploadListDeleteAndBoot(t *testing.T) {
	t.Parallel()
	p := provider(t, strings.Replace(imageCloud, "%s", "0", 1))
	if p.ImageFormat() != "qcow2" {
		t.Errorf("default image format = %q", p.ImageFormat())
	}
	data := bytes.Repeat([]byte("image"), 10000)
	img, err := upload(t, p, data, "k1")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if img.Size != int64(len(data)) || img.SHA256 != hex.EncodeToString(sum[:]) || img.Tags[drivers.TagUpload] != "k1" {
		t.Errorf("uploaded image = %+v", img)
	}
	// The cloud refuses data that does not match what was announced.
	if _, err := p.UploadImage(t.Context(), drivers.ImageUpload{Name: "x", Size: 10, Data: bytes.NewReader([]byte("short"))}); err == nil {
		t.Error("an upload shorter than announced succeeded")
	}
	imgs, err := p.ListImages(t.Context())
	if err != nil || len(imgs) != 2 {
		t.Fatalf("list: %d images, %v (want the good one and the refused one)", len(imgs), err)
	}

	// A node boots from the image and records it.
	r := req("n1", 1, "debian")
	r.ImageID = img.ExternalID
	inst, err := run(t, must(p.Create(r, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if inst.ImageID != img.ExternalID {
		t.Errorf("instance image = %q, want %q", inst.ImageID, img.ExternalID)
	}
	// Booting from an image that is not there fails as a cloud would.
	r = req("n2", 1, "debian")
	r.ImageID = "img-missing"
	if _, err := run(t, must(p.Create(r, nil))); !errors.Is(err, drivers.ErrNotFound) {
		t.Errorf("boot from a missing image: %v, want ErrNotFound", err)
	}

	if err := p.DeleteImage(t.Context(), img.ExternalID); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteImage(t.Context(), img.ExternalID); err != nil {
		t.Errorf("deleting a deleted image: %v", err)
	}
	if _, err := p.Image(t.Context(), img.ExternalID); err == nil {
		t.Error("the deleted image is still there")
	}
}

func TestImageUploadFailures(t *testing.T) {
	t.Parallel()
	p := provider(t, strings.Replace(imageCloud, "%s", "1", 1))
	if _, err := upload(t, p, []byte("data"), "k1"); err == nil {
		t.Fatal("an upload with upload-failure-rate 1 succeeded")
	}
	imgs, _ := p.ListImages(t.Context())
	if len(imgs) != 1 {
		t.Fatalf("%d images after a failed upload, want the killed one", len(imgs))
	}
	if rec, _ := p.Image(t.Context(), imgs[0].ExternalID); rec.Status != fake.ImageKilled {
		t.Errorf("failed upload left an image in status %q, want %q", rec.Status, fake.ImageKilled)
	}
	// A killed image cannot be booted.
	r := req("n1", 1, "debian")
	r.ImageID = imgs[0].ExternalID
	if _, err := run(t, must(p.Create(r, nil))); err == nil {
		t.Error("booted from a killed image")
	}

	ok := provider(t, strings.Replace(imageCloud, "%s", "0", 1))
	ok.FailUploads(2)
	for i := range 3 {
		_, err := upload(t, ok, []byte("data"), "k")
		if (err != nil) != (i < 2) {
			t.Errorf("upload %d: %v (the first two must fail)", i+1, err)
		}
	}
}
