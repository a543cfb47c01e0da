package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// scheduler is the builder's coordinator, run by the holder of the
// image-scheduler lease. Like the launcher's schedulers it is level
// triggered: each pass looks at the records as they are and publishes the
// triggers that are due (a build when an image has no ready build, when its
// newest is older than rebuild-age or lacks a format a provider takes; an
// upload when a provider lacks the newest build), so a new leader simply
// carries on. On its periodic tick it also fails builds and uploads whose
// owner went away, and looks for leaked images in the providers.
// Retention marks old builds and uploads deleting; deletions run here too.
type scheduler struct {
	b *Builder

	// State of one term as leader.
	published  map[string]time.Time // trigger message ids published
	suspects   map[string]int       // leaked images seen, by provider/external id
	chunks     map[string]uint64    // object chunk subjects not referenced, with their counts
	lastChunks time.Time
	busy       sync.Map // deletions in flight
	wg         sync.WaitGroup
}

func newScheduler(b *Builder) *scheduler { return &scheduler{b: b} }

// settling is how long the image scheduler still waits, after the images
// bucket was made again, for every cache of it to hold the new bucket: two
// sync intervals (at least 3 s, each cache noticing within a second)
// after the last of them started afresh. Zero when none did lately.
func (b *Builder) settling() time.Duration {
	var last time.Time
	for _, t := range []time.Time{b.images.Restarted(), b.builds.Restarted(), b.uploads.Restarted()} {
		if t.After(last) {
			last = t
		}
	}
	if last.IsZero() {
		return 0
	}
	return time.Until(last.Add(max(2*b.opts.SyncInterval, 3*time.Second)))
}

func (s *scheduler) run(ctx context.Context) {
	b := s.b
	b.log.Info("leading the image scheduler")
	defer b.log.Info("no longer leading the image scheduler")
	s.published, s.suspects, s.chunks = map[string]time.Time{}, map[string]int{}, map[string]uint64{}
	s.lastChunks = time.Now()
	bs, us, is := b.builds.Subscribe(), b.uploads.Subscribe(), b.images.Subscribe()
	defer b.builds.Unsubscribe(bs)
	defer b.uploads.Unsubscribe(us)
	defer b.images.Unsubscribe(is)
	defer s.wg.Wait()
	tick := time.NewTicker(b.opts.SyncInterval)
	defer tick.Stop()
	sweep := true
	for {
		bs.Drain()
		us.Drain()
		is.Drain()
		if wait := b.settling(); wait > 0 {
			// The images bucket was deleted and made again a moment ago:
			// the caches of its images, builds and uploads start afresh
			// one after the other, and a pass over them now would take a
			// new upload whose build its cache has not read yet for an
			// orphan, and delete it. Decide once they all hold the new
			// bucket.
			b.log.Debug("the images bucket was made again; waiting for its caches before deciding", "for", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			sweep = true
			continue
		}
		if sweep {
			s.sweepOrphans(ctx)
		}
		builds, uploads := s.snapshot()
		s.scheduleBuilds(ctx, builds)
		s.scheduleUploads(ctx, builds, uploads)
		s.deleteAfterUpload(ctx, builds, uploads)
		s.retain(ctx, builds, uploads)
		s.deletions(ctx, builds, uploads)
		if sweep {
			s.leaks(ctx, uploads)
			s.orphanChunks(ctx)
		}
		sweep = false
		select {
		case <-ctx.Done():
			return
		case <-bs.C():
		case <-us.C():
		case <-is.C():
		case <-tick.C:
			sweep = true
		}
	}
}

// snapshot returns the builds by image, newest first, and every upload.
func (s *scheduler) snapshot() (map[string][]kv.ImageBuild, []kv.ImageUpload) {
	builds := map[string][]kv.ImageBuild{}
	s.b.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
		builds[e.Value.Image] = append(builds[e.Value.Image], e.Value)
		return true
	})
	for _, list := range builds {
		kv.SortBuildsNewestFirst(list)
	}
	var uploads []kv.ImageUpload
	s.b.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		uploads = append(uploads, e.Value)
		return true
	})
	newestFirst(uploads)
	return builds, uploads
}

