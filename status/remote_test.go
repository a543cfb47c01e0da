package status_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/status"
)

// memSource holds records in memory; Sync runs hook (if set) and counts.
type memSource struct {
	nodes []kv.Node
	comps []kv.Component
	reqs  []kv.Request
	syncs atomic.Int64
	gate  atomic.Pointer[gate]
}

// gate holds Sync: entered gets a value when a Sync waits, open lets
// every Sync through.
type gate struct{ entered, open chan struct{} }

func (s *memSource) Nodes(context.Context) ([]*kv.Node, error) {
	return status.Pointers(s.nodes), nil
}

func (s *memSource) Requests(context.Context) ([]kv.Request, error) {
	return append([]kv.Request(nil), s.reqs...), nil
}

func (s *memSource) Components(context.Context) ([]kv.Component, error) {
	return append([]kv.Component(nil), s.comps...), nil
}
func (s *memSource) DiskImages(context.Context) ([]kv.DiskImage, error)    { return nil, nil }
func (s *memSource) Builds(context.Context) ([]kv.ImageBuild, error)       { return nil, nil }
func (s *memSource) Uploads(context.Context) ([]kv.ImageUpload, error)     { return nil, nil }
func (s *memSource) BuildRequests(context.Context) (map[string]int, error) { return nil, nil }

