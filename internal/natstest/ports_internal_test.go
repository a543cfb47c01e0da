package natstest

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A member whose port something else took says so at once (and is then
// given new ports), instead of waiting out ReadyForConnections.
func TestClusterMemberOnATakenPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		route bool // the route port is the one taken, not the client port
	}{{"client port", false}, {"route port", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c := &Cluster{t: t, name: "taken"}
			c.members = []*member{{opts: &server.Options{ServerName: "n1", Host: "127.0.0.1", JetStream: true,
				StoreDir: t.TempDir(), NoSigs: true, NoLog: true, Cluster: server.ClusterOpts{Name: "taken", Host: "127.0.0.1"}}}}
			if err := c.choosePorts(c.members...); err != nil {
				t.Fatal(err)
			}
			taken := ln.Addr().(*net.TCPAddr).Port
			if tc.route {
				c.members[0].opts.Cluster.Port = taken
			} else {
				c.members[0].opts.Port = taken
			}
			start := time.Now()
			err = c.start(0)
			if !errors.Is(err, errPortTaken) {
				t.Fatalf("started on a taken port: %v", err)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("noticed the taken port after %s", took)
			}
			if err := c.choosePorts(c.members...); err != nil {
				t.Fatal(err)
			}
			if err := c.start(0); err != nil {
				t.Fatalf("on new ports: %v", err)
			}
			c.Stop(0)
		})
	}
}
