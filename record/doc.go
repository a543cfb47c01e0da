// Package record holds the records of the NATS KV buckets (nodes,
// requests, components, leases, providers' resources) as plain data: their
// fields, states, validation and the errors of revision-checked stores.
// It knows nothing of NATS; package kv stores and watches them, and
// drivers read them without depending on how they are kept.
package record

import "errors"

// Sentinel errors of the stores that keep records.
var (
	// ErrNotFound: the key does not exist (or was deleted).
	ErrNotFound = errors.New("record not found")
	// ErrConflict: the record changed since it was read (revision mismatch);
	// re-read and decide again.
	ErrConflict = errors.New("record changed since it was read")
	// ErrExists: Create found the key already there.
	ErrExists = errors.New("record already exists")
	// ErrBadRecord: the stored value is not a valid record.
	ErrBadRecord = errors.New("stored value is not a valid record")
	// ErrSkip, returned by a Modify function, ends Modify without writing.
	ErrSkip = errors.New("no change")
)

// Entry is a record with its key and revision.
type Entry[T any] struct {
	Key      string
	Value    T
	Revision uint64
}