func (s *memSource) Sync(ctx context.Context, _ string) error {
	s.syncs.Add(1)
	if g := s.gate.Load(); g != nil {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// manyNodes are n node records with the members the table shows.
func manyNodes(n int) []kv.Node {
	created := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	nodes := make([]kv.Node, n)
	for i := range nodes {
		nodes[i] = kv.Node{ID: fmt.Sprintf("n%06d", i), Provider: "cloud1", Pool: "main", Labels: []string{"small"},
			State: kv.NodeReady, Launcher: "l1", ExternalID: fmt.Sprintf("i-%d", i), PublicIPv4: "192.0.2.7",
			Created: created, StateTime: created, Comment: strings.Repeat("c", i%50)}
	}
	return nodes
}

// serve starts Serve on its own connection until the test ends.
func serve(t *testing.T, srv *natstest.Server, src status.SyncedSource, o status.ServeOptions) {
	t.Helper()
	nc, _ := srv.Connect(t)
	stop, err := status.Serve(nc, src, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// A table fetched from a serving process is byte for byte what the CLI
// prints from the same records, in every output form, including tables of
// many parts (10,000 nodes; JSON of every field on 1,000, which is as
// much code and a tenth of the time under -race).
func TestFetchPrintsWhatTheCLIPrints(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC)
	type served struct {
		src *memSource
		nc  *nats.Conn
	}
	sources := map[int]served{}
	for _, n := range []int{10000, 1000} {
		srv := natstest.Start(t)
		src := &memSource{nodes: manyNodes(n), comps: []kv.Component{{ID: "l1"}}}
		serve(t, srv, src, status.ServeOptions{Options: func() status.Options { return status.Options{Now: now} }})
		nc, _ := srv.Connect(t)
		sources[n] = served{src, nc}
	}
	for _, c := range []struct {
		name  string
		nodes int
		table string
		q     status.Query
		parts bool
	}{
		{"default columns", 10000, "node-list", status.Query{}, true},
		{"detail", 10000, "node-list", status.Query{Detail: true}, true},
		{"fields in their order", 10000, "node-list", status.Query{Fields: []string{"state", "id"}}, false},
		{"json", 1000, "node-list", status.Query{JSON: true}, false},
		{"json with fields", 10000, "node-list", status.Query{JSON: true, Fields: []string{"id", "locked"}}, false},
		{"another table", 1000, "label-list", status.Query{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sources[c.nodes]
			local, err := status.Load(t.Context(), s.src, c.table, status.Options{Now: now})
			if err != nil {
				t.Fatal(err)
			}
			var want, got bytes.Buffer
			if err := c.q.Write(&want, local); err != nil {
				t.Fatal(err)
			}
			before := s.src.syncs.Load()
			if err := status.Fetch(t.Context(), s.nc, c.table, c.q, 5*time.Second, &got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Errorf("fetched %d bytes, the CLI prints %d; they differ", got.Len(), want.Len())
			}
			if c.parts && got.Len() < 1<<20 {
				t.Errorf("the table is %d bytes; the case wants one of several parts of 1 MiB", got.Len())
			}
			if s.src.syncs.Load() == before {
				t.Error("the source was not brought up to date before the table was made")
			}
		})
	}
}

// What a serving process cannot or must not answer, and what the caller
// does then: read the buckets (ErrNoServer) or report the query's error.
func TestFetchFailures(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)

	// No process serves: the server says so at once.
	start := time.Now()
	err := status.Fetch(t.Context(), nc, "node-list", status.Query{}, 30*time.Second, new(bytes.Buffer))
	if !errors.Is(err, status.ErrNoServer) || time.Since(start) > 20*time.Second {
		t.Errorf("no server: %v after %s; want ErrNoServer at once", err, time.Since(start))
	}

	src := &memSource{nodes: manyNodes(3), comps: []kv.Component{{ID: "l1"}}}
	serve(t, srv, src, status.ServeOptions{Parallel: 1, SyncTimeout: 2 * time.Second})

	for _, c := range []struct {
		name    string
		table   string
		q       status.Query
		badQ    bool
		message string
	}{
		{"unknown field", "node-list", status.Query{Fields: []string{"id", "colour"}}, true, `unknown field "colour"; expected some of: id,`},
		{"unknown table", "node-lists", status.Query{}, true, `no table "node-lists"`},
	} {
		var out bytes.Buffer
		err := status.Fetch(t.Context(), nc, c.table, c.q, 5*time.Second, &out)
		var bad *status.BadQueryError
		if err == nil || !strings.Contains(err.Error(), c.message) || errors.As(err, &bad) != c.badQ || out.Len() != 0 {
			t.Errorf("%s: %v (bad query %v), %d bytes written", c.name, err, errors.As(err, &bad), out.Len())
		}
	}

	// Caches that are not brought up to date in time: the caller reads
	// the buckets. And while that query holds the only slot, another is
	// answered busy.
	g := &gate{entered: make(chan struct{}, 1), open: make(chan struct{})}
	src.gate.Store(g)
	slow := make(chan error, 1)
	go func() {
		slow <- status.Fetch(t.Context(), nc, "node-list", status.Query{}, 5*time.Second, new(bytes.Buffer))
	}()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow query did not reach the source")
	}
	err = status.Fetch(t.Context(), nc, "node-list", status.Query{}, 5*time.Second, new(bytes.Buffer))
	if !errors.Is(err, status.ErrNoServer) || !strings.Contains(err.Error(), "busy") {
		t.Errorf("a query beyond the slots: %v; want busy", err)
	}
	if err := <-slow; !errors.Is(err, status.ErrNoServer) || !strings.Contains(err.Error(), "bringing the caches up to date") {
		t.Errorf("caches not in time: %v", err)
	}
	close(g.open)
	if err := status.Fetch(t.Context(), nc, "node-list", status.Query{}, 5*time.Second, new(bytes.Buffer)); err != nil {
		t.Errorf("once the caches answer again: %v", err)
	}
}

// Malformed and hostile queries, published raw: each gets an error
// answer (or none, without a reply subject), and the process goes on
// serving.
func TestServeSurvivesBadQueries(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	src := &memSource{nodes: manyNodes(3), comps: []kv.Component{{ID: "l1"}}}
	serve(t, srv, src, status.ServeOptions{})
	nc, _ := srv.Connect(t)
	for _, c := range []struct {
		name, subject string
		data          []byte
		want          string
	}{
		{"not JSON", "nodepool.status.node-list", []byte("list please"), "query is not a JSON object"},
		{"unknown member", "nodepool.status.node-list", []byte(`{"fields":["id"],"colour":1}`), "query is not a JSON object"},
		{"two objects", "nodepool.status.node-list", []byte(`{} {}`), "data after its JSON object"},
		{"an empty field", "nodepool.status.node-list", []byte(`{"fields":[""]}`), `query field ""`},
		{"too big", "nodepool.status.node-list", bytes.Repeat([]byte(" "), 20<<10), "query of 20480 bytes"},
		{"wrong types", "nodepool.status.node-list", []byte(`{"json":"yes"}`), "query is not a JSON object"},
		{"a table that is not", "nodepool.status.%00", nil, `no table "%00"`},
	} {
		m, err := nc.Request(c.subject, c.data, 5*time.Second)
		if err != nil {
			t.Errorf("%s: no answer: %v", c.name, err)
			continue
		}
		if e := m.Header.Get("Nodepool-Error"); !strings.Contains(e, c.want) {
			t.Errorf("%s: answered %q; want an error with %q", c.name, e, c.want)
		}
	}
	// Without a reply subject there is no one to answer.
	if err := nc.Publish("nodepool.status.node-list", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := status.Fetch(t.Context(), nc, "node-list", status.Query{Fields: []string{"id"}}, 5*time.Second, &out); err != nil || !strings.Contains(out.String(), "| n000002 |") {
		t.Errorf("after the bad queries: %v\n%s", err, out.String())
	}
}

// Credentials that may not ask (a requestor's) make the caller read the
// buckets at once, not after the wait for an answer.
func TestFetchWithoutPermission(t *testing.T) {
	t.Parallel()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "nodepool", Password: "p"},
			{Username: "requestor", Password: "r", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"nodepool.requests.requestor.new"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		}}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	connect := func(user, pass string) *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(user, pass))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	stop, err := status.Serve(connect("nodepool", "p"), &memSource{}, status.ServeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	nc := connect("requestor", "r")
	start := time.Now()
	err = status.Fetch(t.Context(), nc, "node-list", status.Query{}, 30*time.Second, new(bytes.Buffer))
	if !errors.Is(err, status.ErrNoServer) || !errors.Is(err, nats.ErrPermissionViolation) || time.Since(start) > 20*time.Second {
		t.Errorf("a requestor's query: %v after %s; want a permissions violation at once", err, time.Since(start))
	}
}

func FuzzDecodeQuery(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"fields":["id","state"],"json":true,"detail":true}`, `{"fields":[""]}`, `[]`, `{"x":1}`, `{} {}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := status.DecodeQuery(data)
		if err != nil {
			if q.JSON || q.Detail || q.Fields != nil {
				t.Errorf("an error (%v) with a query %+v", err, q)
			}
			return
		}
		if len(data) > 16<<10 {
			t.Errorf("a query of %d bytes accepted", len(data))
		}
		// Whatever is accepted renders or is refused as a bad query.
		tbl := status.LabelList(nil)
		if err := q.Write(new(bytes.Buffer), tbl); err != nil {
			var bad *status.BadQueryError
			if !errors.As(err, &bad) {
				t.Errorf("query %+v: %v", q, err)
			}
		}
	})
}
