package consumers

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// cloudPass drains a removed provider's cloud: its uploads, its leaked
// instances and images, the driver's leftovers; and forgets the provider
// once nothing of it is left.
func (t *drainTerm) cloudPass(ctx, deleteCtx context.Context, provider string, suspects map[string]int) {
	l := t.l
	rec, err := t.record(ctx, provider)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("could not read or write the record of a removed provider", "provider", provider, "err", err)
		}
		return
	}
	// A builder that still names the provider (not reloaded yet) keeps
	// its uploads and images: its own retention deletes them once it
	// drops the provider, and the drain then finds what is left.
	builderHas := l.builderProviders()[provider]
	if len(rec.Value.Section) == 0 {
		// Nothing can ever make its driver: its records go, and what they
		// name is left in the cloud, said in the log.
		t.abandon(ctx, provider, builderHas)
		return
	}
	drv, err := t.d.ensureDriver(ctx, &rec.Value)
	if err != nil {
		t.problem(ctx, provider, err.Error(), false)
		return
	}
	done, ok := drivers.Use(drv)
	if !ok {
		return // made again meanwhile: the next pass uses the new one
	}
	defer done()
	var errs []error
	uploadsLeft, imagesLeft := 0, 0
	if !builderHas {
		uploadsLeft, err = t.uploads(ctx, provider, drv)
		errs = append(errs, err)
		imagesLeft, err = t.images(ctx, provider, drv, suspects)
		errs = append(errs, err)
	}
	instancesLeft, err := t.instances(ctx, deleteCtx, provider, drv, suspects)
	errs = append(errs, err)
	if sw, ok := drivers.As[drivers.Sweeper](drv); ok {
		errs = append(errs, sw.Sweep(ctx, l.nodes.Has))
	}
	held := 0
	if dr, ok := drivers.As[drivers.Drainer](drv); ok {
		held, err = dr.Drain(ctx)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() == nil || deleteCtx.Err() == nil {
			t.problem(ctx, provider, err.Error(), false)
		}
		return
	}
	t.noProblem(ctx, provider)
	nodesLeft := t.nodesOf(provider)
	if nodesLeft == 0 && uploadsLeft == 0 && imagesLeft == 0 && instancesLeft == 0 && held == 0 && !builderHas {
		t.forget(ctx, provider, "nothing of it is left in the buckets or the cloud")
		return
	}
	l.log.Debug("draining a removed provider", "provider", provider, "nodes", nodesLeft, "uploads", uploadsLeft,
		"images", imagesLeft, "instances", instancesLeft, "held", held)
}

// record returns a removed provider's record, written (once) to say that
// it drains; a provider no launcher ever recorded gets one without a
// section.
func (t *drainTerm) record(ctx context.Context, provider string) (kv.Entry[kv.ProviderRecord], error) {
	if t.d.records == nil {
		return kv.Entry[kv.ProviderRecord]{Value: kv.ProviderRecord{Name: provider}}, nil
	}
	key := kv.ProviderKey(provider)
	if e, ok := t.d.records.Get(key); ok && e.Value.DrainingSince != nil {
		return e, nil
	}
	now := t.l.clock.Now().UTC()
	e, err := t.d.records.Modify(ctx, key, func(cur *kv.ProviderRecord) error {
		if cur.DrainingSince != nil {
			return kv.ErrSkip
		}
		cur.DrainingSince = &now
		return nil
	})
	switch {
	case err == nil:
		t.l.log.Info("draining a removed provider: no live launcher has it in its configuration; deleting what is left of it", "provider", provider)
		return e, nil
	case errors.Is(err, kv.ErrSkip):
		return e, nil
	case !errors.Is(err, kv.ErrNotFound):
		return e, err
	}
	rec := kv.ProviderRecord{Name: provider, DrainingSince: &now}
	e, err = t.d.records.Create(ctx, key, &rec)
	if errors.Is(err, kv.ErrExists) {
		return t.l.b.Providers.Get(ctx, key)
	}
	if err == nil {
		t.l.log.Warn("draining a removed provider whose configuration no launcher recorded", "provider", provider)
	}
	return e, err
}

