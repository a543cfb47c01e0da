package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

// trigger reads a trigger message's metadata and returns drop, which
// acknowledges a message that cannot be acted on, with a log line and a
// count. A message without metadata is dropped at once (ok false).
func (b *Builder) trigger(ctx context.Context, msg jetstream.Msg, kind string) (*jetstream.MsgMetadata, func(slog.Level, string, ...any), bool) {
	meta, err := msg.Metadata()
	if err != nil {
		b.log.Error(kind+" trigger without metadata; dropping it", "subject", msg.Subject(), "err", err)
		_ = msg.Ack()
		return nil, nil, false
	}
	drop := func(level slog.Level, why string, args ...any) {
		b.log.Log(ctx, level, why, append([]any{"subject", msg.Subject(), "seq", meta.Sequence.Stream}, args...)...)
		b.metrics.TriggerDropped()
		_ = msg.Ack()
	}
	return meta, drop, true
}

// handleBuild answers one build trigger. Whatever the message holds, the
// worker goes on; the message is acknowledged once the build it asked for
// is recorded ready or failed (or once it is clear no build is needed).
//
// A trigger is answered by any build of the image that was running when
// it was published or finished after that, so duplicate triggers (a manual
// one during a scheduled build, the scheduler's repeats) start no second
// build. One build of an image runs at a time: its lease build.<image> is
// held while it runs, renewed with the message.
func (b *Builder) handleBuild(ctx context.Context, msg jetstream.Msg) {
	meta, drop, ok := b.trigger(ctx, msg, "build")
	if !ok {
		return
	}
	image, err := events.ParseBuildSubject(msg.Subject())
	if err != nil {
		drop(slog.LevelError, "dropping a build trigger", "err", err)
		return
	}
	m, err := events.ParseBuildMessage(msg.Data())
	if err != nil {
		drop(slog.LevelError, "dropping a build trigger", "err", err)
		return
	}
	di, ok := b.config().Diskimage(image)
	if !ok || di.Abstract {
		drop(slog.LevelError, "dropping a build trigger: no such image in the configuration (or it is abstract)",
			"image", image, "images", b.config().DiskimageNames())
		return
	}
	log := b.log.With("image", image, "trigger", meta.Sequence.Stream, "reason", m.Reason)
	if b.paused(di) {
		drop(slog.LevelInfo, "image is paused; build trigger dropped", "image", image)
		return
	}
	formats := b.formats(di)
	if len(formats) == 0 {
		drop(slog.LevelWarn, "image has nothing to build: no provider lists it and it names no formats", "image", image)
		return
	}
	if !b.claim(buildClaim(image)) {
		if b.endedBuildHolds(ctx, msg, image) {
			return
		}
		drop(slog.LevelInfo, "a build of this image is running in this process; trigger answered by it", "image", image)
		return
	}
	defer b.unclaim(buildClaim(image))
	lease := kv.NewLease(b.b.Locks, buildLease(image), b.runID, b.opts.LeaseTTL, log)
	held, err := lease.TryAcquire(ctx)
	if err != nil {
		log.Warn("could not take the build lease; trying later", "err", err)
		nakLater(msg)
		return
	}
	if !held {
		if meta.NumDelivered > 1 {
			// Delivered again: its first worker stopped, and may hold the
			// lease until it expires. Look again then.
			_ = msg.NakWithDelay(b.opts.LeaseTTL)
			return
		}
		if b.endedBuildHolds(ctx, msg, image) {
			return
		}
		drop(slog.LevelInfo, "a build of this image is running elsewhere; trigger answered by it", "image", image)
		return
	}
	defer func() {
		rctx, cancel := writeCtx(ctx)
		defer cancel()
		if err := lease.Release(rctx); err != nil && !errors.Is(err, kv.ErrNotFound) && !errors.Is(err, kv.ErrConflict) {
			log.Debug("could not release the build lease", "err", err)
		}
	}()

	builds, err := b.img.Builds.Filtered(kv.BuildKeys(image)).List(ctx)
	if err != nil {
		log.Warn("could not read the builds; trying later", "err", err)
		nakLater(msg)
		return
	}
	interrupted := 0
	for _, e := range builds {
		bl := e.Value
		if bl.State == kv.ImageBuilding {
			// We hold the lease, so its builder is gone.
			b.failOrphanBuild(ctx, e.Key)
			bl.State, bl.Interrupted, bl.StateTime = kv.ImageFailed, true, time.Now().UTC()
		}
		if bl.Interrupted {
			if bl.Trigger == meta.Sequence.Stream {
				interrupted++
			}
			continue
		}
		if (bl.State == kv.ImageReady || bl.State == kv.ImageFailed) &&
			(bl.Trigger == meta.Sequence.Stream || !bl.StateTime.Before(meta.Timestamp)) {
			drop(slog.LevelInfo, "trigger already answered by a build", "image", image, "build", bl.ID, "state", bl.State)
			return
		}
	}
	if interrupted >= maxInterrupted {
		drop(slog.LevelError, "giving up a build trigger: its builds were interrupted too often", "image", image, "interrupted", interrupted)
		return
	}
	build, err := b.startBuild(ctx, di, formats, meta.Sequence.Stream)
	if err != nil {
		log.Warn("could not start the build; trying later", "err", err)
		nakLater(msg)
		return
	}
	b.runBuild(ctx, msg, lease, di, build, log.With("build", build.Value.ID))
}

