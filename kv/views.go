package kv

import (
	"log/slog"
	"sync"
)

// Views are a process's caches of the buckets its roles and drivers read:
// one cache, fed by one watch, per bucket, whoever reads it (the launcher,
// the zookeeper role, the static and metastatic drivers, the web API; the
// images bucket's three kinds of record have a cache each, fed by one
// watch);
// and one watch of the locks bucket for all its leases (Leases).
// A cache is made when first asked for; each reader starts it
// (Cache.Start) and stops it when done, and its watch runs while any
// reader has it started. A nil *Views makes a new cache at every call,
// for code run on its own (tests, a single role).
type Views struct {
	b   *Buckets
	log *slog.Logger

	mu         sync.Mutex
	nodes      *Cache[Node]
	requests   *Cache[Request]
	components *Cache[Component]
	images     *ImageCaches
	providers  *Cache[ProviderRecord]
	leases     *LeaseWatch
}

// NewViews prepares the caches of a process over its buckets.
func NewViews(b *Buckets, log *slog.Logger) *Views {
	return &Views{b: b, log: log}
}

// view returns the cache *c, made over s first if needed.
func view[T any](v *Views, c **Cache[T], s *Store[T]) *Cache[T] {
	v.mu.Lock()
	defer v.mu.Unlock()
	if *c == nil {
		*c = NewCache(s, v.log)
	}
	return *c
}

// Nodes is the process's cache of the nodes bucket (a new cache over b's
// if v is nil).
func (v *Views) Nodes(b *Buckets, log *slog.Logger) *Cache[Node] {
	if v != nil {
		return view(v, &v.nodes, v.b.Nodes)
	}
	return NewCache(b.Nodes, log)
}

// Requests is the process's cache of the requests bucket (a new cache over
// b's if v is nil).
func (v *Views) Requests(b *Buckets, log *slog.Logger) *Cache[Request] {
	if v != nil {
		return view(v, &v.requests, v.b.Requests)
	}
	return NewCache(b.Requests, log)
}

// Components is the process's cache of the components bucket (a new cache
// over b's if v is nil).
func (v *Views) Components(b *Buckets, log *slog.Logger) *Cache[Component] {
	if v != nil {
		return view(v, &v.components, v.b.Components)
	}
	return NewCache(b.Components, log)
}

// Images are the process's caches of the images bucket, fed by one watch
// (new caches over b's if v is nil).
func (v *Views) Images(b *Buckets, log *slog.Logger) *ImageCaches {
	if v == nil {
		return b.ImageCaches(log)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.images == nil {
		v.images = v.b.ImageCaches(v.log)
	}
	return v.images
}

// Providers is the process's cache of the providers bucket (a new cache
// over b's if v is nil); b must have the bucket.
func (v *Views) Providers(b *Buckets, log *slog.Logger) *Cache[ProviderRecord] {
	if v != nil {
		return view(v, &v.providers, v.b.Providers)
	}
	return NewCache(b.Providers, log)
}

// Leases is the process's one watch of the locks bucket, for its leases
// (nil if v is nil: each lease then watches its own key).
func (v *Views) Leases() *LeaseWatch {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.leases == nil {
		v.leases = NewLeaseWatch(v.b.Locks, v.log)
	}
	return v.leases
}
