package service_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/service"
)

// NODEPOOL_REPLICAS=3 on a three-server cluster: every stream, bucket,
// object store and durable consumer nodepool makes, the fake cloud's
// included, has three replicas on three different servers.
func TestReplicasThreeEverywhere(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	cfg, err := config.Parse("test.yaml", []byte(`
labels: [{name: small}]
providers:
  - name: p
    driver: fake
    api-rate-limit: 1000
    pools: [{name: main, labels: [small]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	settings := config.Settings{NatsURL: c.URLs(1), ID: "l1", Roles: []string{config.RoleLauncher, config.RoleBuilder},
		Replicas: 3, LeaseTTL: 2 * time.Second, SyncInterval: time.Second, DataDir: t.TempDir(), UploadWorkers: 1}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	_, js := c.Connect(t, 0)
	// The builder makes its object store when it starts running.
	waitfor.Until(t, 30*time.Second, "the builder to make its object store", func() bool {
		_, err := js.Stream(t.Context(), "OBJ_"+builder.FilesBucket)
		return err == nil
	}, waitfor.Every(50*time.Millisecond))
	want := map[string]bool{
		"NODEPOOL_REQUESTS": true, "NODEPOOL_BUILDS": true,
		"KV_nodepool-requests": true, "KV_nodepool-nodes": true, "KV_nodepool-images": true,
		"KV_nodepool-components": true, "KV_nodepool-locks": true,
		"KV_fakecloud-p": true, "KV_fakecloud-p-api": true, "KV_fakeimages-p": true,
		"OBJ_" + builder.FilesBucket: true,
	}
	var infos []*jetstream.StreamInfo
	askAgain(t, "the list of streams", func(ctx context.Context) error {
		infos = infos[:0]
		streams := js.ListStreams(ctx)
		for info := range streams.Info() {
			infos = append(infos, info)
		}
		return streams.Err()
	})
	for _, info := range infos {
		name := info.Config.Name
		delete(want, name)
		if info.Config.Replicas != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, info.Config.Replicas)
		}
		if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s is not placed on three servers: %+v", name, info.Cluster)
		}
		for _, ci := range durableConsumers(t, js, name) {
			if ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
				t.Errorf("consumer %s of %s is not on three servers: %+v", ci.Name, name, ci.Cluster)
			}
		}
	}
	for name := range want {
		t.Errorf("stream %s is missing", name)
	}
}

// askAgain calls ask, 5 s a try, until it answers without an error (for
// up to 60 s). A stream made a moment ago on a busy machine may be
// electing its leader for longer than a request waits (loaded run 4 at
// 9d544cf: "context deadline exceeded"), and a listing is only checked
// once it is answered whole.
func askAgain(t *testing.T, what string, ask func(ctx context.Context) error) {
	t.Helper()
	waitfor.UntilErr(t, 60*time.Second, what, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := ask(ctx)
		return err == nil, err
	}, waitfor.Every(100*time.Millisecond))
}

// durableConsumers lists the durable consumers of a stream (its leader
// answers).
func durableConsumers(t *testing.T, js jetstream.JetStream, stream string) []*jetstream.ConsumerInfo {
	t.Helper()
	var out []*jetstream.ConsumerInfo
	askAgain(t, "the consumers of "+stream, func(ctx context.Context) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		out = out[:0]
		list := s.ListConsumers(ctx)
		for ci := range list.Info() {
			if ci.Config.Durable != "" {
				out = append(out, ci)
			}
		}
		return list.Err()
	})
	return out
}