// uploads deletes a removed provider's uploads: each one's image from
// the cloud (and whatever its attempts left, tagged with its key), then
// its record. It returns how many records are left.
func (t *drainTerm) uploads(ctx context.Context, provider string, drv drivers.Provider) (int, error) {
	l := t.l
	var uploads []kv.Entry[kv.ImageUpload]
	l.images.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if e.Value.Provider == provider {
			uploads = append(uploads, *e)
		}
		return true
	})
	if len(uploads) == 0 {
		return 0, nil
	}
	ip, images := drivers.As[drivers.ImageProvider](drv)
	var errs []error
	left := 0
	for _, e := range uploads {
		u := &e.Value
		if u.State == kv.ImageUploading && l.alive(u.Uploader) {
			left++ // an upload in flight in a builder that has the provider still
			continue
		}
		if images && u.ExternalID != "" {
			if err := ip.DeleteImage(ctx, u.ExternalID); err != nil && !errors.Is(err, drivers.ErrNotFound) {
				errs = append(errs, err)
				left++
				continue
			}
			l.log.Info("deleted the image of an upload of a removed provider", "provider", provider, "upload", e.Key, "external_id", u.ExternalID)
		}
		err := l.images.uploads.Delete(ctx, e.Key, e.Revision)
		switch {
		case err == nil, errors.Is(err, kv.ErrNotFound):
			l.log.Info("deleted the record of an upload of a removed provider", "provider", provider, "upload", e.Key)
		case errors.Is(err, kv.ErrConflict):
			left++ // changed meanwhile: the next pass looks again
		default:
			errs = append(errs, err)
			left++
		}
	}
	return left, errors.Join(errs...)
}

// images deletes the images tagged as the removed provider's (an
// upload's leftovers, or ones no record ever named), each on its second
// sighting. It returns how many it saw.
func (t *drainTerm) images(ctx context.Context, provider string, drv drivers.Provider, suspects map[string]int) (int, error) {
	ip, ok := drivers.As[drivers.ImageProvider](drv)
	if !ok {
		return 0, nil
	}
	imgs, err := ip.ListImages(ctx)
	if err != nil {
		return 0, err
	}
	// The images of uploads still recorded go with their uploads (an
	// upload in flight in a live builder is left to it).
	recorded := map[string]bool{}
	t.l.images.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if e.Value.Provider == provider {
			recorded[e.Key] = true
			if e.Value.ExternalID != "" {
				recorded[e.Value.ExternalID] = true
			}
		}
		return true
	})
	var errs []error
	seen := map[string]bool{}
	n := 0
	for _, img := range imgs {
		if img.Tags[drivers.TagProvider] != provider {
			continue
		}
		n++
		if recorded[img.ExternalID] || (img.Tags[drivers.TagUpload] != "" && recorded[img.Tags[drivers.TagUpload]]) {
			continue
		}
		key := "image " + img.ExternalID
		seen[key] = true
		suspects[key]++
		if suspects[key] < 2 {
			continue
		}
		if err := ip.DeleteImage(ctx, img.ExternalID); err != nil && !errors.Is(err, drivers.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		t.l.log.Info("deleted an image of a removed provider", "provider", provider, "external_id", img.ExternalID, "name", img.Name)
		t.l.metrics.LeakedDeleted(provider, "images", 1)
		delete(suspects, key)
	}
	forgetUnseen(suspects, "image ", seen)
	return n, errors.Join(errs...)
}

// instances deletes the removed provider's instances that no node
// record accounts for (as the leak sweep does, on their second sighting;
// those of its nodes go with their nodes). It returns how many instances
// tagged as the provider's it saw.
func (t *drainTerm) instances(ctx, deleteCtx context.Context, provider string, drv drivers.Provider, suspects map[string]int) (int, error) {
	c, l := t.c, t.l
	insts, err := drv.ListInstances(ctx)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	n := 0
	for _, inst := range insts {
		if inst.Tags[drivers.TagProvider] != provider {
			continue
		}
		n++
		if !c.leaked(&inst) {
			continue
		}
		key := "instance " + inst.ExternalID
		seen[key] = true
		suspects[key]++
		if suspects[key] < 2 {
			continue
		}
		if !c.confirmLeaked(ctx, &inst) {
			delete(suspects, key)
			continue
		}
		busy := provider + "/" + inst.ExternalID
		if _, running := c.deleting.LoadOrStore(busy, true); running {
			continue
		}
		l.log.Info("deleting an instance of a removed provider", "provider", provider, "external_id", inst.ExternalID, "node", inst.NodeID())
		t.wg.Go(func() {
			defer c.deleting.Delete(busy)
			done, ok := drivers.Use(drv)
			if !ok {
				return // made again meanwhile; the next pass sees it again
			}
			defer done()
			if l.lifecycle.deleteInstance(deleteCtx, drv, inst.ExternalID, nil) {
				l.metrics.LeakedDeleted(provider, "instances", 1)
			}
		})
	}
	forgetUnseen(suspects, "instance ", seen)
	return n, nil
}

