package web

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/token"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/status"
)

// Views are the watch caches the web API answers from: the process's own
// where its roles keep them (a launcher watches nodes, requests and
// components; a builder the image records), and caches of the web API's
// own for the rest. They are a status.Source.
type Views struct {
	Nodes      *kv.Cache[kv.Node]
	Requests   *kv.Cache[kv.Request]
	Components *kv.Cache[kv.Component]
	Images     *kv.Cache[kv.DiskImage]
	Builds     *kv.Cache[kv.ImageBuild]
	Uploads    *kv.Cache[kv.ImageUpload]
	// History is the last hour of launches and requests, as the node and
	// request caches showed it (NewViews makes it).
	History *History
	// Providers are the remembered provider sections (nil without the
	// nodepool-providers bucket): which removed providers drain.
	Providers *kv.Cache[kv.ProviderRecord]

	js jetstream.JetStream
}

// NewViews completes shared (the caches the process keeps, any of them
// nil) with caches of its own over the buckets, and the dashboard's
// History; Run starts them all.
func NewViews(js jetstream.JetStream, b *kv.Buckets, shared Views, log *slog.Logger) *Views {
	v := NewTableViews(js, b, shared, log)
	v.History = NewHistory(nil)
	v.Nodes.Observe(v.History.ObserveNode)
	v.Requests.Observe(v.History.ObserveRequest)
	return v
}

// NewTableViews is NewViews without the History: what the tables served
// over NATS read (status.Serve), for a process without the status port.
// Handler needs NewViews.
func NewTableViews(js jetstream.JetStream, b *kv.Buckets, shared Views, log *slog.Logger) *Views {
	v := shared
	v.js = js
	own(&v.Nodes, b.Nodes, log)
	own(&v.Requests, b.Requests, log)
	own(&v.Components, b.Components, log)
	if v.Images == nil || v.Builds == nil || v.Uploads == nil {
		img := b.ImageCaches(log)
		v.Images, v.Builds, v.Uploads = img.Images, img.Builds, img.Uploads
	}
	if b.Providers != nil {
		own(&v.Providers, b.Providers, log)
	}
	return &v
}

// own makes a cache of the web API's own where the process has none.
func own[T any](c **kv.Cache[T], s *kv.Store[T], log *slog.Logger) {
	if *c == nil {
		*c = kv.NewCache(s, log)
	}
}

// Run keeps the caches up to date until ctx ends: it starts them all (a
// cache the process's roles started already keeps its one watch).
func (v *Views) Run(ctx context.Context) {
	var stops []func()
	for _, c := range []interface{ Start() func() }{v.Nodes, v.Requests, v.Components, v.Images, v.Builds, v.Uploads} {
		stops = append(stops, c.Start())
	}
	if v.Providers != nil {
		stops = append(stops, v.Providers.Start())
	}
	<-ctx.Done()
	for _, stop := range stops {
		stop()
	}
}

func values[T any](c *kv.Cache[T]) []T {
	out := make([]T, 0, c.Len())
	c.Range(func(e *kv.Entry[T]) bool {
		out = append(out, e.Value)
		return true
	})
	return out
}

// Source reads the tables' records from the caches, and brings them up
// to date with the buckets when asked (status.Serve does).
func (v *Views) Source() status.SyncedSource { return cacheSource{v} }

// WaitSynced waits until the caches of nodes, requests and components
// hold every record their buckets had when they started.
func (v *Views) WaitSynced(ctx context.Context) error {
	for _, c := range []interface{ WaitSynced(context.Context) error }{v.Nodes, v.Requests, v.Components} {
		if err := c.WaitSynced(ctx); err != nil {
			return err
		}
	}
	return nil
}

type syncer interface{ Sync(context.Context) error }

// Sync brings the caches a table is made of up to date with their
// buckets.
func (s cacheSource) Sync(ctx context.Context, table string) error {
	v := s.v
	var caches []syncer
	switch table {
	case "node-list":
		caches = []syncer{v.Nodes, v.Components}
	case "request-list":
		caches = []syncer{v.Requests}
	case "label-list":
		caches = []syncer{v.Components}
	default: // the image tables
		caches = []syncer{v.Images, v.Builds, v.Uploads}
	}
	for _, c := range caches {
		if err := c.Sync(ctx); err != nil {
			return err
		}
	}
	return nil
}

type cacheSource struct{ v *Views }

// Nodes points at the cached records (never changed in place: a change
// replaces the entry), instead of copying 100,000 of them for a table.
func (s cacheSource) Nodes(context.Context) ([]*kv.Node, error) {
	out := make([]*kv.Node, 0, s.v.Nodes.Len())
	s.v.Nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		out = append(out, &e.Value)
		return true
	})
	return out, nil
}

func (s cacheSource) Requests(context.Context) ([]kv.Request, error) {
	return values(s.v.Requests), nil
}

func (s cacheSource) Components(context.Context) ([]kv.Component, error) {
	return values(s.v.Components), nil
}

func (s cacheSource) DiskImages(context.Context) ([]kv.DiskImage, error) {
	out := make([]kv.DiskImage, 0, s.v.Images.Len())
	s.v.Images.Range(func(e *kv.Entry[kv.DiskImage]) bool {
		d := e.Value
		if d.Name == "" {
			d.Name = token.Decode(e.Key)
		}
		out = append(out, d)
		return true
	})
	return out, nil
}

func (s cacheSource) Builds(context.Context) ([]kv.ImageBuild, error) { return values(s.v.Builds), nil }

func (s cacheSource) Uploads(context.Context) ([]kv.ImageUpload, error) {
	return values(s.v.Uploads), nil
}

func (s cacheSource) BuildRequests(ctx context.Context) (map[string]int, error) {
	return status.BuildRequests(ctx, s.v.js)
}
