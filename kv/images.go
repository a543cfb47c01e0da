package kv

import (
	"fmt"
	"github.com/nodepool-nats/nodepool/internal/token"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The nodepool-images bucket holds three kinds of records, told apart by
// the number of tokens in their keys:
//
//	<image>                                   DiskImage (pause, id counters)
//	<image>.<build-id>                        ImageBuild
//	<image>.<build-id>.<provider>.<upload-id> ImageUpload
const (
	DiskImageKeys   = "*"
	ImageBuildKeys  = "*.*"
	ImageUploadKeys = "*.*.*.*"
)

// ImageState is the state of a build or an upload, as in Nodepool.
type ImageState string

// Build and upload states.
const (
	ImageBuilding  ImageState = "building"
	ImageUploading ImageState = "uploading"
	ImageReady     ImageState = "ready"
	ImageFailed    ImageState = "failed"
	ImageDeleting  ImageState = "deleting"
	// ImageDeleted is an upload an operator deleted (`nodepool
	// image-delete`): the record stays, so that its build is not uploaded
	// to that provider again, until the build itself goes.
	ImageDeleted ImageState = "deleted"
)

// DiskImage is the record of one image (key <image>): what applies to all
// its builds.
type DiskImage struct {
	Name string `json:"name"`
	// Paused stops builds of the image (`nodepool image-pause`).
	Paused    bool       `json:"paused"`
	PausedBy  string     `json:"paused_by,omitempty"`
	PauseTime *time.Time `json:"pause_time,omitempty"`
	// BuildSeq and UploadSeq are the last build and upload ids given out.
	BuildSeq  uint64 `json:"build_seq"`
	UploadSeq uint64 `json:"upload_seq"`
}

// ImageFile is one format of a build, stored in the image files object
// store.
type ImageFile struct {
	Object string `json:"object"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Deleted: the file was deleted from the store once every upload of
	// it was done (the diskimage's delete-after-upload); the record keeps
	// what it was.
	Deleted bool `json:"deleted,omitempty"`
}

// ImageBuild is the record of one build of an image (key
// <image>.<build-id>).
type ImageBuild struct {
	Image     string     `json:"image"`
	ID        string     `json:"id"`
	State     ImageState `json:"state"`
	StateTime time.Time  `json:"state_time"`
	// Builder is the process (NODEPOOL_ID) that runs or ran the build;
	// BuilderID names that run of the process, and is the holder of the
	// build's lease while it is building.
	Builder   string   `json:"builder"`
	BuilderID string   `json:"builder_id"`
	Formats   []string `json:"formats"`
	// Files are the image files by format; Size is their total.
	Files      map[string]ImageFile `json:"files"`
	Size       int64                `json:"size"`
	Username   string               `json:"username"`
	PythonPath string               `json:"python_path"`
	ShellType  string               `json:"shell_type"`
	// Log is the build log's path on the builder's host.
	Log string `json:"log"`
	// Trigger is the stream sequence of the trigger message the build
	// answers.
	Trigger uint64 `json:"trigger"`
	// Reason says why a build failed; Interrupted that it failed because
	// its builder went away, not because of the image.
	Reason      string    `json:"reason,omitempty"`
	Interrupted bool      `json:"interrupted,omitempty"`
	Created     time.Time `json:"created"`
}

// ImageUpload is the record of one upload of a build to a provider (key
// <image>.<build-id>.<provider>.<upload-id>).
type ImageUpload struct {
	Image        string     `json:"image"`
	BuildID      string     `json:"build_id"`
	Provider     string     `json:"provider"`
	ID           string     `json:"id"`
	State        ImageState `json:"state"`
	StateTime    time.Time  `json:"state_time"`
	ExternalID   string     `json:"external_id"`
	ExternalName string     `json:"external_name"`
	Format       string     `json:"format"`
	Username     string     `json:"username"`
	PythonPath   string     `json:"python_path"`
	ShellType    string     `json:"shell_type"`
	// Uploader and UploaderID are as Builder and BuilderID of a build.
	Uploader   string `json:"uploader"`
	UploaderID string `json:"uploader_id"`
	// Attempt counts the tries of this upload.
	Attempt     int    `json:"attempt"`
	Reason      string `json:"reason,omitempty"`
	Interrupted bool   `json:"interrupted,omitempty"`
	// OperatorDelete marks an upload deleted by `nodepool image-delete`;
	// it becomes a deleted record instead of disappearing.
	OperatorDelete bool      `json:"operator_delete,omitempty"`
	Created        time.Time `json:"created"`
}

// SetState changes a build's state and its timestamp.
func (b *ImageBuild) SetState(s ImageState, now time.Time) {
	if b.State != s {
		b.State = s
		b.StateTime = now
	}
}

// SetState changes an upload's state and its timestamp.
func (u *ImageUpload) SetState(s ImageState, now time.Time) {
	if u.State != s {
		u.State = s
		u.StateTime = now
	}
}

// Key is the build's key.
func (b *ImageBuild) Key() string { return BuildKey(b.Image, b.ID) }

// Key is the upload's key.
func (u *ImageUpload) Key() string { return UploadKey(u.Image, u.BuildID, u.Provider, u.ID) }

// DiskImageKey is the key of an image's record. Names are written as one
// token each (a dot in a name becomes "="; see internal/token).
func DiskImageKey(image string) string { return token.Encode(image) }

// BuildKey is the key of a build record.
func BuildKey(image, build string) string { return token.Encode(image) + "." + build }

// BuildKeys is the key filter of an image's builds.
func BuildKeys(image string) string { return token.Encode(image) + ".*" }

// UploadKeys is the key filter of an image's uploads to a provider.
func UploadKeys(image, provider string) string {
	return token.Encode(image) + ".*." + token.Encode(provider) + ".*"
}

// UploadKey is the key of an upload record.
func UploadKey(image, build, provider, upload string) string {
	return token.Encode(image) + "." + build + "." + token.Encode(provider) + "." + upload
}

// ImageSeqID formats a build or upload id: its number, zero-padded to 10
// digits, so that ids sort in the order they were given out.
func ImageSeqID(n uint64) string { return fmt.Sprintf("%010d", n) }

// ParseBuildName splits "<image>-<build-id>", the name `nodepool
// dib-image-list` shows, into its parts.
func ParseBuildName(name string) (image, build string, err error) {
	i := strings.LastIndex(name, "-")
	if i <= 0 || i == len(name)-1 {
		return "", "", fmt.Errorf("%q is not a build name; expected <image>-<build-id> as dib-image-list shows it", name)
	}
	image, build = name[:i], name[i+1:]
	if strings.Trim(build, "0123456789") != "" {
		return "", "", fmt.Errorf("%q is not a build name; expected <image>-<build-id> with a numeric build id", name)
	}
	return image, build, nil
}

// ImageStores are the typed views of the nodepool-images bucket.
type ImageStores struct {
	Images  *Store[DiskImage]
	Builds  *Store[ImageBuild]
	Uploads *Store[ImageUpload]
}

// NewImageStores wraps the nodepool-images bucket.
func NewImageStores(bucket jetstream.KeyValue) *ImageStores {
	s := NewStore[DiskImage](bucket)
	return &ImageStores{
		Images:  s.Filtered(DiskImageKeys),
		Builds:  NewStore[ImageBuild](bucket).Filtered(ImageBuildKeys),
		Uploads: NewStore[ImageUpload](bucket).Filtered(ImageUploadKeys),
	}
}

// NewestReadyUpload picks, among uploads, the newest ready upload of an
// image to a provider: highest build id, then highest upload id.
func NewestReadyUpload(uploads []ImageUpload, image, provider string) (ImageUpload, bool) {
	var best ImageUpload
	found := false
	for _, u := range uploads {
		if u.Image != image || u.Provider != provider || u.State != ImageReady {
			continue
		}
		if !found || CompareUploads(u, best) > 0 {
			best, found = u, true
		}
	}
	return best, found
}

// CompareUploads orders uploads by build id, then upload id.
func CompareUploads(a, b ImageUpload) int {
	if c := strings.Compare(a.BuildID, b.BuildID); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// SortBuildsNewestFirst orders builds by id, newest first.
func SortBuildsNewestFirst(builds []ImageBuild) {
	slices.SortFunc(builds, func(a, b ImageBuild) int { return strings.Compare(b.ID, a.ID) })
}
