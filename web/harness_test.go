package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
	"github.com/nodepool-nats/nodepool/web"
)

// site is a real nodepool process (service.Process, launcher role) on a
// real nats-server, with its status port served by httptest.
type site struct {
	t      *testing.T
	srv    *natstest.Server
	p      *service.Process
	http   *httptest.Server
	client *client.Client
	nodes  *kv.Cache[kv.Node]
	reqs   *kv.Cache[kv.Request]
	// stop stops the process and the port (once).
	stop func()
}

const siteConfig = `
labels:
  - name: small
    min-ready: 1
  - name: big
  - name: slow
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.2
    pools:
      - name: main
        max-servers: 10
        labels: [small, big]
  - name: cloud2
    driver: fake
    boot-delay: 1.5
    pools:
      - name: far
        labels: [slow]
`

// infoAndAbove passes on the records at info level and above.
type infoAndAbove struct{ slog.Handler }

func (h infoAndAbove) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h infoAndAbove) WithAttrs(a []slog.Attr) slog.Handler {
	return infoAndAbove{h.Handler.WithAttrs(a)}
}
func (h infoAndAbove) WithGroup(name string) slog.Handler {
	return infoAndAbove{h.Handler.WithGroup(name)}
}

func testLog() *slog.Logger {
	if os.Getenv("NODEPOOL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startSite starts the process; run false leaves its roles stopped (to
// see it not ready).
func startSite(t *testing.T, run bool) *site {
	t.Helper()
	return startSiteWith(t, run, siteConfig)
}

// startSiteWith starts the process with a configuration of its own.
func startSiteWith(t *testing.T, run bool, yaml string) *site {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	s := config.Settings{NatsURL: srv.ClientURL(), DataDir: t.TempDir(), Roles: []string{config.RoleLauncher},
		ID: "web-test", Replicas: 1, LeaseTTL: 2 * time.Second, SyncInterval: 500 * time.Millisecond}
	// What the launcher said at info and above is kept, and printed if
	// the test fails (the dashboard counts what it saw happen).
	recLog, rec := logtest.New(t)
	log := slog.New(infoAndAbove{recLog.Handler()})
	if os.Getenv("NODEPOOL_TEST_LOG") == "" {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the launcher's log:\n%s", rec)
			}
		})
	}
	p, err := service.Start(t.Context(), s, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	views := web.NewViews(p.JetStream(), p.Buckets(), web.Views{Nodes: p.Launcher().Nodes(),
		Requests: p.Launcher().Requests(), Components: p.Launcher().Components()}, log)
	wg.Go(func() { views.Run(ctx) })
	if run {
		wg.Go(func() { _ = p.Run(ctx) })
	}
	h := web.Handler(web.Options{Views: views, Config: func() *config.Config { return cfg }, Ready: p.Ready, Alive: p.Alive, ID: s.ID, Roles: s.Roles,
		Connected: p.Conn().IsConnected, Log: log})
	hs := httptest.NewServer(h)
	c, err := client.New(t.Context(), p.Conn())
	if err != nil {
		t.Fatal(err)
	}
	st := &site{t: t, srv: srv, p: p, http: hs, client: c,
		nodes: kv.NewCache(c.Buckets().Nodes, log), reqs: kv.NewCache(c.Buckets().Requests, log)}
	wg.Go(func() { _ = st.nodes.Run(ctx) })
	wg.Go(func() { _ = st.reqs.Run(ctx) })
	st.stop = sync.OnceFunc(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		wg.Wait()
		p.Close()
	})
	t.Cleanup(st.stop)
	if run {
		st.waitFor(30*time.Second, "the process ready", func() bool { return p.Ready() == nil })
	}
	return st
}

// waitFor checks cond on every change of the node and request records, and
// at least every 50 ms, until the deadline.
func (s *site) waitFor(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	sn, sr := s.nodes.Subscribe(), s.reqs.Subscribe()
	defer s.nodes.Unsubscribe(sn)
	defer s.reqs.Unsubscribe(sr)
	waitfor.Until(s.t, timeout, what, cond, waitfor.Every(50*time.Millisecond), waitfor.Changes(sn), waitfor.Changes(sr))
}

