package drivers

import (
	"context"

	"github.com/nodepool-nats/nodepool/record"
)

// Records is a driver's access to one bucket's records, for the drivers
// that keep records of their own (static registers its hosts as nodes,
// metastatic files requests for backing nodes): the process's view of
// them, read at once, and revision-checked writes through it. The process
// gives its own (kv.Cache); a driver never opens a bucket.
type Records[T any] interface {
	// Start follows the bucket until stop is called (the view may be
	// shared: it follows while anyone started it).
	Start() (stop func())
	// WaitSynced waits until the view holds every record there was when
	// it started.
	WaitSynced(ctx context.Context) error
	// Sync waits until the view holds every change made before the call.
	Sync(ctx context.Context) error
	Get(key string) (record.Entry[T], bool)
	Has(key string) bool
	Range(fn func(*record.Entry[T]) bool)
	// Changes signals after the records changed (once at first).
	Changes() (changed <-chan struct{}, stop func())
	Create(ctx context.Context, key string, v *T) (record.Entry[T], error)
	// Modify reads, changes with fn (record.ErrSkip: no change) and
	// writes a record at the revision read, again on a conflict.
	Modify(ctx context.Context, key string, fn func(*T) error) (record.Entry[T], error)
	// Delete deletes a record at a revision (record.ErrConflict if it
	// changed since).
	Delete(ctx context.Context, key string, rev uint64) error
}
