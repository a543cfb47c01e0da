package builder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/kv"
)

// FilesBucket is the object store that holds the image files of every
// build, so that an upload worker on any host can read them.
const FilesBucket = "nodepool-image-files"

// EnsureFiles creates (or opens) the image files object store.
func EnsureFiles(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) (jetstream.ObjectStore, error) {
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      FilesBucket,
		Description: "image files of the builds in nodepool-images",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		log.Warn("object store exists with other settings; using it as it is", "bucket", FilesBucket)
		obs, err = js.ObjectStore(ctx, FilesBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("opening object store %s: %w", FilesBucket, err)
	}
	return obs, nil
}

// ObjectName is the name of a build's file of one format.
func ObjectName(image, build, format string) string { return image + "/" + build + "." + format }

// storeFiles puts a build's files into the object store, streaming each
// from disk (an object is a series of 128 KiB chunks, so no file is held in
// memory), and returns what was stored. On error, what was stored is
// removed again.
func (b *Builder) storeFiles(ctx context.Context, build *kv.ImageBuild, paths map[string]string) (map[string]kv.ImageFile, int64, error) {
	out := map[string]kv.ImageFile{}
	var total int64
	formats := make([]string, 0, len(paths))
	for f := range paths {
		formats = append(formats, f)
	}
	slices.Sort(formats)
	for _, format := range formats {
		f, err := os.Open(paths[format])
		if err != nil {
			b.deleteFiles(context.WithoutCancel(ctx), build.Image, build.ID)
			return nil, 0, err
		}
		h := sha256.New()
		name := ObjectName(build.Image, build.ID, format)
		info, err := b.files.Put(ctx, jetstream.ObjectMeta{
			Name:        name,
			Description: fmt.Sprintf("%s build %s, %s", build.Image, build.ID, format),
			Metadata:    map[string]string{"image": build.Image, "build": build.ID, "format": format},
		}, io.TeeReader(f, h))
		_ = f.Close()
		if err != nil {
			b.deleteFiles(context.WithoutCancel(ctx), build.Image, build.ID)
			return nil, 0, fmt.Errorf("storing %s in %s: %w", name, FilesBucket, err)
		}
		out[format] = kv.ImageFile{Object: name, Size: int64(info.Size), SHA256: hex.EncodeToString(h.Sum(nil))}
		total += int64(info.Size)
	}
	return out, total, nil
}

// deleteFiles removes every object of a build (those its record names and
// any a crash left behind).
func (b *Builder) deleteFiles(ctx context.Context, image, build string) error {
	infos, err := b.files.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", FilesBucket, err)
	}
	prefix := image + "/" + build + "."
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			continue
		}
		if err := b.files.Delete(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("deleting %s from %s: %w", info.Name, FilesBucket, err)
		}
	}
	return nil
}

// openFile opens a build's file of one format for reading.
func (b *Builder) openFile(ctx context.Context, file kv.ImageFile) (io.ReadCloser, error) {
	r, err := b.files.Get(ctx, file.Object)
	if err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", file.Object, FilesBucket, err)
	}
	return r, nil
}