// get fetches a path of the status port with an Accept header.
func (s *site) get(path, accept string) (int, string, string) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodGet, s.http.URL+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		s.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

// readyNode waits for a ready node of a label and returns it.
func (s *site) readyNode(label string) kv.Node {
	s.t.Helper()
	var n kv.Node
	s.waitFor(30*time.Second, "a ready "+label+" node", func() bool {
		found := false
		s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeReady && e.Value.HasLabel(label) {
				n, found = e.Value, true
			}
			return !found
		})
		return found
	})
	return n
}

// board is the status port over buckets that no launcher works on: the
// records a test writes stay as written, so the page can be shown any
// fleet (a building node on its third attempt, ten thousand nodes).
type board struct {
	t     *testing.T
	js    jetstream.JetStream
	b     *kv.Buckets
	views *web.Views
	http  *httptest.Server
}

// startBoard serves the status port of a process with the configuration
// yaml (its pools' limits) and no roles.
func startBoard(t *testing.T, yaml string) *board {
	t.Helper()
	return startBoardWith(t, yaml, nil)
}

// startBoardWith serves the status port through wrap (nil: as it is).
func startBoardWith(t *testing.T, yaml string, wrap func(http.Handler) http.Handler) *board {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	log := testLog()
	// Component records live as long as the test.
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: time.Hour}, log)
	if err != nil {
		t.Fatal(err)
	}
	views := web.NewViews(js, b, web.Views{}, log)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { views.Run(ctx) })
	var h http.Handler = web.Handler(web.Options{Views: views, Config: func() *config.Config { return cfg }, Log: log})
	if wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		wg.Wait()
	})
	return &board{t: t, js: js, b: b, views: views, http: hs}
}

// node writes a node record.
func (b *board) node(n kv.Node) {
	b.t.Helper()
	if _, err := b.b.Nodes.Create(b.t.Context(), n.ID, &n); err != nil {
		b.t.Fatalf("writing node %s: %v", n.ID, err)
	}
}

// putAsync writes a node record without waiting for the server's
// acknowledgement (flush waits for them all): ten thousand records in a
// moment.
func (b *board) putAsync(n kv.Node) {
	b.t.Helper()
	data, err := json.Marshal(n)
	if err != nil {
		b.t.Fatal(err)
	}
	if b.js.PublishAsyncPending() >= 1000 {
		b.flush() // the client allows a few thousand in flight
	}
	if _, err := b.js.PublishAsync("$KV."+kv.BucketNodes+"."+n.ID, data); err != nil {
		b.t.Fatalf("writing node %s: %v", n.ID, err)
	}
}

// flush waits until every record putAsync wrote is stored.
func (b *board) flush() {
	b.t.Helper()
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		b.t.Fatalf("%d node records not stored after 60 s", b.js.PublishAsyncPending())
	}
}

// request writes a request record.
func (b *board) request(r kv.Request) {
	b.t.Helper()
	if _, err := b.b.Requests.Create(b.t.Context(), r.ID, &r); err != nil {
		b.t.Fatalf("writing request %s: %v", r.ID, err)
	}
}

// component writes a component record.
func (b *board) component(c kv.Component) {
	b.t.Helper()
	if _, err := b.b.Components.Create(b.t.Context(), c.ID, &c); err != nil {
		b.t.Fatalf("writing component %s: %v", c.ID, err)
	}
}

// synced waits until the views hold n nodes and r requests.
func (b *board) synced(nodes, requests int) {
	b.t.Helper()
	sn, sr := b.views.Nodes.Subscribe(), b.views.Requests.Subscribe()
	defer b.views.Nodes.Unsubscribe(sn)
	defer b.views.Requests.Unsubscribe(sr)
	waitfor.Until(b.t, 60*time.Second, fmt.Sprintf("the views to hold %d nodes and %d requests", nodes, requests),
		func() bool { return b.views.Nodes.Len() == nodes && b.views.Requests.Len() == requests },
		waitfor.Changes(sn), waitfor.Changes(sr),
		waitfor.Detail(func() string {
			return fmt.Sprintf("the views hold %d nodes and %d requests", b.views.Nodes.Len(), b.views.Requests.Len())
		}))
}
