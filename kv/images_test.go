package kv_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// The three kinds of image records share one bucket; each typed store and
// each cache sees only its own kind, whether the caches watch their keys
// each or are fed by one watch of the whole bucket (Buckets.ImageCaches, what
// a process runs: one consumer on the server for all three).
func TestImageStoresSeeOnlyTheirKind(t *testing.T) {
	t.Parallel()
	for _, fed := range []bool{false, true} {
		t.Run(map[bool]string{false: "a watch per cache", true: "one feed"}[fed], func(t *testing.T) {
			t.Parallel()
			imageStoresSeeOnlyTheirKind(t, fed)
		})
	}
}

func imageStoresSeeOnlyTheirKind(t *testing.T, fed bool) {
	b, js := bucketsJS(t)
	ctx := t.Context()
	s := kv.NewImageStores(b.Images)
	if _, err := s.Images.Create(ctx, "debian", &kv.DiskImage{Name: "debian", BuildSeq: 2}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kv.ImageSeqID(1), kv.ImageSeqID(2)} {
		if _, err := s.Builds.Create(ctx, kv.BuildKey("debian", id), &kv.ImageBuild{Image: "debian", ID: id, State: kv.ImageReady}); err != nil {
			t.Fatal(err)
		}
	}
	up := kv.ImageUpload{Image: "debian", BuildID: kv.ImageSeqID(2), Provider: "cloud1", ID: kv.ImageSeqID(1), State: kv.ImageReady}
	if _, err := s.Uploads.Create(ctx, up.Key(), &up); err != nil {
		t.Fatal(err)
	}

	builds, err := s.Builds.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(builds) != 2 || builds[0].Key != "debian.0000000001" {
		t.Errorf("builds = %+v", builds)
	}
	keys, err := s.Uploads.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"debian.0000000002.cloud1.0000000001"}) {
		t.Errorf("upload keys = %v", keys)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	images, uploads := kv.NewCache(s.Images, log), kv.NewCache(s.Uploads, log)
	if fed {
		c := b.ImageCaches(log)
		images, uploads = c.Images, c.Uploads
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = images.Run(ctx) }()
	go func() { _ = uploads.Run(ctx) }()
	if err := images.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if err := uploads.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if images.Len() != 1 || uploads.Len() != 1 {
		t.Fatalf("caches hold %d images and %d uploads, want 1 and 1", images.Len(), uploads.Len())
	}
	if watches := imageWatches(t, js); fed && watches != 1 {
		t.Errorf("%d watches of the images bucket feed two caches, want 1", watches)
	}
	// A later change of another kind does not reach the cache.
	sub := uploads.Subscribe()
	defer uploads.Unsubscribe(sub)
	sub.Drain()
	if _, err := s.Builds.Create(ctx, kv.BuildKey("debian", kv.ImageSeqID(3)), &kv.ImageBuild{Image: "debian", ID: kv.ImageSeqID(3)}); err != nil {
		t.Fatal(err)
	}
	up2 := up
	up2.ID = kv.ImageSeqID(2)
	if _, err := s.Uploads.Create(ctx, up2.Key(), &up2); err != nil {
		t.Fatal(err)
	}
	// Woken by the changes, which are left queued: they are looked at
	// below.
	waitfor.Until(t, 5*time.Second, "the new upload to reach the cache", func() bool { return uploads.Len() >= 2 }, waitfor.Wake(sub.C()))
	for _, ch := range sub.Drain() {
		if ch.Key != up.Key() && ch.Key != up2.Key() {
			t.Errorf("upload cache saw %s", ch.Key)
		}
	}
}

func TestNewestReadyUpload(t *testing.T) {
	t.Parallel()
	u := func(build, id string, state kv.ImageState, provider string) kv.ImageUpload {
		return kv.ImageUpload{Image: "img", BuildID: build, ID: id, State: state, Provider: provider}
	}
	uploads := []kv.ImageUpload{
		u("0000000002", "0000000005", kv.ImageReady, "p1"),
		u("0000000003", "0000000006", kv.ImageDeleted, "p1"),
		u("0000000002", "0000000007", kv.ImageReady, "p1"),
		u("0000000001", "0000000009", kv.ImageReady, "p1"),
		u("0000000004", "0000000010", kv.ImageReady, "p2"),
		u("0000000005", "0000000011", kv.ImageUploading, "p1"),
	}
	got, ok := kv.NewestReadyUpload(uploads, "img", "p1")
	if !ok || got.BuildID != "0000000002" || got.ID != "0000000007" {
		t.Errorf("newest ready upload to p1 = %+v, %v", got, ok)
	}
	if _, ok := kv.NewestReadyUpload(uploads, "img", "p3"); ok {
		t.Error("found an upload to a provider that has none")
	}
}

func TestParseBuildName(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in, image, build string
		ok               bool
	}{
		{"debian-bookworm-0000000003", "debian-bookworm", "0000000003", true},
		{"debian-0000000001", "debian", "0000000001", true},
		{"debian", "", "", false},
		{"debian-", "", "", false},
		{"-0000000001", "", "", false},
		{"debian-abc", "", "", false},
	}
	for _, c := range cases {
		image, build, err := kv.ParseBuildName(c.in)
		if (err == nil) != c.ok || image != c.image || build != c.build {
			t.Errorf("ParseBuildName(%q) = %q, %q, %v", c.in, image, build, err)
		}
	}
}

// imageWatches counts the watches of the images bucket (consumers that
// are not durable and deliver values).
func imageWatches(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	st, err := js.Stream(t.Context(), "KV_"+kv.BucketImages)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	l := st.ListConsumers(t.Context())
	for ci := range l.Info() {
		if ci.Config.Durable == "" && !ci.Config.HeadersOnly {
			n++
		}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
