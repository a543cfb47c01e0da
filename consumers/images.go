package consumers

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// imageIndex is the launcher's view of the image uploads. A pool label
// with a diskimage boots from the newest ready upload of that image to the
// pool's provider, and a request for it waits (is neither declined nor
// failed) until such an upload exists. It is nil when no pool label names
// a diskimage.
type imageIndex struct {
	uploads *kv.Cache[kv.ImageUpload]
}

func newImageIndex(b *kv.Buckets, views *kv.Views, log *slog.Logger) *imageIndex {
	// Always kept: a reload may add labels with diskimages.
	return &imageIndex{uploads: views.Images(b, log).Uploads}
}

// caches are the watch caches to run with the launcher's.
func (ix *imageIndex) caches() []interface {
	Start() func()
	WaitSynced(context.Context) error
} {
	if ix == nil {
		return nil
	}
	return []interface {
		Start() func()
		WaitSynced(context.Context) error
	}{ix.uploads}
}

// newest returns the newest ready upload of an image to a provider.
func (ix *imageIndex) newest(image, provider string) (kv.ImageUpload, bool) {
	if ix == nil {
		return kv.ImageUpload{}, false
	}
	var uploads []kv.ImageUpload
	ix.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
		if e.Value.Image == image && e.Value.Provider == provider && e.Value.State == kv.ImageReady {
			uploads = append(uploads, e.Value)
		}
		return true
	})
	return kv.NewestReadyUpload(uploads, image, provider)
}

// upload returns the ready upload of an image to a provider whose cloud
// image is externalID, or else the newest one.
func (ix *imageIndex) upload(image, provider, externalID string) (kv.ImageUpload, bool) {
	if ix == nil {
		return kv.ImageUpload{}, false
	}
	var found *kv.ImageUpload
	if externalID != "" {
		ix.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
			u := e.Value
			if u.Image == image && u.Provider == provider && u.ExternalID == externalID {
				found = &u
				return false
			}
			return true
		})
	}
	if found != nil {
		return *found, true
	}
	return ix.newest(image, provider)
}

// imageWatch signals changes of the uploads (nil-safe).
type imageWatch struct {
	ix  *imageIndex
	sub *kv.Subscription[kv.ImageUpload]
}

func (ix *imageIndex) watch() *imageWatch {
	if ix == nil {
		return nil
	}
	return &imageWatch{ix: ix, sub: ix.uploads.Subscribe()}
}

func (w *imageWatch) C() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.sub.C()
}

func (w *imageWatch) drain() {
	if w != nil {
		w.sub.Drain()
	}
}

func (w *imageWatch) stop() {
	if w != nil {
		w.ix.uploads.Unsubscribe(w.sub)
	}
}

// imagesReady reports whether every label of a request that boots from a
// diskimage in this pool has a ready upload to the pool's provider.
func (s *scheduler) imagesReady(r *kv.Request) bool {
	for _, label := range r.Labels {
		pl, ok := s.pool.Label(label)
		if !ok || pl.Diskimage == "" {
			continue
		}
		if _, ok := s.l.images.newest(pl.Diskimage, s.prov.Name); !ok {
			return false
		}
	}
	return true
}

// createRequest is what the lifecycle asks the driver to create for a
// node: for a label with a diskimage, the newest ready upload of it to the
// node's provider is the image to boot.
func (l *Launcher) createRequest(n *kv.Node) drivers.CreateRequest {
	req := createRequest(n)
	if e, ok := l.requests.Get(n.AllocatedTo); ok && n.AllocatedTo != "" {
		r := &e.Value
		req.Request = &drivers.RequestInfo{ID: r.ID, Labels: r.Labels, Requestor: r.Requestor,
			RequestorData: requestorData(r.RequestorData), RelativePriority: r.RelativePriority,
			EventID: r.EventID, Created: r.Created, Tenant: r.Tenant}
	}
	prov, ok := l.config().Provider(n.Provider)
	if !ok {
		return req
	}
	pool, ok := prov.Pool(n.Pool)
	if !ok {
		return req
	}
	if pl, ok := pool.Label(req.Label); ok && pl.Diskimage != "" {
		if u, ok := l.images.newest(pl.Diskimage, n.Provider); ok {
			req.ImageID = u.ExternalID
		}
	}
	return req
}

// requestorData reads a request's requestor_data as strings (non-string
// values in their JSON form); anything but a JSON object gives nothing.
func requestorData(raw json.RawMessage) map[string]string {
	var m map[string]any
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
			continue
		}
		data, _ := json.Marshal(v)
		out[k] = string(data)
	}
	return out
}
