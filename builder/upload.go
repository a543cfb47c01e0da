package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// handleUpload answers one upload trigger: it uploads the newest ready
// build of the image that the provider takes and lacks. Uploads are level
// triggered: the message says where to look, the records say what to do,
// so repeats are harmless. One upload of an image to a provider runs at a
// time (lease upload.<image>.<provider>); a failed upload is recorded and
// tried again by the scheduler after a backoff, and never holds up the
// uploads to other providers, which are other messages.
func (b *Builder) handleUpload(ctx context.Context, msg jetstream.Msg) {
	meta, drop, ok := b.trigger(ctx, msg, "upload")
	if !ok {
		return
	}
	image, provider, err := events.ParseUploadSubject(msg.Subject())
	if err != nil {
		drop(slog.LevelError, "dropping an upload trigger", "err", err)
		return
	}
	if _, err := events.ParseUploadMessage(msg.Data()); err != nil {
		drop(slog.LevelError, "dropping an upload trigger", "err", err)
		return
	}
	di, ok := b.config().Diskimage(image)
	pc, pok := b.config().Provider(provider)
	if !ok || di.Abstract || !pok {
		drop(slog.LevelError, "dropping an upload trigger: no such image or provider in the configuration", "image", image, "provider", provider)
		return
	}
	pd, listed := pc.Diskimage(image)
	drv, takesImages := b.imageProvider(provider)
	switch {
	case !listed:
		drop(slog.LevelWarn, "dropping an upload trigger: the provider does not list the image", "image", image, "provider", provider)
		return
	case !takesImages:
		drop(slog.LevelError, "dropping an upload trigger: the provider's driver does not take images", "provider", provider, "driver", pc.Driver)
		return
	case pd.Pause:
		drop(slog.LevelInfo, "uploads of the image to this provider are paused; trigger dropped", "image", image, "provider", provider)
		return
	}
	log := b.log.With("image", image, "provider", provider, "trigger", meta.Sequence.Stream)
	if !b.claim(uploadClaim(image, provider)) {
		drop(slog.LevelDebug, "an upload of this image to this provider is running in this process")
		return
	}
	defer b.unclaim(uploadClaim(image, provider))
	// The upload keeps the driver it starts with, whatever a reload does.
	done, usable := drivers.Use(b.providers()[provider])
	if !usable {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	defer done()
	lease := kv.NewLease(b.b.Locks, uploadLease(image, provider), b.runID, b.opts.LeaseTTL, log)
	held, err := lease.TryAcquire(ctx)
	if err != nil {
		log.Warn("could not take the upload lease; trying later", "err", err)
		nakLater(msg)
		return
	}
	if !held {
		// Another upload of the image to the provider runs, or its lease
		// has not ended yet: look again once it may have. The one running
		// uploads the build that was newest when it started, which need
		// not be this trigger's; a trigger dropped here would wait for the
		// scheduler to publish it again, after the stream's duplicate
		// window (two minutes). Bounded by triggerMaxDeliver.
		log.Debug("an upload of this image to this provider is running elsewhere; looking again when its lease may have ended", "in", b.opts.LeaseTTL)
		_ = msg.NakWithDelay(b.opts.LeaseTTL)
		return
	}
	defer func() {
		rctx, cancel := writeCtx(ctx)
		defer cancel()
		if err := lease.Release(rctx); err != nil && !errors.Is(err, kv.ErrNotFound) && !errors.Is(err, kv.ErrConflict) {
			log.Debug("could not release the upload lease", "err", err)
		}
	}()

	builds, err := b.img.Builds.Filtered(kv.BuildKeys(image)).List(ctx)
	if err != nil {
		log.Warn("could not read the builds; trying later", "err", err)
		nakLater(msg)
		return
	}
	uploads, err := b.img.Uploads.Filtered(kv.UploadKeys(image, provider)).List(ctx)
	if err != nil {
		log.Warn("could not read the uploads; trying later", "err", err)
		nakLater(msg)
		return
	}
	format := drv.ImageFormat()
	target, ok := uploadTarget(builds, format)
	if !ok {
		drop(slog.LevelInfo, "no ready build of the image has the format the provider takes", "format", format)
		return
	}
	if target.Files[format].Deleted {
		drop(slog.LevelInfo, "the newest build's file of this format was deleted after its uploads (delete-after-upload); the next build is uploaded", "build", target.ID, "format", format)
		return
	}
	var existing *kv.Entry[kv.ImageUpload]
	for i := range uploads {
		u := &uploads[i]
		if u.Value.State == kv.ImageUploading {
			b.failOrphanUpload(ctx, u.Key)
			if fresh, err := b.img.Uploads.Get(ctx, u.Key); err == nil {
				*u = fresh
			}
		}
		if u.Value.BuildID == target.ID && (existing == nil || u.Value.ID > existing.Value.ID) {
			existing = u
		}
	}
	if existing != nil {
		u := existing.Value
		switch {
		case u.State != kv.ImageFailed:
			drop(slog.LevelDebug, "the newest build already has an upload to this provider", "build", target.ID, "upload", u.ID, "state", u.State)
			return
		case time.Now().Before(b.uploadRetryAt(&u)):
			drop(slog.LevelDebug, "the failed upload is not due for another try yet", "build", target.ID, "upload", u.ID)
			return
		}
	}
	rec, err := b.startUpload(ctx, existing, &target, provider, format)
	if err != nil {
		log.Warn("could not start the upload; trying later", "err", err)
		nakLater(msg)
		return
	}
	b.runUpload(ctx, msg, lease, drv, &target, rec, log.With("build", target.ID, "upload", rec.Value.ID, "attempt", rec.Value.Attempt))
}

// uploadTarget is the newest ready build that has a file of the format.
func uploadTarget(builds []kv.Entry[kv.ImageBuild], format string) (kv.ImageBuild, bool) {
	var best kv.ImageBuild
	found := false
	for _, e := range builds {
		bl := e.Value
		if bl.State != kv.ImageReady {
			continue
		}
		if _, ok := bl.Files[format]; !ok {
			continue
		}
		if !found || bl.ID > best.ID {
			best, found = bl, true
		}
	}
	return best, found
}

// uploadRetryAt is when a failed upload may be tried again.
func (b *Builder) uploadRetryAt(u *kv.ImageUpload) time.Time {
	if u.Interrupted {
		return u.StateTime
	}
	return u.StateTime.Add(b.backoff(u.Attempt))
}

// startUpload records an upload attempt owned by this run: a new record,
// or the next attempt of a failed one.
func (b *Builder) startUpload(ctx context.Context, existing *kv.Entry[kv.ImageUpload], build *kv.ImageBuild, provider, format string) (kv.Entry[kv.ImageUpload], error) {
	now := time.Now().UTC()
	if existing != nil {
		return b.uploads.Modify(ctx, existing.Key, func(u *kv.ImageUpload) error {
			if u.State != kv.ImageFailed {
				return errLost
			}
			u.SetState(kv.ImageUploading, now)
			u.Uploader, u.UploaderID = b.opts.ID, b.runID
			u.Attempt++
			u.Reason, u.Interrupted = "", false
			return nil
		})
	}
	id, err := b.nextID(ctx, build.Image, true)
	if err != nil {
		return kv.Entry[kv.ImageUpload]{}, err
	}
	u := kv.ImageUpload{
		Image: build.Image, BuildID: build.ID, Provider: provider, ID: id,
		State: kv.ImageUploading, StateTime: now, Format: format,
		Username: build.Username, PythonPath: build.PythonPath, ShellType: build.ShellType,
		Uploader: b.opts.ID, UploaderID: b.runID, Attempt: 1, Created: now,
	}
	return b.uploads.Create(ctx, u.Key(), &u)
}

// runUpload uploads a build's file through the driver and records the
// outcome; the trigger is then acknowledged (or handed back if this
// process is stopping).
func (b *Builder) runUpload(ctx context.Context, msg jetstream.Msg, lease *kv.Lease, drv drivers.ImageProvider, build *kv.ImageBuild, e kv.Entry[kv.ImageUpload], log *slog.Logger) {
	u := e.Value
	key := u.Key()
	log.Info("upload started")
	uctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := b.keepAlive(ctx, msg, lease, cancel)
	defer stop()

	started := time.Now()
	img, err := b.upload(uctx, drv, build, &u)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: builder %s stopped during the upload", errStopping, b.opts.ID)
	} else if err != nil && errors.Is(context.Cause(uctx), errLeaseLost) {
		err = context.Cause(uctx)
	}
	interrupted := errors.Is(err, errStopping) || errors.Is(err, errLeaseLost)

	wctx, wcancel := writeCtx(ctx)
	defer wcancel()
	_, werr := b.uploads.Modify(wctx, key, func(cur *kv.ImageUpload) error {
		if cur.State != kv.ImageUploading || cur.UploaderID != b.runID {
			return errLost
		}
		now := time.Now().UTC()
		if err != nil {
			cur.SetState(kv.ImageFailed, now)
			cur.Reason, cur.Interrupted = err.Error(), interrupted
			return nil
		}
		cur.SetState(kv.ImageReady, now)
		cur.ExternalID, cur.ExternalName, cur.Reason = img.ExternalID, img.Name, ""
		return nil
	})
	if werr != nil {
		// The record changed under the upload (deleted, or found
		// orphaned): nobody knows the image we made; remove it.
		log.Warn("upload record changed under the upload; deleting the uploaded image", "err", werr)
		if err == nil {
			if derr := drv.DeleteImage(wctx, img.ExternalID); derr != nil {
				log.Warn("could not delete the image; leak cleanup will", "external_id", img.ExternalID, "err", derr)
			}
		}
		_ = msg.Ack()
		return
	}
	switch {
	case interrupted:
		log.Warn("upload interrupted; handing its trigger back", "err", err)
		b.metrics.UploadEnded(u.Image, u.Provider, metrics.ImageInterrupted, time.Since(started), 0)
		_ = msg.Nak()
		return
	case err != nil:
		log.Warn("upload failed; the scheduler tries again", "err", err, "retry_in", b.backoff(u.Attempt))
		b.metrics.UploadEnded(u.Image, u.Provider, metrics.ImageFailed, time.Since(started), 0)
	default:
		log.Info("upload ready", "external_id", img.ExternalID)
		b.metrics.UploadEnded(u.Image, u.Provider, metrics.ImageReady, time.Since(started), img.Size)
	}
	_ = msg.Ack()
}