// nextID takes the next build or upload id of an image from its record.
// Ids never go back to one seen before, even when the record is gone with
// its bucket (deleted and made again, see internal/repair): an id given
// twice would make the new build's upload trigger a duplicate of the old
// one's, and its image's name that of the old one.
func (b *Builder) nextID(ctx context.Context, image string, upload bool) (string, error) {
	for {
		seenBuild, seenUpload := b.lastIDs(image)
		e, err := b.img.Images.Modify(ctx, kv.DiskImageKey(image), func(d *kv.DiskImage) error {
			if upload {
				d.UploadSeq = max(d.UploadSeq, seenUpload) + 1
			} else {
				d.BuildSeq = max(d.BuildSeq, seenBuild) + 1
			}
			return nil
		})
		if errors.Is(err, kv.ErrNotFound) {
			d := &kv.DiskImage{Name: image}
			if upload {
				d.UploadSeq = seenUpload + 1
			} else {
				d.BuildSeq = seenBuild + 1
			}
			_, err = b.img.Images.Create(ctx, kv.DiskImageKey(image), d)
			if errors.Is(err, kv.ErrExists) {
				continue
			}
			if err != nil {
				return "", err
			}
			if upload {
				return kv.ImageSeqID(d.UploadSeq), nil
			}
			return kv.ImageSeqID(d.BuildSeq), nil
		}
		if err != nil {
			return "", err
		}
		if upload {
			return kv.ImageSeqID(e.Value.UploadSeq), nil
		}
		return kv.ImageSeqID(e.Value.BuildSeq), nil
	}
}

// noteIDs remembers the highest build and upload ids an image record gave
// out (it is told every change of the images cache).
func (b *Builder) noteIDs(ch kv.Change[kv.DiskImage]) {
	if ch.New == nil {
		return
	}
	d := ch.New.Value
	b.idsMu.Lock()
	defer b.idsMu.Unlock()
	last := b.ids[d.Name]
	b.ids[d.Name] = [2]uint64{max(last[0], d.BuildSeq), max(last[1], d.UploadSeq)}
}

// lastIDs returns the highest build and upload ids of an image this
// process has seen given out.
func (b *Builder) lastIDs(image string) (build, upload uint64) {
	b.idsMu.Lock()
	defer b.idsMu.Unlock()
	last := b.ids[image]
	return last[0], last[1]
}

// startBuild records a new build of an image, owned by this run.
func (b *Builder) startBuild(ctx context.Context, di *config.Diskimage, formats []string, trigger uint64) (kv.Entry[kv.ImageBuild], error) {
	id, err := b.nextID(ctx, di.Name, false)
	if err != nil {
		return kv.Entry[kv.ImageBuild]{}, err
	}
	now := time.Now().UTC()
	build := kv.ImageBuild{
		Image: di.Name, ID: id, State: kv.ImageBuilding, StateTime: now,
		Builder: b.opts.ID, BuilderID: b.runID, Formats: formats, Files: map[string]kv.ImageFile{},
		Username: di.Username, PythonPath: di.PythonPath, ShellType: di.ShellType,
		Log: b.logPath(di.Name, id), Trigger: trigger, Created: now,
	}
	e, err := b.builds.Create(ctx, build.Key(), &build)
	if err != nil {
		return e, err
	}
	return e, nil
}