// forgetUnseen drops the suspects of a kind not seen in this pass.
func forgetUnseen(suspects map[string]int, kind string, seen map[string]bool) {
	for key := range suspects {
		if strings.HasPrefix(key, kind) && !seen[key] {
			delete(suspects, key)
		}
	}
}

// nodesOf counts a provider's node records.
func (t *drainTerm) nodesOf(provider string) int {
	n := 0
	t.l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Provider == provider {
			n++
		}
		return true
	})
	return n
}

// abandon removes the records of a removed provider whose section no
// launcher ever recorded (a provider removed in the same change that
// brought this version in): its driver can never be made, so nothing
// could delete its instances or images, and its records would only stay
// for ever. Each record removed is logged with what it names in the
// cloud (left there: the provider's leak sweep deletes it if the
// provider is ever configured again). Nodes in use or held go once given
// back or their hold ends; the ready ones have been moved to deleting by
// the records' pass; uploads a live builder has are left to it. The
// provider is forgotten once nothing of it is left in the buckets.
func (t *drainTerm) abandon(ctx context.Context, provider string, builderHas bool) {
	l := t.l
	t.problem(ctx, provider, "no launcher recorded its configuration section, so its driver cannot be made: its records are removed as they are freed, and what they name is left in the cloud", true)
	var nodes []kv.Entry[kv.Node]
	l.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Provider == provider {
			nodes = append(nodes, *e)
		}
		return true
	})
	for _, e := range nodes {
		switch e.Value.State {
		case kv.NodeInUse, kv.NodeHold, kv.NodeReady, kv.NodeBuilding, kv.NodeInit:
			continue
		}
		err := l.nodes.Delete(ctx, e.Key, e.Revision)
		switch {
		case err == nil, errors.Is(err, kv.ErrNotFound):
			l.log.Warn("removed the record of a node of a removed provider that nothing can delete; its instance, if any, is left in the cloud",
				"node", e.Key, "provider", provider, "state", e.Value.State, "external_id", e.Value.ExternalID, "hostname", e.Value.Hostname)
		case !errors.Is(err, kv.ErrConflict) && ctx.Err() == nil:
			l.log.Warn("could not remove the record of a node of a removed provider", "node", e.Key, "err", err)
		}
	}
	if !builderHas {
		var uploads []kv.Entry[kv.ImageUpload]
		l.images.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
			if e.Value.Provider == provider && (e.Value.State != kv.ImageUploading || !l.alive(e.Value.Uploader)) {
				uploads = append(uploads, *e)
			}
			return true
		})
		for _, e := range uploads {
			err := l.images.uploads.Delete(ctx, e.Key, e.Revision)
			switch {
			case err == nil, errors.Is(err, kv.ErrNotFound):
				l.log.Warn("removed the record of an upload of a removed provider that nothing can delete; its image, if any, is left in the cloud",
					"upload", e.Key, "provider", provider, "external_id", e.Value.ExternalID)
			case !errors.Is(err, kv.ErrConflict) && ctx.Err() == nil:
				l.log.Warn("could not remove the record of an upload of a removed provider", "upload", e.Key, "err", err)
			}
		}
	}
	if !builderHas && t.nothingLeftInRecords(provider) {
		t.forget(ctx, provider, "its records are gone; nothing of it could be looked for in the cloud")
	}
}

// nothingLeftInRecords reports whether the buckets hold no node and no
// upload of a provider.
func (t *drainTerm) nothingLeftInRecords(provider string) bool {
	if t.nodesOf(provider) > 0 {
		return false
	}
	left := false
	t.l.images.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		left = e.Value.Provider == provider
		return !left
	})
	return !left
}

