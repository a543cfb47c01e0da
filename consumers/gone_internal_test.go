package consumers

import (
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// When the components bucket is deleted and made again, every heartbeat
// goes with it: until its launcher writes it again (within a lease TTL), a
// missing heartbeat does not make a launcher gone, so that its nodes are
// not handed to another launcher while it still drives them.
func TestNoLauncherIsGoneRightAfterTheComponentsBucketWasMadeAgain(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log, logs := logtest.New(t)
	ttl := time.Minute
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: ttl}, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Components.Create(t.Context(), "other", &kv.Component{ID: "other", Heartbeat: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte("labels: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLauncher(js, b, Options{ID: "me", Config: cfg, LeaseTTL: ttl, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.components.Start())
	if err := l.components.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l.gone(t.Context(), "other") {
		t.Fatal("a launcher with a heartbeat is gone")
	}

	if err := js.DeleteKeyValue(t.Context(), kv.BucketComponents); err != nil {
		t.Fatal(err)
	}
	for _, bc := range kv.BucketConfigs(kv.Options{Replicas: 1, LeaseTTL: ttl}) {
		if bc.Bucket == kv.BucketComponents {
			if _, err := kv.EnsureBucket(t.Context(), js, bc, log); err != nil {
				t.Fatal(err)
			}
		}
	}
	logs.Wait(t, 10*time.Second, "the bucket was deleted and made again", "bucket=nodepool-components")
	if l.gone(t.Context(), "other") {
		t.Error("a launcher whose heartbeat went with its bucket a moment ago is gone")
	}
}