// upload removes what earlier attempts of the upload left in the provider,
// then streams the build's file from the object store to the driver.
func (b *Builder) upload(ctx context.Context, drv drivers.ImageProvider, build *kv.ImageBuild, u *kv.ImageUpload) (drivers.Image, error) {
	key := u.Key()
	if u.Attempt > 1 {
		if err := deleteTagged(ctx, drv, key, ""); err != nil {
			return drivers.Image{}, fmt.Errorf("removing what earlier attempts left: %w", err)
		}
	}
	file := build.Files[u.Format]
	r, err := b.openFile(ctx, file)
	if err != nil {
		return drivers.Image{}, err
	}
	defer r.Close()
	// The diskimage's metadata are the image's default tags; nodepool's
	// own tags win.
	tags := map[string]string{}
	if di, ok := b.config().Diskimage(build.Image); ok {
		maps.Copy(tags, di.Metadata)
	}
	maps.Copy(tags, map[string]string{
		drivers.TagProvider: u.Provider, drivers.TagImage: build.Image,
		drivers.TagBuild: build.ID, drivers.TagUpload: key,
	})
	return drv.UploadImage(ctx, drivers.ImageUpload{
		Name:   build.Image + "-" + build.ID,
		Format: u.Format,
		Size:   file.Size,
		SHA256: file.SHA256,
		Tags:   tags,
		Data:   r,
	})
}