// forget deletes a drained provider's record (at the revision read: a
// launcher that has it again meanwhile keeps its section) and closes its
// driver.
func (t *drainTerm) forget(ctx context.Context, provider, why string) {
	l := t.l
	if t.d.records != nil {
		key := kv.ProviderKey(provider)
		e, ok := t.d.records.Get(key)
		if ok {
			if err := t.d.records.Delete(ctx, key, e.Revision); err != nil && !errors.Is(err, kv.ErrNotFound) {
				if !errors.Is(err, kv.ErrConflict) && ctx.Err() == nil {
					l.log.Warn("could not forget a drained provider's configuration", "provider", provider, "err", err)
				}
				return
			}
		}
	}
	t.mu.Lock()
	delete(t.providers, provider)
	delete(t.problems, provider)
	delete(t.suspects, provider)
	t.countLocked()
	t.mu.Unlock()
	t.d.retire(provider)
	l.log.Info("provider drained; its remembered configuration is forgotten", "provider", provider, "why", why)
}

// problem records why a provider's drain cannot go on: logged when it
// starts and every problemLogEvery while it lasts, written in the
// provider's record when it starts (and, if it changed, at most every
// problemLogEvery), counted in the gauges.
//
// abandoned: nothing can ever drain the provider in the cloud (its
// records are removed instead); said so in the log.
func (t *drainTerm) problem(ctx context.Context, provider, text string, abandoned bool) {
	text = firstLine(text)
	since, started, logIt := t.noteProblem(provider, text, t.l.clock.Now())
	if logIt {
		t.l.log.Warn(problemWords(started, abandoned), "provider", provider, "problem", text, "since", since.UTC().Format(time.RFC3339))
	}
	t.recordProblem(ctx, provider, text, since, logIt)
}

// noteProblem remembers a provider's problem and tells since when it
// lasts, whether it started now and whether it is time to log it.
func (t *drainTerm) noteProblem(provider, text string, now time.Time) (since time.Time, started, logIt bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.problems[provider]
	started = p == nil
	if started {
		p = &drainProblem{since: now}
		t.problems[provider] = p
	}
	logIt = started || now.Sub(p.logged) >= problemLogEvery
	if logIt {
		p.logged = now
	}
	p.text = text
	t.countLocked()
	return p.since, started, logIt
}

// problemWords is what the log says of a drain's problem.
func problemWords(started, abandoned bool) string {
	switch {
	case abandoned && started:
		return "cannot drain a removed provider in the cloud; removing its records as they are freed"
	case abandoned:
		return "still removing the records of a removed provider that cannot be drained in the cloud"
	case !started:
		return "still cannot drain a removed provider"
	}
	return "cannot drain a removed provider; its drain waits (`nodepool erase` gives it up)"
}

// recordProblem writes a drain's problem in the provider's record when it
// starts, and when it changed, at most every problemLogEvery (due).
func (t *drainTerm) recordProblem(ctx context.Context, provider, text string, since time.Time, due bool) {
	if t.d.records == nil {
		return
	}
	e, ok := t.d.records.Get(kv.ProviderKey(provider))
	if !ok || e.Value.Problem == text || (e.Value.Problem != "" && !due) {
		return
	}
	_, err := t.d.records.Modify(ctx, kv.ProviderKey(provider), func(cur *kv.ProviderRecord) error {
		if cur.Problem == text {
			return kv.ErrSkip
		}
		if cur.Problem == "" || cur.ProblemSince == nil {
			at := since.UTC()
			cur.ProblemSince = &at
		}
		cur.Problem = text
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		t.l.log.Debug("could not record why a provider's drain cannot go on", "provider", provider, "err", err)
	}
}

// noProblem clears a provider's problem: its drain goes on.
func (t *drainTerm) noProblem(ctx context.Context, provider string) {
	t.mu.Lock()
	p := t.problems[provider]
	delete(t.problems, provider)
	t.countLocked()
	t.mu.Unlock()
	if p != nil {
		t.l.log.Info("the drain of a removed provider goes on again", "provider", provider)
	}
	if t.d.records == nil {
		return
	}
	if e, ok := t.d.records.Get(kv.ProviderKey(provider)); !ok || e.Value.Problem == "" {
		return
	}
	_, err := t.d.records.Modify(ctx, kv.ProviderKey(provider), func(cur *kv.ProviderRecord) error {
		if cur.Problem == "" {
			return kv.ErrSkip
		}
		cur.Problem, cur.ProblemSince = "", nil
		return nil
	})
	if err != nil && !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound) && ctx.Err() == nil {
		t.l.log.Debug("could not clear a provider's drain problem", "provider", provider, "err", err)
	}
}

// firstLine is the first line of a text, at most 500 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return s
}
