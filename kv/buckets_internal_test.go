package kv

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/natstest"
)

// A bucket whose TTL cannot be read (here: the connection is gone) is an
// error, never a TTL of 0: read as 0, one bucket's TTL differed from the
// other's and a launcher started during a leader election refused to run.
func TestBucketTTLUnreadableIsAnError(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	b, err := Ensure(t.Context(), js, Options{Replicas: 1, LeaseTTL: 3 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := bucketTTL(t.Context(), b.Locks.kv); err != nil || ttl != 3*time.Second {
		t.Fatalf("TTL of the locks bucket: %s, %v; want 3s", ttl, err)
	}
	nc.Close()
	if ttl, err := bucketTTL(t.Context(), b.Locks.kv); err == nil {
		t.Fatalf("TTL read on a closed connection: %s, no error", ttl)
	}
}