// publish publishes a trigger unless this leader published it within the
// stream's duplicate window (where the server would drop it anyway).
func (s *scheduler) publish(key string, fn func() error) {
	if t, ok := s.published[key]; ok && time.Since(t) < events.DuplicateWindow {
		return
	}
	if err := fn(); err != nil {
		s.b.log.Warn("could not publish a trigger; trying again on the next pass", "trigger", key, "err", err)
		return
	}
	s.published[key] = time.Now()
	for k, t := range s.published {
		if time.Since(t) > events.DuplicateWindow {
			delete(s.published, k)
		}
	}
}

// scheduleBuilds publishes the build triggers that are due.
func (s *scheduler) scheduleBuilds(ctx context.Context, builds map[string][]kv.ImageBuild) {
	b := s.b
	now := time.Now()
	for _, name := range b.config().DiskimageNames() {
		di, _ := b.config().Diskimage(name)
		formats := b.formats(di)
		if b.paused(di) || len(formats) == 0 {
			continue
		}
		var newest, newestReady *kv.ImageBuild
		failures, building := 0, false
		list := builds[name]
		for i := range list {
			bl := &list[i]
			switch bl.State {
			case kv.ImageBuilding:
				building = true
				continue
			case kv.ImageDeleting:
				continue
			}
			if newest == nil {
				newest = bl
			}
			if bl.State == kv.ImageReady && newestReady == nil {
				newestReady = bl
			}
			if newestReady == nil && bl.State == kv.ImageFailed && !bl.Interrupted {
				failures++
			}
		}
		if building {
			continue
		}
		detail := ""
		switch {
		case newestReady == nil:
			detail = "no ready build"
		case now.Sub(newestReady.StateTime) > di.RebuildAge.D():
			detail = fmt.Sprintf("build %s is older than rebuild-age %s", newestReady.ID, di.RebuildAge.D())
		default:
			for _, f := range formats {
				if _, ok := newestReady.Files[f]; !ok {
					detail = fmt.Sprintf("build %s has no %s file, which a provider takes", newestReady.ID, f)
					break
				}
			}
		}
		if detail == "" {
			continue
		}
		if newest != nil && newest.State == kv.ImageFailed && !newest.Interrupted && now.Before(newest.StateTime.Add(b.backoff(failures))) {
			continue // back off after failed builds
		}
		after := "none"
		if newest != nil {
			after = newest.ID
		}
		s.publish("build/"+name+"/"+after, func() error {
			b.log.Info("scheduling a build", "image", name, "why", detail)
			return events.PublishBuild(ctx, b.js, name, events.BuildMessage{Reason: events.ReasonScheduled, Detail: detail},
				"sched-build-"+name+"-"+after)
		})
	}
}

// scheduleUploads publishes the upload triggers that are due: a provider
// that lacks the newest ready build it can take, or whose failed upload of
// it is due for another try.
func (s *scheduler) scheduleUploads(ctx context.Context, builds map[string][]kv.ImageBuild, uploads []kv.ImageUpload) {
	b := s.b
	now := time.Now()
	for _, name := range b.config().DiskimageNames() {
		entries := make([]kv.Entry[kv.ImageBuild], 0, len(builds[name]))
		for _, bl := range builds[name] {
			entries = append(entries, kv.Entry[kv.ImageBuild]{Value: bl})
		}
		for _, p := range b.config().ImageProviders(name) {
			drv, ok := b.imageProvider(p.Name)
			if pd, _ := p.Diskimage(name); !ok || pd.Pause {
				continue
			}
			target, ok := uploadTarget(entries, drv.ImageFormat())
			if !ok {
				continue
			}
			deleted := target.Files[drv.ImageFormat()].Deleted
			var last *kv.ImageUpload
			for i := range uploads {
				u := &uploads[i]
				if u.Image == name && u.BuildID == target.ID && u.Provider == p.Name {
					last = u // newest first: the first one is the newest
					break
				}
			}
			attempt := 0
			switch {
			case deleted:
				continue // the file went after its uploads; a rebuild brings a new one
			case last == nil:
			case last.State == kv.ImageFailed && !now.Before(b.uploadRetryAt(last)):
				attempt = last.Attempt
			default:
				continue
			}
			provider := p.Name
			s.publish(uploadMsgID(name, target.ID, provider, attempt), func() error {
				return events.PublishUpload(ctx, b.js, name, provider,
					events.UploadMessage{Reason: events.ReasonScheduled, Detail: "build " + target.ID + " is not uploaded"},
					uploadMsgID(name, target.ID, provider, attempt))
			})
		}
	}
}

