package drivers

import (
	"context"
	"io"
	"time"
)

// Tags that drivers put on the images they upload, so that leaked images
// (tagged as ours, without an upload record) can be found.
const (
	TagImage  = "nodepool_image_name"
	TagBuild  = "nodepool_build_id"
	TagUpload = "nodepool_upload_id" // the upload record's key
)

// Image is a disk image in a provider, as a driver sees it.
type Image struct {
	ExternalID string
	Name       string
	Format     string
	Size       int64
	SHA256     string
	Tags       map[string]string
	Created    time.Time
}

// ImageUpload is what the builder asks a driver to upload.
type ImageUpload struct {
	// Name is the image's name in the provider.
	Name   string
	Format string
	Size   int64
	// SHA256 is the hex digest of the data, for drivers that check it.
	SHA256 string
	Tags   map[string]string
	// Data is the image file; the driver reads it to the end.
	Data io.Reader
}

// ImageProvider is implemented by the drivers of clouds that take disk
// images; the builder uploads to them and the launcher boots from the
// uploads (CreateRequest.ImageID). The calls are idempotent where they can
// be: deleting an image that is gone is not an error.
type ImageProvider interface {
	// ImageFormat is the disk image format the provider takes.
	ImageFormat() string
	// UploadImage uploads an image and returns it once the provider can
	// boot from it.
	UploadImage(ctx context.Context, req ImageUpload) (Image, error)
	// DeleteImage deletes an image; nil if it does not exist.
	DeleteImage(ctx context.Context, externalID string) error
	// ListImages lists the provider's images, ours (tagged) and others.
	ListImages(ctx context.Context) ([]Image, error)
}
