package kv

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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

// A process that starts against buckets that exist asks two things of
// each (its stream's info, then the bucket), not eight: in a cluster
// electing leaders each request may be waited out, and a launcher
// restarting after a kill took 6 s to open them (loaded run 4 at 0e45597,
// TestChaos). What an operator removed, the consumer limits, is set again.
func TestEnsureOpensExistingBucketsWithTwoRequests(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := Options{Replicas: 1, LeaseTTL: 3 * time.Second}
	if _, err := Ensure(t.Context(), js, opts, log); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range BucketConfigs(opts) {
		st, err := js.Stream(t.Context(), "KV_"+cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if sc := st.CachedInfo().Config; sc.MaxConsumers != MaxBucketConsumers || sc.ConsumerLimits.InactiveThreshold != MaxConsumerInactivity {
			t.Errorf("bucket %s: consumer limits %d, %s; want %d, %s", cfg.Bucket, sc.MaxConsumers, sc.ConsumerLimits.InactiveThreshold,
				MaxBucketConsumers, MaxConsumerInactivity)
		}
	}
	st, err := js.Stream(t.Context(), "KV_"+BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.MaxConsumers, sc.ConsumerLimits.InactiveThreshold = -1, 0
	if _, err := js.UpdateStream(t.Context(), sc); err != nil {
		t.Fatal(err)
	}

	// Every JetStream API request of the connection, as the server sees
	// it. A channel subscription: the client puts each message in the
	// channel as it reads it, so once a flush returns every request made
	// before it is there (a callback may not have run yet, and an
	// unsubscription drops what it had not: one request went uncounted
	// under load).
	msgs := make(chan *nats.Msg, 1000)
	sub, err := nc.ChanSubscribe("$JS.API.>", msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := Ensure(t.Context(), js, opts, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = sub.Unsubscribe()
	asked := map[string]int{}
	for len(msgs) > 0 {
		asked[(<-msgs).Subject]++
	}
	if b.LeaseTTL != 3*time.Second || b.Providers == nil {
		t.Errorf("buckets opened with lease TTL %s, providers %v", b.LeaseTTL, b.Providers)
	}
	for _, cfg := range BucketConfigs(opts) {
		want := 2
		if cfg.Bucket == BucketNodes {
			want = 3 // and the limits set again
		}
		if n := asked["$JS.API.STREAM.INFO.KV_"+cfg.Bucket] + asked["$JS.API.STREAM.UPDATE.KV_"+cfg.Bucket]; n != want {
			t.Errorf("bucket %s: %d requests, want %d (%v)", cfg.Bucket, n, want, asked)
		}
	}
	if n := asked["$JS.API.STREAM.UPDATE.KV_"+BucketNodes]; n != 1 {
		t.Errorf("the consumer limits an operator removed were set again %d times, want once", n)
	}
	if len(asked) != len(BucketConfigs(opts))+1 {
		t.Errorf("requests other than stream info and one update: %v", asked)
	}
	st, err = js.Stream(t.Context(), "KV_"+BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	if sc := st.CachedInfo().Config; sc.MaxConsumers != MaxBucketConsumers {
		t.Errorf("consumer limit after Ensure: %d, want %d", sc.MaxConsumers, MaxBucketConsumers)
	}
}