// sweepOrphans fails the builds and uploads whose owner went away.
func (s *scheduler) sweepOrphans(ctx context.Context) {
	b := s.b
	var builds, uploads []string
	b.builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool {
		if e.Value.State == kv.ImageBuilding {
			builds = append(builds, e.Key)
		}
		return true
	})
	b.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if e.Value.State == kv.ImageUploading {
			uploads = append(uploads, e.Key)
		}
		return true
	})
	for _, k := range builds {
		if e, ok := b.builds.Get(k); ok && !b.ownsBuild(ctx, &e.Value) {
			b.failOrphanBuild(ctx, k)
		}
	}
	for _, k := range uploads {
		if e, ok := b.uploads.Get(k); ok && !b.ownsUpload(ctx, &e.Value) {
			b.failOrphanUpload(ctx, k)
		}
	}
}

// retain marks deleting what retention does not keep: beyond the
// KeepBuilds newest ready builds of an image, failed builds older than the
// newest ready one, every build of an image no longer configured; beyond
// the KeepUploads newest ready uploads of an image to a provider, uploads
// of builds that go, uploads to providers that no longer list the image.
func (s *scheduler) retain(ctx context.Context, builds map[string][]kv.ImageBuild, uploads []kv.ImageUpload) {
	b := s.b
	buildState := map[string]kv.ImageState{}
	newestReady := map[string]string{}
	for image, list := range builds {
		di, ok := b.config().Diskimage(image)
		configured := ok && !di.Abstract
		ready, failed := 0, 0
		for _, bl := range list {
			buildState[bl.Key()] = bl.State
			keep := false
			switch bl.State {
			case kv.ImageBuilding, kv.ImageDeleting:
				continue
			case kv.ImageReady:
				keep = configured && ready < KeepBuilds
				if keep && ready == 0 {
					newestReady[image] = bl.ID
				}
				if keep {
					ready++
				}
			case kv.ImageFailed:
				keep = configured && ready == 0 && failed < keepFailed
				if keep {
					failed++
				}
			}
			if !keep {
				s.markBuildDeleting(ctx, bl)
				buildState[bl.Key()] = kv.ImageDeleting
			}
		}
	}
	kept := map[string]int{}
	for _, u := range uploads { // newest first
		if u.State == kv.ImageDeleting {
			continue
		}
		group := u.Image + "/" + u.Provider
		state, buildExists := buildState[kv.BuildKey(u.Image, u.BuildID)]
		buildGoes := !buildExists || state == kv.ImageDeleting
		listed := false
		if p, ok := b.config().Provider(u.Provider); ok {
			if _, ok := p.Diskimage(u.Image); ok {
				di, _ := b.config().Diskimage(u.Image)
				listed = di != nil && !di.Abstract
			}
		}
		keep := false
		switch u.State {
		case kv.ImageUploading, kv.ImageDeleted:
			keep = listed && !buildGoes
		case kv.ImageReady:
			keep = listed && !buildGoes && kept[group] < KeepUploads
			if keep {
				kept[group]++
			}
		case kv.ImageFailed:
			keep = listed && !buildGoes && u.BuildID >= newestReady[u.Image]
		}
		if !keep {
			s.markUploadDeleting(ctx, u)
		}
	}
}

