package service_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// repairWithin bounds how long a repair and the next piece of work take.
const repairWithin = 20 * time.Second

// repairing is a whole process (launcher and builder) on a test server, a
// client, and a watch of the image uploads, with the process's log
// recorded.
type repairing struct {
	js      jetstream.JetStream
	client  *client.Client
	logs    *logtest.Recorder
	uploads *kv.Cache[kv.ImageUpload]
}

// startRepairing starts a process and serves a first request, or with
// builds, builds and uploads a first image: everything is made and in use.
func startRepairing(t *testing.T, builds bool) *repairing {
	t.Helper()
	srv := natstest.Start(t)
	dib, err := filepath.Abs("../builder/testdata/fake-dib")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
diskimages:
  - name: debian
    dib-cmd: %s
    formats: [qcow2]
    env-vars: {FAKE_DIB_SIZE: "1000"}
labels: [{name: small}, {name: debian}]
providers:
  - name: p
    driver: fake
    api-rate-limit: 1000
    diskimages: [debian]
    pools: [{name: main, labels: [small, {name: debian, diskimage: debian}]}]
`, dib)))
	if err != nil {
		t.Fatal(err)
	}
	// A lease TTL long enough that the heartbeat, which fails while the
	// components bucket is missing, is written again before the process
	// fences itself (two thirds of the TTL).
	settings := config.Settings{NatsURL: srv.ClientURL(), ID: "l1", Roles: []string{config.RoleLauncher, config.RoleBuilder},
		Replicas: 1, LeaseTTL: 6 * time.Second, SyncInterval: 500 * time.Millisecond, DataDir: t.TempDir(),
		BuildWorkers: 1, UploadWorkers: 1}
	log, logs := logtest.New(t)
	runProcess(t, settings, cfg, log)

	nc, _ := srv.Connect(t)
	c, err := client.New(t.Context(), nc)
	if err != nil {
		t.Fatal(err)
	}
	r := &repairing{js: c.JetStream(), client: c, logs: logs, uploads: kv.NewCache(c.Images().Uploads, log)}
	stop := r.uploads.Start()
	t.Cleanup(stop)
	if err := r.uploads.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	if builds {
		r.build(t, time.Time{})
	} else {
		r.serve(t)
	}
	return r
}

// serve requests a node, takes it and gives it back, within repairWithin.
func (r *repairing) serve(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), repairWithin)
	defer cancel()
	nodes, err := r.client.Request(ctx, events.RequestMessage{Labels: []string{"small"}, Requestor: "test"}, "test")
	if err != nil {
		t.Fatalf("request not served within %s: %v\nlog:\n%s", repairWithin, err, r.logs)
	}
	for _, n := range nodes {
		if err := r.client.Return(t.Context(), n.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// build asks for a build of the image and waits for an upload of a build
// made after since to be ready.
func (r *repairing) build(t *testing.T, since time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), repairWithin)
	defer cancel()
	sub := r.uploads.Subscribe()
	defer r.uploads.Unsubscribe(sub)
	requested := false
	waitfor.Until(t, repairWithin, "an image built and uploaded", func() bool {
		ready := false
		r.uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool {
			ready = e.Value.State == kv.ImageReady && e.Value.Created.After(since)
			return !ready
		})
		if ready {
			return true
		}
		if !requested {
			// A request refused (the stream is being made again) is
			// made again at the next check.
			requested = r.client.RequestBuild(ctx, "debian", "test") == nil
		}
		return false
	}, waitfor.Every(100*time.Millisecond), waitfor.Changes(sub), waitfor.Detail(func() string { return fmt.Sprintf("log:\n%s", r.logs) }))
}

// Each stream, bucket, object store and durable consumer a process
// depends on, deleted while it runs, is made again within seconds, with a
// log line saying so, and the next request (or build and upload) is
// served. Each is tried on a process of its own.
func TestDeletedDependenciesAreMadeAgain(t *testing.T) {
	deleteConsumer := func(stream, name string) func(context.Context, jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteConsumer(ctx, stream, name) }
	}
	deleteStream := func(name string) func(context.Context, jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteStream(ctx, name) }
	}
	deleteBucket := func(name string) func(context.Context, jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteKeyValue(ctx, name) }
	}
	// Heartbeats and leases are written again by their holders.
	heartbeat := func(t *testing.T, r *repairing) {
		waitRecord(t, r.client.Buckets().Components, "l1", func(kv.Component) bool { return true })
	}
	lease := func(t *testing.T, r *repairing) {
		waitRecord(t, r.client.Buckets().Locks, "pool.p.main", func(l kv.LeaseRecord) bool { return l.Holder == "l1" })
	}
	for _, c := range []struct {
		name    string
		delete  func(context.Context, jetstream.JetStream) error
		log     []string // what the log line says
		builder bool     // checked with a build, else with a request
		// written, if set, waits for what the process writes again.
		written func(*testing.T, *repairing)
	}{
		{"consumer deletes", deleteConsumer(events.WorkStream, events.DeleteConsumer),
			[]string{"WARN", "the consumer was missing; made it again", "consumer=deletes"}, false, nil},
		{"consumer intake", deleteConsumer(events.RequestsStream, "intake"),
			[]string{"WARN", "the consumer was missing; made it again", "consumer=intake"}, false, nil},
		{"consumer launch-p", deleteConsumer(events.WorkStream, events.LaunchConsumer("p")),
			[]string{"WARN", "the consumer was missing; made it again", "consumer=launch-p"}, false, nil},
		{"stream NODEPOOL_WORK", deleteStream(events.WorkStream),
			[]string{"WARN", "stream NODEPOOL_WORK was missing; made it again"}, false, nil},
		{"stream NODEPOOL_REQUESTS", deleteStream(events.RequestsStream),
			[]string{"WARN", "stream NODEPOOL_REQUESTS was missing; made it again"}, false, nil},
		{"bucket nodepool-requests", deleteBucket(kv.BucketRequests),
			[]string{"WARN", "bucket nodepool-requests was missing; made it again"}, false, nil},
		{"bucket nodepool-nodes", deleteBucket(kv.BucketNodes),
			[]string{"WARN", "bucket nodepool-nodes was missing; made it again"}, false, nil},
		{"bucket nodepool-components", deleteBucket(kv.BucketComponents),
			[]string{"WARN", "bucket nodepool-components was missing; made it again"}, false, heartbeat},
		{"bucket nodepool-locks", deleteBucket(kv.BucketLocks),
			[]string{"WARN", "bucket nodepool-locks was missing; made it again"}, false, lease},
		{"bucket fakecloud-p", deleteBucket("fakecloud-p"),
			[]string{"WARN", "bucket fakecloud-p was missing; made it again"}, false, nil},
		{"bucket fakecloud-p-api", deleteBucket("fakecloud-p-api"),
			[]string{"WARN", "bucket fakecloud-p-api was missing; made it again"}, false, nil},
		{"consumer image-builds", deleteConsumer(events.BuildsStream, builder.BuildConsumer),
			[]string{"WARN", "the consumer was missing; made it again", "consumer=image-builds"}, true, nil},
		{"consumer image-uploads", deleteConsumer(events.BuildsStream, builder.UploadConsumer),
			[]string{"WARN", "the consumer was missing; made it again", "consumer=image-uploads"}, true, nil},
		{"stream NODEPOOL_BUILDS", deleteStream(events.BuildsStream),
			[]string{"WARN", "stream NODEPOOL_BUILDS was missing; made it again"}, true, nil},
		{"bucket nodepool-images", deleteBucket(kv.BucketImages),
			[]string{"WARN", "bucket nodepool-images was missing; made it again"}, true, nil},
		{"bucket fakeimages-p", deleteBucket("fakeimages-p"),
			[]string{"WARN", "bucket fakeimages-p was missing; made it again"}, true, nil},
		{"object store nodepool-image-files", func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteObjectStore(ctx, builder.FilesBucket)
		},
			[]string{"WARN", "object store nodepool-image-files was missing; made it again"}, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRepairing(t, c.builder)
			deleted := time.Now()
			if err := c.delete(t.Context(), r.js); err != nil {
				t.Fatal(err)
			}
			r.logs.Wait(t, repairWithin, c.log...)
			t.Logf("made again in %s", time.Since(deleted).Round(time.Millisecond))
			if c.written != nil {
				c.written(t, r)
			}
			if c.builder {
				r.build(t, deleted)
			} else {
				r.serve(t)
			}
			t.Logf("served %s after the deletion", time.Since(deleted).Round(time.Millisecond))
			if errs := r.logs.Lines("ERROR"); len(errs) > 0 {
				t.Errorf("errors logged:\n%s", errors.Join(stringErrors(errs)...))
			}
		})
	}
}

// waitRecord waits until a bucket holds a record at key for which ok
// holds.
func waitRecord[T any](t *testing.T, store *kv.Store[T], key string, ok func(T) bool) {
	t.Helper()
	log, _ := logtest.New(t)
	c := kv.NewCache(store, log)
	stop := c.Start()
	defer stop()
	sub := c.Subscribe()
	defer c.Unsubscribe(sub)
	waitfor.Until(t, repairWithin, fmt.Sprintf("%s/%s written again", store.Bucket().Bucket(), key), func() bool {
		e, found := c.Get(key)
		return found && ok(e.Value)
	}, waitfor.Changes(sub))
}

func stringErrors(lines []string) []error {
	var out []error
	for _, l := range lines {
		out = append(out, errors.New(l))
	}
	return out
}
