package fake

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// Image statuses, as Glance reports them.
const (
	ImageSaving = "saving"
	ImageActive = "active"
	ImageKilled = "killed" // an upload that failed; the image stays until deleted
)

// ImagesBucketName is the bucket holding a fake cloud's images.
func ImagesBucketName(cloud string) string {
	return "fakeimages-" + strings.ReplaceAll(cloud, ".", "_")
}

// ImageRecord is one image of the fake cloud, as stored. The cloud keeps
// what it was given (size and digest of the data), not the data.
type ImageRecord struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"`
	Format  string            `json:"format"`
	Size    int64             `json:"size"`
	SHA256  string            `json:"sha256"`
	Tags    map[string]string `json:"tags"`
	Status  string            `json:"status"`
	Created time.Time         `json:"created"`
}

func (p *Provider) openImages(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, missing func(stream string)) error {
	bucket, err := kv.EnsureBucket(ctx, js, cfg, p.log)
	if err != nil {
		return fmt.Errorf("provider %s: opening the images of fake cloud %s: %w", p.cfg.Name, p.cfg.Cloud, err)
	}
	p.images = kv.NewStore[ImageRecord](bucket).Reporting(missing)
	return nil
}

// ImageFormat is the format the fake cloud takes (its image-format key).
func (p *Provider) ImageFormat() string { return p.cfg.ImageFormat }

// FailUploads makes the next n uploads fail (after storing a killed
// image, as a real cloud may), whatever upload-failure-rate says.
func (p *Provider) FailUploads(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failUploads = n
}

func (p *Provider) uploadFails() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failUploads > 0 {
		p.failUploads--
		return true
	}
	return p.rng.Float64() < p.cfg.UploadFailureRate
}

// UploadImage reads the image to the end, takes upload-delay, and stores
// the image (active, or killed when the upload fails).
func (p *Provider) UploadImage(ctx context.Context, req drivers.ImageUpload) (drivers.Image, error) {
	if err := p.apiCall(ctx); err != nil {
		return drivers.Image{}, err
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	now := time.Now().UTC()
	rec := ImageRecord{ID: "img-" + hex.EncodeToString(idb[:]), Name: req.Name, Format: req.Format, Tags: req.Tags,
		Status: ImageSaving, Created: now}
	rev, err := p.images.Create(ctx, rec.ID, &rec)
	if err != nil {
		return drivers.Image{}, fmt.Errorf("fake: creating image: %w", err)
	}
	err = p.receive(ctx, req, &rec)
	rec.Status = ImageActive
	if err != nil {
		rec.Status = ImageKilled
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, uerr := p.images.Update(wctx, rec.ID, &rec, rev); uerr != nil && err == nil {
		err = fmt.Errorf("fake: storing image: %w", uerr)
	}
	if err != nil {
		return drivers.Image{}, err
	}
	return toImage(&rec), nil
}

// receive reads an upload's data to the end into rec (its size and
// checksum) and takes upload-delay; it says why the upload fails: the data
// could not be read, or has the wrong size or checksum, ctx ended, or the
// cloud killed the image (FailUploads, upload-failure-rate).
func (p *Provider) receive(ctx context.Context, req drivers.ImageUpload, rec *ImageRecord) error {
	h := sha256.New()
	n, err := io.Copy(h, req.Data)
	rec.Size, rec.SHA256 = n, hex.EncodeToString(h.Sum(nil))
	if err != nil {
		return err
	}
	if req.Size > 0 && n != req.Size {
		return fmt.Errorf("fake: image %s: got %d bytes, expected %d", req.Name, n, req.Size)
	}
	t := time.NewTimer(p.cfg.UploadDelay.D())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	if req.SHA256 != "" && rec.SHA256 != req.SHA256 {
		return fmt.Errorf("fake: image %s: checksum %s, expected %s", req.Name, rec.SHA256, req.SHA256)
	}
	if p.uploadFails() {
		return fmt.Errorf("fake: cloud %s: image %s went to %s during the upload", p.cfg.Cloud, rec.ID, ImageKilled)
	}
	return nil
}

func toImage(r *ImageRecord) drivers.Image {
	return drivers.Image{ExternalID: r.ID, Name: r.Name, Format: r.Format, Size: r.Size, SHA256: r.SHA256, Tags: r.Tags, Created: r.Created}
}

// DeleteImage deletes an image; an image that is gone is not an error.
func (p *Provider) DeleteImage(ctx context.Context, externalID string) error {
	if err := p.apiCall(ctx); err != nil {
		return err
	}
	// An image whose upload is still writing its last state changes under
	// the delete: read it again (a cloud deletes an image in any state).
	for n := 0; ; n++ {
		e, err := p.images.Get(ctx, externalID)
		if errors.Is(err, kv.ErrNotFound) {
			return nil
		}
		if err != nil && !errors.Is(err, kv.ErrBadRecord) {
			return err
		}
		err = p.images.Delete(ctx, externalID, e.Revision)
		switch {
		case err == nil, errors.Is(err, kv.ErrNotFound):
			return nil
		case errors.Is(err, kv.ErrConflict) && n+1 < wait.MaxConflicts:
			if !wait.Sleep(ctx, wait.Conflict(n+1)) {
				return ctx.Err()
			}
		default:
			return fmt.Errorf("fake: deleting image %s: %w", externalID, err)
		}
	}
}

// ListImages lists every image of the cloud, ours and others.
func (p *Provider) ListImages(ctx context.Context) ([]drivers.Image, error) {
	if err := p.apiCall(ctx); err != nil {
		return nil, err
	}
	entries, err := p.images.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("fake: listing images: %w", err)
	}
	out := make([]drivers.Image, 0, len(entries))
	for _, e := range entries {
		out = append(out, toImage(&e.Value))
	}
	return out, nil
}

// Image returns an image of the cloud, as a test or a demo would look it up.
func (p *Provider) Image(ctx context.Context, id string) (ImageRecord, error) {
	e, err := p.images.Get(ctx, id)
	return e.Value, err
}

// InjectImage adds an image that nodepool did not upload (another
// tenant's, or a leaked one when tagged as ours).
func (p *Provider) InjectImage(ctx context.Context, name string, tags map[string]string) (string, error) {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	rec := ImageRecord{ID: "img-" + hex.EncodeToString(idb[:]), Name: name, Format: p.cfg.ImageFormat, Tags: tags,
		Status: ImageActive, Created: time.Now().UTC()}
	if _, err := p.images.Create(ctx, rec.ID, &rec); err != nil {
		return "", err
	}
	return rec.ID, nil
}

// bootImage checks that an image exists and can be booted.
func (p *Provider) bootImage(ctx context.Context, id string) error {
	e, err := p.images.Get(ctx, id)
	if errors.Is(err, kv.ErrNotFound) {
		return fmt.Errorf("%w: image %s does not exist in cloud %s", drivers.ErrNotFound, id, p.cfg.Cloud)
	}
	if err != nil {
		return err
	}
	if e.Value.Status != ImageActive {
		return fmt.Errorf("image %s is %s, not %s", id, e.Value.Status, ImageActive)
	}
	return nil
}

var _ drivers.ImageProvider = (*Provider)(nil)