func (s *scheduler) markBuildDeleting(ctx context.Context, bl kv.ImageBuild) {
	_, err := s.b.builds.Modify(ctx, bl.Key(), func(cur *kv.ImageBuild) error {
		if cur.State != bl.State || cur.State == kv.ImageBuilding || cur.State == kv.ImageDeleting {
			return kv.ErrSkip
		}
		s.b.log.Info("deleting a build (retention)", "image", cur.Image, "build", cur.ID, "state", cur.State)
		cur.SetState(kv.ImageDeleting, time.Now().UTC())
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.b.log.Warn("could not mark a build deleting", "build", bl.Key(), "err", err)
	}
}

func (s *scheduler) markUploadDeleting(ctx context.Context, u kv.ImageUpload) {
	_, err := s.b.uploads.Modify(ctx, u.Key(), func(cur *kv.ImageUpload) error {
		if cur.State != u.State || cur.State == kv.ImageDeleting {
			return kv.ErrSkip
		}
		s.b.log.Info("deleting an upload (retention)", "upload", u.Key(), "state", cur.State)
		cur.SetState(kv.ImageDeleting, time.Now().UTC())
		if u.State == kv.ImageDeleted {
			cur.OperatorDelete = false // its build goes: nothing left to remember
		}
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		s.b.log.Warn("could not mark an upload deleting", "upload", u.Key(), "err", err)
	}
}

// deletions runs the deletions marked: each upload is deleted from its
// provider, then its record; a build's files and record go once none of
// its uploads is left.
func (s *scheduler) deletions(ctx context.Context, builds map[string][]kv.ImageBuild, uploads []kv.ImageUpload) {
	remaining := map[string]int{}
	for _, u := range uploads {
		remaining[kv.BuildKey(u.Image, u.BuildID)]++
		if u.State == kv.ImageDeleting {
			s.spawn(ctx, "upload/"+u.Key(), func(ctx context.Context) { s.deleteUpload(ctx, u) })
		}
	}
	for _, list := range builds {
		for _, bl := range list {
			if bl.State == kv.ImageDeleting && remaining[bl.Key()] == 0 {
				s.spawn(ctx, "build/"+bl.Key(), func(ctx context.Context) { s.deleteBuild(ctx, bl) })
			}
		}
	}
}

func (s *scheduler) spawn(ctx context.Context, key string, fn func(context.Context)) {
	if _, busy := s.busy.LoadOrStore(key, true); busy {
		return
	}
	s.wg.Go(func() {
		defer s.busy.Delete(key)
		fn(ctx)
	})
}

// deleteUpload deletes an upload's image (and whatever its attempts left)
// from the provider, then the record; an upload an operator deleted stays
// as a deleted record while its build lives.
func (s *scheduler) deleteUpload(ctx context.Context, u kv.ImageUpload) {
	b := s.b
	key := u.Key()
	_, configured := b.config().Provider(u.Provider)
	if drv, ok := b.imageProvider(u.Provider); ok && configured {
		if u.ExternalID != "" {
			if err := drv.DeleteImage(ctx, u.ExternalID); err != nil {
				if ctx.Err() == nil {
					b.log.Warn("could not delete an image from its provider; trying again later", "upload", key, "external_id", u.ExternalID, "err", err)
				}
				return
			}
		}
		if err := deleteTagged(ctx, drv, key, ""); err != nil {
			if ctx.Err() == nil {
				b.log.Warn("could not delete the images of an upload; trying again later", "upload", key, "err", err)
			}
			return
		}
	} else {
		b.log.Warn("the provider is not configured (or takes no images): its image cannot be deleted; forgetting the upload",
			"upload", key, "external_id", u.ExternalID)
	}
	e, err := b.img.Uploads.Get(ctx, key)
	if err != nil || e.Value.State != kv.ImageDeleting {
		return
	}
	bl, berr := b.img.Builds.Get(ctx, kv.BuildKey(u.Image, u.BuildID))
	if e.Value.OperatorDelete && berr == nil && bl.Value.State != kv.ImageDeleting {
		e.Value.SetState(kv.ImageDeleted, time.Now().UTC())
		if _, err := b.uploads.Update(ctx, key, &e.Value, e.Revision); err == nil {
			b.log.Info("upload deleted by an operator; its build will not be uploaded to this provider again", "upload", key)
			b.metrics.Deleted("upload")
		}
		return
	}
	if err := b.img.Uploads.Delete(ctx, key, e.Revision); err == nil {
		b.log.Info("upload deleted", "upload", key, "external_id", u.ExternalID)
		b.metrics.Deleted("upload")
	}
}

// deleteBuild deletes a build's files and then its record.
func (s *scheduler) deleteBuild(ctx context.Context, bl kv.ImageBuild) {
	b := s.b
	if err := b.deleteFiles(ctx, bl.Image, bl.ID); err != nil {
		if ctx.Err() == nil {
			b.log.Warn("could not delete a build's files; trying again later", "build", bl.Key(), "err", err)
		}
		return
	}
	_ = os.RemoveAll(b.buildDir(bl.Image, bl.ID))
	e, err := b.img.Builds.Get(ctx, bl.Key())
	if err != nil || e.Value.State != kv.ImageDeleting {
		return
	}
	if err := b.img.Builds.Delete(ctx, bl.Key(), e.Revision); err == nil {
		b.log.Info("build deleted", "image", bl.Image, "build", bl.ID)
		b.metrics.Deleted("build")
	}
}

// leaks deletes images tagged as ours that no upload accounts for, on
// their second sighting in a row.
func (s *scheduler) leaks(ctx context.Context, uploads []kv.ImageUpload) {
	b := s.b
	seen := map[string]bool{}
	for _, p := range b.config().Providers {
		drv, ok := b.imageProvider(p.Name)
		if !ok {
			continue
		}
		aliens, err := AlienImages(ctx, p.Name, drv, uploads)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("could not list images", "provider", p.Name, "err", err)
			}
			continue
		}
		for _, img := range aliens {
			key := p.Name + "/" + img.ExternalID
			seen[key] = true
			s.suspects[key]++
			if s.suspects[key] < 2 {
				continue
			}
			if err := drv.DeleteImage(ctx, img.ExternalID); err != nil {
				b.log.Warn("could not delete a leaked image", "provider", p.Name, "external_id", img.ExternalID, "err", err)
				continue
			}
			b.log.Info("deleted a leaked image", "provider", p.Name, "external_id", img.ExternalID, "name", img.Name, "upload", img.Tags[drivers.TagUpload])
			b.metrics.LeakedDeleted(p.Name, "images", 1)
			delete(s.suspects, key)
		}
	}
	for key := range s.suspects {
		if !seen[key] {
			delete(s.suspects, key)
		}
	}
}

