package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/service"
)

// nats.conf, loaded by the server's own parser and run as one member with
// the cluster block taken out, lets nodepool run and a requestor do the
// requestor protocol, and refuses the requestor everything else
// (docs/deployment.md says what a requestor can and cannot touch; this
// test checks each claim).
func TestProductionNatsConfig(t *testing.T) {
	for k, v := range map[string]string{
		"NATS_SERVER_NAME": "nats-test", "NODEPOOL_PASSWORD": "np-secret", "REQUESTOR_PASSWORD": "req-secret",
		"ADMIN_PASSWORD": "admin-secret", "SYS_PASSWORD": "sys-secret",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf does not parse: %v", err)
	}
	if opts.Cluster.Name != "nodepool" || len(opts.Routes) != 3 || !opts.JetStream {
		t.Errorf("cluster or JetStream settings lost: %+v", opts.Cluster)
	}
	// One member on its own: no cluster, random ports, a temporary store.
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server did not start")
	}
	defer ns.Shutdown()
	addr := ns.Addr().String()

	cfg, err := config.Parse("test.yaml", []byte("labels: [{name: small}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [small]}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	settings := config.Settings{NatsURL: fmt.Sprintf("nats://nodepool:np-secret@%s", addr), ID: "l1", Roles: []string{config.RoleLauncher},
		Replicas: 1, LeaseTTL: 2 * time.Second, SyncInterval: time.Second}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err != nil {
		t.Fatalf("nodepool cannot start as user nodepool: %v", err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// A requestor that listens to every _INBOX reply while nodepool works
	// must not see nodepool's own (they carry every bucket's data): the
	// processes use inboxes of their own (service.InboxPrefix).
	snoop, err := nats.Connect(fmt.Sprintf("nats://requestor:req-secret@%s", addr))
	if err != nil {
		t.Fatal(err)
	}
	defer snoop.Close()
	snooped, err := snoop.SubscribeSync("_INBOX.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := snoop.Flush(); err != nil {
		t.Fatal(err)
	}

	// The requestor's own replies are told apart by their prefix.
	nc, err := nats.Connect(fmt.Sprintf("nats://requestor:req-secret@%s", addr), nats.CustomInboxPrefix("_INBOX.requestor"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(t.Context(), nc)
	if err != nil {
		t.Fatalf("the Go client cannot open the buckets as requestor: %v", err)
	}
	rctx, rcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer rcancel()
	nodes, err := c.Request(rctx, events.RequestMessage{Labels: []string{"small"}}, "zuul")
	if err != nil {
		t.Fatalf("requestor protocol as requestor: %v", err)
	}
	if err := c.Return(rctx, nodes[0].ID); err != nil {
		t.Fatalf("returning as requestor: %v", err)
	}
	// The request and the node went through the launcher, which renewed its
	// heartbeat and leases meanwhile (acknowledged by the server with
	// replies naming the stream) and read the request stream.
	for {
		m, err := snooped.NextMsg(10 * time.Millisecond)
		if err != nil {
			break
		}
		if strings.HasPrefix(m.Subject, "_INBOX.requestor.") {
			continue
		}
		for _, private := range []string{"KV_nodepool-components", "KV_nodepool-locks", events.RequestsStream} {
			if strings.Contains(string(m.Data), private) {
				t.Errorf("a requestor listening on _INBOX.> read a reply meant for nodepool (%s): %.200s", m.Subject, m.Data)
			}
		}
	}

	// Everything else is refused: the server answers each with a
	// permissions violation (and drops the message).
	denied := make(chan error, 64)
	bad, err := nats.Connect(fmt.Sprintf("nats://requestor:req-secret@%s", addr),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	for _, tc := range []struct{ what, subject string }{
		{"write a component record", "$KV.nodepool-components.fake"},
		{"take a lease", "$KV.nodepool-locks.pool.p.main"},
		{"write an image record", "$KV.nodepool-images.debian"},
		{"trigger an image build", "nodepool.builds.debian"},
		{"trigger an upload", "nodepool.uploads.debian.p"},
		{"publish on another request subject", "nodepool.requests.other"},
		{"read a lease", "$JS.API.DIRECT.GET.KV_nodepool-locks.$KV.nodepool-locks.pool.p.main"},
		{"read the request stream", "$JS.API.CONSUMER.CREATE.NODEPOOL_REQUESTS.x.nodepool.requests.>"},
		{"read the image files", "$JS.API.CONSUMER.CREATE.OBJ_nodepool-image-files.x.$O.nodepool-image-files.C.>"},
		{"read the fake cloud", "$JS.API.DIRECT.GET.KV_fakecloud-p.$KV.fakecloud-p.x"},
		{"delete a stream", "$JS.API.STREAM.DELETE.NODEPOOL_REQUESTS"},
		{"purge a bucket", "$JS.API.STREAM.PURGE.KV_nodepool-nodes"},
		{"delete the intake consumer", "$JS.API.CONSUMER.DELETE.NODEPOOL_REQUESTS.intake"},
		{"change a bucket", "$JS.API.STREAM.UPDATE.KV_nodepool-nodes"},
		{"create a stream", "$JS.API.STREAM.CREATE.MINE"},
		{"acknowledge a message", "$JS.ACK.NODEPOOL_REQUESTS.intake.1.1.1.1.0"},
		{"publish outside nodepool's subjects", "foo.bar"},
	} {
		if err := bad.Publish(tc.subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-denied:
			if !strings.Contains(err.Error(), "Permissions Violation") || !strings.Contains(err.Error(), tc.subject) {
				t.Errorf("requestor may %s (%s): got %v", tc.what, tc.subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("requestor may %s: publishing on %s was not refused", tc.what, tc.subject)
		}
	}
	for _, tc := range []struct{ what, subject string }{
		{"listen to node changes as they are published", "$KV.nodepool-nodes.>"},
		{"listen to requests as they are published", "nodepool.requests.>"},
		{"listen to everything", ">"},
	} {
		if _, err := bad.SubscribeSync(tc.subject); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-denied:
			if !strings.Contains(err.Error(), "Permissions Violation") || !strings.Contains(err.Error(), tc.subject) {
				t.Errorf("requestor may %s (%s): got %v", tc.what, tc.subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("requestor may %s: subscribing to %s was not refused", tc.what, tc.subject)
		}
	}
}
