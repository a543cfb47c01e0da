package openstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// ImageFormat is the disk format uploads take: qcow2, which every Glance
// store takes (Nodepool's default too).
func (p *Provider) ImageFormat() string { return config.DefaultImageFormat }

// UploadImage uploads a build to Glance: it creates the image (named by
// image-name-format, with the provider diskimage's meta and the upload's
// tags as properties), sends the file, waits until Glance says active,
// and runs post-upload-hook; an image that fails any of these is deleted.
// The whole upload is bounded by image-upload-timeout.
func (p *Provider) UploadImage(ctx context.Context, req drivers.ImageUpload) (drivers.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ImageUploadTimeout.D())
	defer cancel()
	cl, err := p.client(ctx)
	if err != nil {
		return drivers.Image{}, err
	}
	imageName := req.Tags[drivers.TagImage]
	name, err := config.FormatImageName(p.cfg.ImageNameFormat, imageName, time.Now())
	if err != nil {
		return drivers.Image{}, err
	}
	vis := images.ImageVisibilityPrivate
	img, err := images.Create(ctx, cl.image, images.CreateOpts{Name: name, DiskFormat: req.Format, ContainerFormat: "bare",
		Visibility: &vis, Properties: p.imageProperties(imageName, req)}).Extract()
	if err != nil {
		return drivers.Image{}, wrapf(err, "creating image %s", name)
	}
	ok := false
	defer func() {
		if !ok {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer dcancel()
			if err := p.DeleteImage(dctx, img.ID); err != nil {
				p.log.Warn("could not delete a failed upload; leak cleanup will", "image", img.ID, "err", err)
			}
		}
	}()
	got, err := p.fillImage(ctx, cl, img.ID, name, req)
	if err != nil {
		return drivers.Image{}, err
	}
	ok = true
	return toImage(got), nil
}

// imageProperties are the Glance properties of an upload: the provider
// diskimage's meta, the upload's tags, and the image's checksum.
func (p *Provider) imageProperties(imageName string, req drivers.ImageUpload) map[string]string {
	props := map[string]string{}
	if pd, ok := p.cfg.Diskimage(imageName); ok {
		for k, v := range pd.Meta {
			props[k] = v
		}
	}
	for k, v := range req.Tags {
		props[k] = v
	}
	if req.SHA256 != "" {
		props["nodepool_sha256"] = req.SHA256
	}
	return props
}

// fillImage sends the file of a created image, waits until Glance says
// active, and runs post-upload-hook.
func (p *Provider) fillImage(ctx context.Context, cl *clients, id, name string, req drivers.ImageUpload) (*images.Image, error) {
	data := req.Data
	var local string
	if p.cfg.UploadHook != "" {
		// The hook is given the image file: the build's file lives in the
		// object store, so a copy is written as it is uploaded.
		f, err := os.CreateTemp("", "nodepool-upload-*."+config.FormatExtension(req.Format))
		if err != nil {
			return nil, fmt.Errorf("post-upload-hook needs a local copy of the image: %w", err)
		}
		local = f.Name()
		defer os.Remove(local)
		defer f.Close()
		data = io.TeeReader(data, f)
	}
	if err := imagedata.Upload(ctx, cl.image, id, data).ExtractErr(); err != nil {
		return nil, wrapf(err, "uploading image %s", name)
	}
	got, err := p.waitActive(ctx, cl, id)
	if err != nil {
		return nil, err
	}
	if p.cfg.UploadHook != "" {
		if err := p.runHook(ctx, got.ID, local); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// waitActive waits until Glance has the image's data.
func (p *Provider) waitActive(ctx context.Context, cl *clients, id string) (*images.Image, error) {
	for tries := 0; ; tries++ {
		img, err := images.Get(ctx, cl.image, id).Extract()
		if err != nil {
			return nil, wrapf(err, "reading image %s", id)
		}
		switch img.Status {
		case images.ImageStatusActive:
			return img, nil
		case images.ImageStatusKilled, images.ImageStatusDeleted, images.ImageStatusPendingDelete, images.ImageStatusDeactivated:
			return nil, fmt.Errorf("image %s went %s after its upload", id, img.Status)
		}
		if !wait.Sleep(ctx, min(time.Duration(tries+1)*200*time.Millisecond, 5*time.Second)) {
			return nil, fmt.Errorf("image %s is still %s at image-upload-timeout (%s)", id, img.Status, p.cfg.ImageUploadTimeout.D())
		}
	}
}

// runHook runs post-upload-hook: HOOK PROVIDER EXTERNAL_IMAGE_ID
// LOCAL_IMAGE_FILENAME; a non-zero exit fails the upload.
func (p *Provider) runHook(ctx context.Context, imageID, local string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, p.cfg.UploadHook, p.cfg.Name, imageID, local)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		text := strings.TrimSpace(out.String())
		if len(text) > 2000 {
			text = text[len(text)-2000:]
		}
		return fmt.Errorf("post-upload-hook %s failed for image %s: %w: %s", p.cfg.UploadHook, imageID, err, text)
	}
	return nil
}

// DeleteImage deletes an image; one that is gone is no error.
func (p *Provider) DeleteImage(ctx context.Context, externalID string) error {
	cl, err := p.client(ctx)
	if err != nil {
		return err
	}
	if err := images.Delete(ctx, cl.image, externalID).ExtractErr(); err != nil {
		if err = classify(err); errors.Is(err, drivers.ErrNotFound) {
			return nil
		}
		return wrapf(err, "deleting image %s", externalID)
	}
	return nil
}

// ListImages lists the images the project sees; Glance properties are
// their tags.
func (p *Provider) ListImages(ctx context.Context) ([]drivers.Image, error) {
	cl, err := p.client(ctx)
	if err != nil {
		return nil, err
	}
	pages, err := images.List(cl.image, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		return nil, wrapf(err, "listing images")
	}
	all, err := images.ExtractImages(pages)
	if err != nil {
		return nil, err
	}
	out := make([]drivers.Image, 0, len(all))
	for i := range all {
		out = append(out, toImage(&all[i]))
	}
	return out, nil
}

func toImage(img *images.Image) drivers.Image {
	tags := map[string]string{}
	for k, v := range img.Properties {
		if s, ok := v.(string); ok {
			tags[k] = s
		}
	}
	return drivers.Image{ExternalID: img.ID, Name: img.Name, Format: img.DiskFormat, Size: img.SizeBytes,
		SHA256: tags["nodepool_sha256"], Tags: tags, Created: img.CreatedAt}
}
