package builder

import (
	"context"
	"errors"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/kv"
)

// deleteAfterUpload deletes, for the diskimages with delete-after-upload,
// each file of a ready build once every provider that takes its format
// has a ready upload of the build, except the formats in keep-formats
// (Nodepool deletes the file from the builder's disk; here it is the
// image files store). Formats no provider takes (built for the
// diskimage's own formats) are kept. The build record says the file is
// deleted before the object goes, so a crash in between leaves an object
// that the build's deletion removes, never a record naming a missing file
// as present.
func (s *scheduler) deleteAfterUpload(ctx context.Context, builds map[string][]kv.ImageBuild, uploads []kv.ImageUpload) {
	b := s.b
	ready := map[string]bool{} // build key + provider + format of ready uploads
	for _, u := range uploads {
		if u.State == kv.ImageReady {
			ready[kv.BuildKey(u.Image, u.BuildID)+"|"+u.Provider+"|"+u.Format] = true
		}
	}
	for image, list := range builds {
		di, ok := b.config().Diskimage(image)
		if !ok || !di.DeleteAfterUpload {
			continue
		}
		// The providers that take each format.
		takers := map[string][]string{}
		for _, p := range b.config().ImageProviders(image) {
			if pd, _ := p.Diskimage(image); pd.Pause {
				continue
			}
			if drv, ok := b.imageProvider(p.Name); ok {
				takers[drv.ImageFormat()] = append(takers[drv.ImageFormat()], p.Name)
			}
		}
		for _, bl := range list {
			if bl.State != kv.ImageReady {
				continue
			}
			for format, file := range bl.Files {
				if file.Deleted || slices.Contains(di.KeepFormats, format) || len(takers[format]) == 0 {
					continue
				}
				done := true
				for _, p := range takers[format] {
					if !ready[bl.Key()+"|"+p+"|"+format] {
						done = false
						break
					}
				}
				if done {
					s.deleteFile(ctx, bl, format)
				}
			}
		}
	}
}

// deleteFile marks a build's file deleted, then deletes its object.
func (s *scheduler) deleteFile(ctx context.Context, bl kv.ImageBuild, format string) {
	b := s.b
	e, err := b.builds.Modify(ctx, bl.Key(), func(cur *kv.ImageBuild) error {
		f, ok := cur.Files[format]
		if cur.State != kv.ImageReady || !ok || f.Deleted {
			return kv.ErrSkip
		}
		f.Deleted = true
		cur.Files[format] = f
		return nil
	})
	if err != nil {
		if !errors.Is(err, kv.ErrSkip) {
			b.log.Warn("could not mark a build's file deleted; trying again on the next pass", "image", bl.Image, "build", bl.ID, "format", format, "err", err)
		}
		return
	}
	object := e.Value.Files[format].Object
	if err := b.files.Delete(ctx, object); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		b.log.Warn("could not delete an uploaded file; the build's deletion will", "object", object, "err", err)
		return
	}
	b.log.Info("deleted a build's file after its uploads (delete-after-upload)", "image", bl.Image, "build", bl.ID, "format", format)
}
