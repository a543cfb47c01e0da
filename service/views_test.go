package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// TestOneWatchPerBucket: a process whose launcher runs a static and a
// metastatic provider, both of which read node records (and the
// metastatic one requests), beside a builder, watches each bucket once:
// its roles and drivers share one cache per bucket, and its leases one
// watch of the locks bucket. A watch is an ordered consumer on the
// bucket's stream, so the stream's consumers are counted.
func TestOneWatchPerBucket(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	cfg, err := config.Parse("test.yaml", []byte(`
labels: [{name: small}, {name: meta}, {name: host}]
providers:
  - name: cloud
    driver: fake
    pools: [{name: main, labels: [small]}]
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - {name: 127.0.0.1, connection-port: 1, labels: [host], host-key-checking: false}
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - {name: meta, backing-label: small}
`))
	if err != nil {
		t.Fatal(err)
	}
	settings := config.Settings{NatsURL: srv.ClientURL(), ID: "l1", Roles: []string{config.RoleLauncher, config.RoleBuilder},
		Replicas: 1, LeaseTTL: 6 * time.Second, SyncInterval: 500 * time.Millisecond, DataDir: t.TempDir()}
	log, _ := logtest.New(t)
	p := runProcess(t, settings, cfg, log)

	_, js := srv.Connect(t)
	// One deadline for the launcher to run and every bucket to be
	// watched once.
	deadline := time.Now().Add(20 * time.Second)
	waitfor.Until(t, time.Until(deadline), "the launcher running", func() bool { return p.Launcher() != nil && p.Launcher().Running() })
	// The builder's image scheduler holds its lease: its election (and
	// so its wait for the key) has begun.
	locks, err := js.KeyValue(t.Context(), kv.BucketLocks)
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Until(deadline), "the builder's scheduler elected", func() bool {
		_, err := locks.Get(t.Context(), builder.SchedulerLease)
		return p.Builder() != nil && p.Builder().Running() && err == nil
	})
	// one waits until exactly one consumer of bucket is left that keep
	// keeps (a watch restarted a moment ago may leave its old consumer for
	// a while: the count must come down to one).
	one := func(what, bucket string, keep func(jetstream.ConsumerConfig) bool) {
		t.Helper()
		var got []string
		waitfor.Until(t, time.Until(deadline), what, func() bool {
			got = bucketConsumers(t, js, bucket, keep)
			return len(got) == 1
		}, waitfor.Every(50*time.Millisecond), waitfor.Detail(func() string {
			return fmt.Sprintf("%d watches:\n%s", len(got), strings.Join(got, "\n"))
		}))
	}
	for _, bucket := range []string{kv.BucketNodes, kv.BucketRequests, kv.BucketComponents, kv.BucketProviders} {
		// Watches of the whole bucket: all keys, values and not only
		// headers.
		one(fmt.Sprintf("one watch of bucket %s", bucket), bucket, func(c jetstream.ConsumerConfig) bool {
			return !c.HeadersOnly && (c.FilterSubject == "$KV."+bucket+".>" || (len(c.FilterSubjects) == 1 && c.FilterSubjects[0] == "$KV."+bucket+".>"))
		})
	}
	// The image, build and upload records (the launcher's index of
	// uploads, the builder's three caches) are fed by one watch of the
	// whole images bucket: no watch of some of its keys.
	one("one watch of the images bucket", kv.BucketImages, func(c jetstream.ConsumerConfig) bool { return !c.HeadersOnly })
	// The leases (cleanup, min-ready, a pool lease per pool, a provider
	// lease per driver manager, the builder's scheduler: eight here) share
	// one watch of the locks bucket, and no lease watches its own key.
	one("one watch of the locks bucket", kv.BucketLocks, func(jetstream.ConsumerConfig) bool { return true })
}

// bucketConsumers lists the consumers of a bucket's stream that are not
// durable (watches of the bucket or of keys) and that keep keeps.
func bucketConsumers(t *testing.T, js jetstream.JetStream, bucket string, keep func(jetstream.ConsumerConfig) bool) []string {
	t.Helper()
	s, err := js.Stream(t.Context(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	l := s.ListConsumers(t.Context())
	for ci := range l.Info() {
		if c := ci.Config; c.Durable == "" && keep(c) {
			out = append(out, fmt.Sprintf("%s (created %s, deliver %s, filter %s %v)", ci.Name, ci.Created.Format(time.RFC3339Nano), c.DeliverPolicy, c.FilterSubject, c.FilterSubjects))
		}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
