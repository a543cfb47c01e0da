package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// ErrImageBusy: the build or upload is in progress and cannot be deleted
// now.
var ErrImageBusy = errors.New("in progress")

// Images are the typed stores of the nodepool-images bucket.
func (c *Client) Images() *kv.ImageStores { return kv.NewImageStores(c.b.Images) }

// RequestBuild publishes a build trigger for an image (`nodepool
// image-build`). A build running when it arrives answers it.
func (c *Client) RequestBuild(ctx context.Context, image, requestedBy string) error {
	return events.PublishBuild(ctx, c.js, image, events.BuildMessage{Reason: events.ReasonManual, RequestedBy: requestedBy}, "")
}

// PauseImage pauses (or resumes) the builds of an image.
func (c *Client) PauseImage(ctx context.Context, image string, paused bool, by string) error {
	if !events.ValidImageName(image) {
		return fmt.Errorf("image name %q is not valid; expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots", image)
	}
	s := c.Images().Images
	set := func(d *kv.DiskImage) {
		d.Name, d.Paused = image, paused
		if paused {
			now := time.Now().UTC()
			d.PausedBy, d.PauseTime = by, &now
		} else {
			d.PausedBy, d.PauseTime = "", nil
		}
	}
	for {
		_, err := s.Modify(ctx, kv.DiskImageKey(image), func(d *kv.DiskImage) error {
			if d.Paused == paused {
				return kv.ErrSkip
			}
			set(d)
			return nil
		})
		if errors.Is(err, kv.ErrNotFound) {
			d := &kv.DiskImage{}
			set(d)
			if _, err = s.Create(ctx, kv.DiskImageKey(image), d); errors.Is(err, kv.ErrExists) {
				continue
			}
		}
		if errors.Is(err, kv.ErrSkip) {
			return nil
		}
		return err
	}
}

// DeleteUpload marks an upload for deletion (`nodepool image-delete`): it
// is deleted from its provider, and its record stays in state deleted so
// the build is not uploaded there again; launches use the previous upload.
func (c *Client) DeleteUpload(ctx context.Context, image, build, provider, upload string) error {
	key := kv.UploadKey(image, build, provider, upload)
	_, err := c.Images().Uploads.Modify(ctx, key, func(u *kv.ImageUpload) error {
		switch u.State {
		case kv.ImageDeleting, kv.ImageDeleted:
			return kv.ErrSkip
		case kv.ImageUploading:
			return fmt.Errorf("upload %s is %w; delete it once it is ready or failed", key, ErrImageBusy)
		}
		u.SetState(kv.ImageDeleting, time.Now().UTC())
		u.OperatorDelete = true
		return nil
	})
	if errors.Is(err, kv.ErrSkip) {
		return nil
	}
	return err
}

// DeleteBuild marks a build for deletion (`nodepool dib-image-delete`):
// its uploads are deleted from every provider, then its files and record.
func (c *Client) DeleteBuild(ctx context.Context, image, build string) error {
	key := kv.BuildKey(image, build)
	_, err := c.Images().Builds.Modify(ctx, key, func(b *kv.ImageBuild) error {
		switch b.State {
		case kv.ImageDeleting:
			return kv.ErrSkip
		case kv.ImageBuilding:
			return fmt.Errorf("build %s is %w", key, ErrImageBusy)
		}
		b.SetState(kv.ImageDeleting, time.Now().UTC())
		return nil
	})
	if errors.Is(err, kv.ErrSkip) {
		return nil
	}
	return err
}