// deleteTagged deletes the provider's images tagged with an upload key,
// except one.
func deleteTagged(ctx context.Context, drv drivers.ImageProvider, key, except string) error {
	imgs, err := drv.ListImages(ctx)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if img.Tags[drivers.TagUpload] == key && img.ExternalID != except {
			if err := drv.DeleteImage(ctx, img.ExternalID); err != nil {
				return err
			}
		}
	}
	return nil
}

// failOrphanUpload marks an upload failed whose uploader went away.
func (b *Builder) failOrphanUpload(ctx context.Context, key string) {
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	_, err := b.uploads.Modify(wctx, key, func(cur *kv.ImageUpload) error {
		if cur.State != kv.ImageUploading || b.ownsUpload(wctx, cur) {
			return kv.ErrSkip
		}
		cur.SetState(kv.ImageFailed, time.Now().UTC())
		cur.Interrupted = true
		cur.Reason = fmt.Sprintf("uploader %s went away during the upload", cur.Uploader)
		b.log.Info("upload orphaned by its uploader; marked failed", "upload", key, "uploader", cur.Uploader)
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		b.log.Warn("could not mark an orphaned upload failed", "upload", key, "err", err)
	}
}

// ownsUpload reports whether an uploading upload's owner is alive.
func (b *Builder) ownsUpload(ctx context.Context, u *kv.ImageUpload) bool {
	if u.UploaderID == b.runID {
		return b.running(uploadClaim(u.Image, u.Provider))
	}
	e, err := b.b.Locks.Get(ctx, uploadLease(u.Image, u.Provider))
	if err != nil {
		return !errors.Is(err, kv.ErrNotFound) && !errors.Is(err, kv.ErrBadRecord)
	}
	return e.Value.Holder == u.UploaderID
}

// newestFirst sorts upload entries newest first.
func newestFirst(us []kv.ImageUpload) {
	slices.SortFunc(us, func(a, b kv.ImageUpload) int { return kv.CompareUploads(b, a) })
}
