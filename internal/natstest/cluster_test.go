package natstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The helper's own promise: an R3 stream keeps its messages and takes new
// ones while its leader is down, and the restarted member catches up.
func TestClusterLeaderStopAndRestart(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	_, js := c.Connect(t, 0)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func(n int) {
		for i := range n {
			// With acknowledgement, retried with the same id: the way to
			// publish through an election.
			msg := &nats.Msg{Subject: "s.x", Data: []byte("m")}
			id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), i)
			for attempt := 0; ; attempt++ {
				_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
				if err == nil {
					break
				}
				if attempt > 100 {
					t.Fatalf("publishing: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	publish(10)
	leader := c.WaitStreamLeader("S", 10*time.Second)
	c.Stop(leader)
	next := c.WaitStreamLeader("S", 30*time.Second)
	if next == leader {
		t.Fatalf("stream leader is still the stopped member %d", leader)
	}
	publish(10)
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	c.WaitHealthy(60 * time.Second)
	for _, i := range c.Running() {
		nc, err := nats.Connect(c.URL(i))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		s, err := js.Stream(ctx, "S")
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != 20 {
			t.Errorf("member %d sees %d messages, want 20", i, got)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("replicas %d", r)
		}
	}
}
