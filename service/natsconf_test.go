package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/service"
)

// nats.conf, loaded by the server's own parser and run as one member with
// the cluster block taken out, lets nodepool run and a requestor do the
// requestor protocol, and refuses the requestor everything else
// (docs/deployment.md says what a requestor can and cannot touch; this
// test checks each claim).
func TestProductionNatsConfig(t *testing.T) {
	addr := startNatsConf(t, filepath.Join("..", "nats.conf"))
	startNodepool(t, config.Settings{NatsURL: fmt.Sprintf("nats://nodepool:np-secret@%s", addr)})

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
	if c.Owner != "requestor" {
		t.Errorf("the client's identity is %q; want the NATS user, requestor", c.Owner)
	}

	// The watches a requestor may make are bounded: a consumer meant to
	// live idle for a year is refused by the bucket's limits.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = js.CreateConsumer(rctx, "KV_nodepool-nodes", jetstream.ConsumerConfig{Name: "year-long", InactiveThreshold: 365 * 24 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "inactive threshold") {
		t.Errorf("a year-long consumer on the nodes bucket: %v", err)
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
		{"write a node record", "$KV.nodepool-nodes.n1"},
		{"roll a bucket up (erase every record)", "$KV.nodepool-nodes.x"},
		{"write a request record", "$KV.nodepool-requests.r1"},
		{"publish a request as anonymous", "nodepool.requests.new"},
		{"publish a request as another requestor", "nodepool.requests.other.new"},
		{"call another requestor's endpoint", "nodepool.api.other.take"},
		{"call the anonymous endpoints", "nodepool.api.anonymous.return"},
		{"delete the node-lifecycle consumer", "$JS.API.CONSUMER.DELETE.KV_nodepool-nodes.node-lifecycle"},
		{"re-make the node-lifecycle consumer", "$JS.API.CONSUMER.CREATE.KV_nodepool-nodes.node-lifecycle"},
		{"re-make the node-lifecycle consumer with a filter", "$JS.API.CONSUMER.CREATE.KV_nodepool-nodes.node-lifecycle.$KV.nodepool-nodes.>"},
		{"create a durable consumer", "$JS.API.CONSUMER.DURABLE.CREATE.KV_nodepool-nodes.mine"},
		{"create a consumer named in its body", "$JS.API.CONSUMER.CREATE.KV_nodepool-nodes"},
		{"write a component record", "$KV.nodepool-components.fake"},
		{"take a lease", "$KV.nodepool-locks.pool.p.main"},
		{"write an image record", "$KV.nodepool-images.debian"},
		{"trigger an image build", "nodepool.builds.debian"},
		{"have a launcher make a table (it reads the buckets itself)", "nodepool.status.node-list"},
		{"trigger an upload", "nodepool.uploads.debian.p"},
		{"ask for a node's launch", "nodepool.work.p.launch.abc"},
		{"take a launch", "$JS.API.CONSUMER.MSG.NEXT.NODEPOOL_WORK.launch-p"},
		{"remove a launch consumer", "$JS.API.CONSUMER.DELETE.NODEPOOL_WORK.launch-p"},
		{"purge the queued launches", "$JS.API.STREAM.PURGE.NODEPOOL_WORK"},
		{"publish on another request subject", "nodepool.requests.other"},
		{"pause a consumer", "$JS.API.CONSUMER.PAUSE.KV_nodepool-nodes.node-lifecycle"},
		{"read a lease", "$JS.API.DIRECT.GET.KV_nodepool-locks.$KV.nodepool-locks.pool.p.main"},
		{"read the providers' remembered sections", "$JS.API.DIRECT.GET.KV_nodepool-providers.$KV.nodepool-providers.cloud1"},
		{"write a provider's remembered section", "$KV.nodepool-providers.cloud1"},
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
		msg := nats.NewMsg(tc.subject)
		msg.Data = []byte("{}")
		if strings.HasPrefix(tc.subject, "$KV.") {
			msg.Header.Set("Nats-Rollup", "all")
		}
		if err := bad.PublishMsg(msg); err != nil {
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

// startNatsConf starts nats.conf (from path) as one member on its own: no
// cluster, random ports, a temporary store. It returns the client address.
func startNatsConf(t *testing.T, path string) string {
	t.Helper()
	for k, v := range map[string]string{
		"NATS_SERVER_NAME": "nats-test", "NODEPOOL_PASSWORD": "np-secret", "REQUESTOR_PASSWORD": "req-secret",
		"ADMIN_PASSWORD": "admin-secret", "SYS_PASSWORD": "sys-secret",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats.conf does not parse: %v", err)
	}
	if opts.Cluster.Name != "nodepool" || len(opts.Routes) != 3 || !opts.JetStream {
		t.Errorf("cluster or JetStream settings lost: %+v", opts.Cluster)
	}
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
	t.Cleanup(ns.Shutdown)
	return ns.Addr().String()
}

// startNodepool runs a launcher with the settings' NATS connection.
func startNodepool(t *testing.T, s config.Settings) {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte("labels: [{name: small}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [small]}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s.ID, s.Roles, s.Replicas, s.LeaseTTL, s.SyncInterval = "l1", []string{config.RoleLauncher}, 1, 2*time.Second, time.Second
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := service.Start(t.Context(), s, cfg, log)
	if err != nil {
		t.Fatalf("nodepool cannot start as user nodepool: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
}

// nats.conf with its tls blocks uncommented requires TLS and a client
// certificate: nodepool connects with NODEPOOL_NATS_TLS_CA, _CERT and
// _KEY and serves a requestor that has its own certificate; a client
// without one, or that does not trust the server's CA, is refused.
func TestProductionNatsConfigTLS(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	blocks, in := 0, false
	for _, l := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(l)
		if trimmed == "# tls {" {
			in = true
			blocks++
		}
		if in {
			l = strings.Replace(l, "# ", "", 1)
		}
		if trimmed == "# }" {
			in = false
		}
		lines = append(lines, l)
	}
	if blocks != 2 {
		t.Fatalf("nats.conf has %d commented tls blocks; want 2 (client and cluster)", blocks)
	}
	text := strings.ReplaceAll(strings.Join(lines, "\n"), "/etc/nats/tls/", dir+"/")
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := natstest.NewCA(t)
	ca.WriteCert(t, filepath.Join(dir, "ca.crt"))
	for _, name := range []string{"tls", "nodepool", "zuul"} {
		ca.Issue(t, name, filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	}

	addr := startNatsConf(t, conf)
	url := fmt.Sprintf("nats://nodepool:np-secret@%s", addr)
	startNodepool(t, config.Settings{NatsURL: url, NatsTLSCA: filepath.Join(dir, "ca.crt"),
		NatsTLSCert: filepath.Join(dir, "nodepool.crt"), NatsTLSKey: filepath.Join(dir, "nodepool.key")})

	c, err := client.Connect(t.Context(), config.Settings{NatsURL: fmt.Sprintf("nats://requestor:req-secret@%s", addr),
		NatsTLSCA: filepath.Join(dir, "ca.crt"), NatsTLSCert: filepath.Join(dir, "zuul.crt"), NatsTLSKey: filepath.Join(dir, "zuul.key")})
	if err != nil {
		t.Fatalf("a requestor with a certificate cannot connect: %v", err)
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nodes, err := c.Request(rctx, events.RequestMessage{Labels: []string{"small"}}, "zuul")
	if err != nil {
		t.Fatalf("requestor protocol over TLS: %v", err)
	}
	if err := c.Return(rctx, nodes[0].ID); err != nil {
		t.Fatal(err)
	}

	other := natstest.NewCA(t)
	other.Issue(t, "stranger", filepath.Join(dir, "stranger.crt"), filepath.Join(dir, "stranger.key"))
	for _, tc := range []struct {
		name, want string
		opts       []nats.Option
	}{
		// The server refuses these two in the handshake; with TLS 1.3 the
		// client may learn it from the alert or only from the closed
		// connection, so the message is not checked beyond "tls".
		{"no client certificate", "tls", []nats.Option{nats.RootCAs(filepath.Join(dir, "ca.crt"))}},
		{"a client certificate of another CA", "tls", []nats.Option{nats.RootCAs(filepath.Join(dir, "ca.crt")),
			nats.ClientCert(filepath.Join(dir, "stranger.crt"), filepath.Join(dir, "stranger.key"))}},
		{"no trust in the server's CA", "unknown authority", []nats.Option{nats.ClientCert(filepath.Join(dir, "zuul.crt"), filepath.Join(dir, "zuul.key"))}},
	} {
		nc, err := nats.Connect(fmt.Sprintf("nats://requestor:req-secret@%s", addr), append(tc.opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
