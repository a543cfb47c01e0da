package natstest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// Writes calls fn for every write to the keys of a KV bucket that match a
// filter (">" for every key, as in a subject) from now on, in the order
// the server stores them, until the test ends: the key, the value, and
// whether the write deletes or purges the key (a KV delete is a message
// with a KV-Operation header and no body). It subscribes to the bucket's
// subjects rather than watching the bucket: a watch that lags resumes at
// the newest revision of each key, and a bucket keeping one revision per
// key has dropped the ones in between, so a test asserting that a record
// passed through a state would miss it.
//
// fn runs on one goroutine, one write at a time.
func Writes(t testing.TB, nc *nats.Conn, bucket, keys string, fn func(key string, value []byte, deleted bool)) {
	t.Helper()
	prefix := "$KV." + bucket + "."
	sub, err := nc.Subscribe(prefix+keys, func(m *nats.Msg) {
		op := m.Header.Get("KV-Operation")
		fn(strings.TrimPrefix(m.Subject, prefix), m.Data, op == "DEL" || op == "PURGE")
	})
	if err != nil {
		t.Fatalf("subscribing to the writes of bucket %s: %v", bucket, err)
	}
	// No write may be dropped for being slow to handle.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatalf("subscribing to the writes of bucket %s: %v", bucket, err)
	}
	// The server has the subscription once the flush returns: every
	// write stored from then on is delivered.
	if err := nc.Flush(); err != nil {
		t.Fatalf("subscribing to the writes of bucket %s: %v", bucket, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// Puts calls fn for every value put to the keys of a KV bucket that match
// a filter from now on, decoded from JSON, as Writes does (deletes are
// passed over; a value that does not decode fails the test).
func Puts[T any](t testing.TB, nc *nats.Conn, bucket, keys string, fn func(key string, value T)) {
	t.Helper()
	Writes(t, nc, bucket, keys, func(key string, data []byte, deleted bool) {
		if deleted {
			return
		}
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			t.Errorf("bucket %s, key %s: %v", bucket, key, err)
			return
		}
		fn(key, v)
	})
}