// AlienImages lists a provider's images that are tagged as ours (uploaded
// by nodepool for this provider) but that no upload record accounts for:
// leaked by a crash, or left by a failed attempt.
func AlienImages(ctx context.Context, provider string, drv drivers.ImageProvider, uploads []kv.ImageUpload) ([]drivers.Image, error) {
	byKey := map[string]kv.ImageUpload{}
	for _, u := range uploads {
		byKey[u.Key()] = u
	}
	imgs, err := drv.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	var out []drivers.Image
	for _, img := range imgs {
		if img.Tags[drivers.TagProvider] != provider {
			continue // not ours
		}
		if u, ok := byKey[img.Tags[drivers.TagUpload]]; ok && (u.ExternalID == img.ExternalID || u.State == kv.ImageUploading) {
			continue
		}
		out = append(out, img)
	}
	return out, nil
}

// orphanChunks purges chunks of image files that no object names: what a
// builder killed in the middle of storing a file leaves. A chunk subject is
// purged when it is unreferenced and did not grow over a whole period of
// ten sweeps, so a file being stored is never touched.
func (s *scheduler) orphanChunks(ctx context.Context) {
	b := s.b
	if b.files == nil || time.Since(s.lastChunks) < 10*b.opts.SyncInterval {
		return
	}
	s.lastChunks = time.Now()
	stream, err := b.js.Stream(ctx, "OBJ_"+FilesBucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			b.b.ReportMissing("OBJ_" + FilesBucket)
		}
		return
	}
	prefix := "$O." + FilesBucket + ".C."
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return
	}
	objects, err := b.files.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return
	}
	used := map[string]bool{}
	for _, o := range objects {
		if !o.Deleted {
			used[o.NUID] = true
		}
	}
	next := map[string]uint64{}
	for subject, count := range info.State.Subjects {
		nuid := strings.TrimPrefix(subject, prefix)
		if used[nuid] {
			continue
		}
		if prev, ok := s.chunks[subject]; ok && prev == count {
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err == nil {
				b.log.Info("purged the chunks of an image file nobody finished storing", "subject", subject, "chunks", count)
			}
			continue
		}
		next[subject] = count
	}
	s.chunks = next
}