// runBuild runs a started build, stores its files, records how it ended,
// triggers its uploads, and then acknowledges its trigger.
func (b *Builder) runBuild(ctx context.Context, msg jetstream.Msg, lease *kv.Lease, di *config.Diskimage, e kv.Entry[kv.ImageBuild], log *slog.Logger) {
	build := e.Value
	log.Info("build started", "formats", build.Formats, "log", build.Log)
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := b.keepAlive(ctx, msg, lease, cancel)
	defer stop()

	started := time.Now()
	tctx, tcancel := context.WithTimeout(bctx, di.BuildTimeout.D())
	paths, err := b.runDib(tctx, di, &build, build.Formats)
	tcancel()
	var files map[string]kv.ImageFile
	var size int64
	if err == nil {
		files, size, err = b.storeFiles(bctx, &build, paths)
	}
	_ = os.RemoveAll(b.buildDir(build.Image, build.ID))
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: builder %s stopped during the build", errStopping, b.opts.ID)
	} else if err != nil && errors.Is(context.Cause(bctx), errLeaseLost) {
		err = context.Cause(bctx)
	}

	wctx, wcancel := writeCtx(ctx)
	defer wcancel()
	interrupted := errors.Is(err, errStopping) || errors.Is(err, errLeaseLost)
	_, werr := b.builds.Modify(wctx, build.Key(), func(cur *kv.ImageBuild) error {
		if cur.State != kv.ImageBuilding || cur.BuilderID != b.runID {
			return errLost
		}
		now := time.Now().UTC()
		if err != nil {
			cur.SetState(kv.ImageFailed, now)
			cur.Reason, cur.Interrupted = err.Error(), interrupted
			return nil
		}
		cur.SetState(kv.ImageReady, now)
		cur.Files, cur.Size, cur.Reason = files, size, ""
		return nil
	})
	if werr != nil {
		// Someone else decided about this build (it was found orphaned):
		// its files are not ours to keep.
		log.Warn("build record changed under the build; discarding its files", "err", werr)
		_ = b.deleteFiles(wctx, build.Image, build.ID)
		nakLater(msg)
		return
	}
	switch {
	case interrupted:
		log.Warn("build interrupted; handing its trigger back", "err", err)
		b.metrics.BuildEnded(build.Image, metrics.ImageInterrupted, exitCode(err), time.Since(started), nil)
		_ = msg.Nak()
		return
	case err != nil:
		log.Warn("build failed", "err", err)
		b.metrics.BuildEnded(build.Image, metrics.ImageFailed, exitCode(err), time.Since(started), nil)
	default:
		log.Info("build ready", "size", size)
		sizes := map[string]int64{}
		for f, file := range files {
			sizes[f] = file.Size
		}
		b.metrics.BuildEnded(build.Image, metrics.ImageReady, 0, time.Since(started), sizes)
		b.triggerUploads(wctx, di.Name, build.ID)
	}
	_ = msg.Ack()
}

// exitCode is a failed build's exit status: diskimage-builder's own when
// it ran and failed, 1 otherwise.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() > 0 {
		return ee.ExitCode()
	}
	return 1
}

// errLost means a record is no longer this run's to change.
var errLost = errors.New("no longer owned by this builder")

// triggerUploads publishes an upload trigger for each provider that takes
// a new build.
func (b *Builder) triggerUploads(ctx context.Context, image, build string) {
	for _, p := range b.config().ImageProviders(image) {
		if _, ok := b.imageProvider(p.Name); !ok {
			continue
		}
		if pd, _ := p.Diskimage(image); pd.Pause {
			continue
		}
		err := events.PublishUpload(ctx, b.js, image, p.Name, events.UploadMessage{Reason: events.ReasonScheduled, Detail: "build " + build + " is ready"},
			uploadMsgID(image, build, p.Name, 0))
		if err != nil {
			b.log.Warn("could not trigger an upload; the scheduler will", "image", image, "provider", p.Name, "err", err)
		}
	}
}

func uploadMsgID(image, build, provider string, attempt int) string {
	return fmt.Sprintf("upload-%s-%s-%s-%d", image, build, provider, attempt)
}

// failOrphanBuild marks a build failed whose builder went away (its lease
// is gone or held by another run).
func (b *Builder) failOrphanBuild(ctx context.Context, key string) {
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	_, err := b.builds.Modify(wctx, key, func(cur *kv.ImageBuild) error {
		if cur.State != kv.ImageBuilding || b.ownsBuild(wctx, cur) {
			return kv.ErrSkip
		}
		cur.SetState(kv.ImageFailed, time.Now().UTC())
		cur.Interrupted = true
		cur.Reason = fmt.Sprintf("builder %s went away during the build", cur.Builder)
		b.log.Info("build orphaned by its builder; marked failed", "image", cur.Image, "build", cur.ID, "builder", cur.Builder)
		return nil
	})
	if err == nil {
		if image, build, ok := strings.Cut(key, "."); ok {
			b.killBuildProcesses(image, build)
		}
	}
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) {
		b.log.Warn("could not mark an orphaned build failed", "build", key, "err", err)
	}
}

// ownsBuild reports whether a building build's owner is alive: the build
// lease is held by the run the build names (and, for this run, the build
// runs here).
func (b *Builder) ownsBuild(ctx context.Context, bl *kv.ImageBuild) bool {
	if bl.BuilderID == b.runID {
		return b.running(buildClaim(bl.Image))
	}
	e, err := b.b.Locks.Get(ctx, buildLease(bl.Image))
	if err != nil {
		return !errors.Is(err, kv.ErrNotFound) && !errors.Is(err, kv.ErrBadRecord) // unsure: leave it
	}
	return e.Value.Holder == bl.BuilderID
}

// endedBuildHolds looks, afresh, whether a build of the image is still
// running when its claim or lease is held: a build that wrote its end
// keeps them a moment longer (its uploads to start, its lease to
// release), and a trigger published then is not answered by it. Such a
// trigger is delivered again a little later (true); one that finds a
// build running is answered by it (false), as is one when the builds
// cannot be read.
func (b *Builder) endedBuildHolds(ctx context.Context, msg jetstream.Msg, image string) bool {
	builds, err := b.img.Builds.Filtered(kv.BuildKeys(image)).List(ctx)
	if err != nil {
		return false
	}
	for _, e := range builds {
		if e.Value.State == kv.ImageBuilding {
			return false
		}
	}
	nakLater(msg)
	return true
}
