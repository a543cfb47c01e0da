package consumers_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// leaseTTL is short in tests so that a dead launcher is noticed quickly.
const leaseTTL = 2 * time.Second

// harness is one nats-server with the streams and buckets, a client, and
// watch caches of the records and of each fake cloud, so tests wait on
// records instead of sleeping.
type harness struct {
	t      testing.TB
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	b      *kv.Buckets
	cfg    *config.Config
	client *client.Client

	nodes      *kv.Cache[kv.Node]
	requests   *kv.Cache[kv.Request]
	components *kv.Cache[kv.Component]
	instances  map[string]*kv.Cache[fake.InstanceRecord] // by cloud

	// wrap, if set, wraps each driver of the launchers started from now.
	wrap func(provider string, p drivers.Provider) drivers.Provider
	// options, if set, changes the options of the launchers started from
	// now.
	options func(*consumers.Options)
	// watched are more caches whose changes wake wait (see watchToo).
	watched []func() (signal <-chan struct{}, drain, stop func())
	// log, if set, is the log of the launchers started from now.
	log *slog.Logger

	mu        sync.Mutex
	launchers []*launcher // started, running or not
}

func testLog(t testing.TB) *slog.Logger {
	if os.Getenv("NODEPOOL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func parseConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

func newHarness(t testing.TB, yaml string) *harness {
	t.Helper()
	cfg := parseConfig(t, yaml)
	srv := natstest.Start(t)
	return newHarnessOn(t, srv, cfg)
}

func newHarnessOn(t testing.TB, srv *natstest.Server, cfg *config.Config) *harness {
	t.Helper()
	nc, js := srv.Connect(t)
	ctx := t.Context()
	if err := events.Ensure(ctx, js, 1, testLog(t)); err != nil {
		t.Fatal(err)
	}
	b, err := kv.Ensure(ctx, js, kv.Options{Replicas: 1, LeaseTTL: leaseTTL}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, srv: srv, nc: nc, js: js, b: b, cfg: cfg, client: c,
		nodes: kv.NewCache(b.Nodes, testLog(t)), requests: kv.NewCache(b.Requests, testLog(t)),
		components: kv.NewCache(b.Components, testLog(t)),
		instances:  map[string]*kv.Cache[fake.InstanceRecord]{}}
	runCache(t, h.nodes)
	runCache(t, h.requests)
	runCache(t, h.components)
	for _, p := range cfg.Providers {
		if p.Driver != "fake" || h.instances[p.Cloud] != nil {
			continue
		}
		bucket, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fake.BucketName(p.Cloud), History: 1, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		c := kv.NewCache(kv.NewStore[fake.InstanceRecord](bucket), testLog(t))
		runCache(t, c)
		h.instances[p.Cloud] = c
	}
	return h
}

// watchToo runs a cache whose changes wake wait as the records' do.
func watchToo[T any](h *harness, c *kv.Cache[T]) {
	runCache(h.t, c)
	h.watched = append(h.watched, func() (<-chan struct{}, func(), func()) {
		sub := c.Subscribe()
		return sub.C(), func() { sub.Drain() }, func() { c.Unsubscribe(sub) }
	})
}

func runCache[T any](t testing.TB, c *kv.Cache[T]) {
	t.Cleanup(c.Start())
	if err := c.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// launcherLog is the log of a launcher started now.
func (h *harness) launcherLog() *slog.Logger {
	if h.log != nil {
		return h.log
	}
	return testLog(h.t)
}

// recordLog records what the launchers started from now log, and prints it
// if the test fails.
func (h *harness) recordLog() *logtest.Recorder {
	var rec *logtest.Recorder
	h.log, rec = logtest.New(h.t)
	h.t.Cleanup(func() {
		if h.t.Failed() {
			h.t.Logf("launcher log:\n%s", rec)
		}
	})
	return rec
}

// launcher is a launcher running in this test process.
type launcher struct {
	*consumers.Launcher
	Providers map[string]drivers.Provider
	cancel    context.CancelFunc
	done      chan struct{}
}

// Stop shuts the launcher down cleanly and waits.
func (l *launcher) Stop() {
	l.cancel()
	<-l.done
}

// startLauncher runs a launcher with its own connection and drivers; it is
// stopped when the test ends.
func (h *harness) startLauncher(id string) *launcher {
	h.t.Helper()
	return h.startLauncherWith(id, h.cfg)
}

// startLauncherWith runs a launcher with a configuration of its own.
func (h *harness) startLauncherWith(id string, cfg *config.Config) *launcher {
	h.t.Helper()
	return h.startLauncherVia(id, cfg, h.srv.ClientURL())
}

// startLauncherVia runs a launcher whose connection goes to url (a proxy,
// say).
func (h *harness) startLauncherVia(id string, cfg *config.Config, url string) *launcher {
	h.t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b, err := kv.Open(ctx, js)
	if err != nil {
		h.t.Fatal(err)
	}
	if b.Providers, err = kv.OpenProviders(ctx, js); err != nil {
		h.t.Fatal(err)
	}
	opts := consumers.Options{
		ID: id, Config: cfg, LeaseTTL: leaseTTL,
		SyncInterval: 200 * time.Millisecond, Log: h.launcherLog().With("launcher", id),
	}
	if h.options != nil {
		h.options(&opts)
	}
	// The drivers go by the launcher's clock (a fake one's metastatic
	// manager takes its passes as the test moves it).
	dopts := service.DriverOptions{Replicas: 1, Clock: opts.Clock, Log: h.launcherLog()}
	providers, err := service.NewProviders(ctx, js, cfg, dopts)
	if err != nil {
		h.t.Fatal(err)
	}
	if h.wrap != nil {
		for name, p := range providers {
			providers[name] = h.wrap(name, p)
		}
	}
	if opts.Providers == nil {
		opts.Providers = providers
	}
	if opts.NewDriver == nil {
		opts.NewDriver = func(ctx context.Context, pc *config.Provider) (drivers.Provider, error) {
			p, err := service.NewProvider(ctx, js, pc, dopts)
			if err != nil {
				return nil, err
			}
			return drivers.Share(p), nil
		}
	}
	l, err := consumers.NewLauncher(js, b, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	tl := &launcher{Launcher: l, Providers: providers, cancel: cancel, done: make(chan struct{})}
	h.mu.Lock()
	h.launchers = append(h.launchers, tl)
	h.mu.Unlock()
	go func() {
		defer close(tl.done)
		if err := l.Run(ctx); err != nil {
			h.t.Errorf("launcher %s: %v", id, err)
		}
		for _, p := range providers {
			p.Close()
		}
	}()
	var once sync.Once
	h.t.Cleanup(func() { once.Do(tl.Stop) })
	return tl
}

// until waits, with a deadline, until cond holds, re-checking it whenever a
// node, request or instance changes.
func (h *harness) until(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	opts, stop := h.changes()
	defer stop()
	waitfor.Until(h.t, timeout, what, cond, append(opts, waitfor.Detail(h.dump))...)
}

// wait waits, with a deadline, until cond holds, re-checking it whenever a
// node, request or instance changes, and tells whether it did.
func (h *harness) wait(timeout time.Duration, cond func() bool) bool {
	opts, stop := h.changes()
	defer stop()
	return waitfor.True(timeout, cond, opts...)
}

// changes subscribes to the changes of the node, request, component and
// instance records and of the caches watchToo added, for a wait to wake
// on; stop unsubscribes.
func (h *harness) changes() (opts []waitfor.Option, stop func()) {
	var stops []func()
	subscribe := func(o waitfor.Option, unsubscribe func()) {
		opts = append(opts, o)
		stops = append(stops, unsubscribe)
	}
	sn := h.nodes.Subscribe()
	subscribe(waitfor.Changes(sn), func() { h.nodes.Unsubscribe(sn) })
	sr := h.requests.Subscribe()
	subscribe(waitfor.Changes(sr), func() { h.requests.Unsubscribe(sr) })
	sc := h.components.Subscribe()
	subscribe(waitfor.Changes(sc), func() { h.components.Unsubscribe(sc) })
	for _, c := range h.instances {
		s := c.Subscribe()
		subscribe(waitfor.Changes(s), func() { c.Unsubscribe(s) })
	}
	for _, w := range h.watched {
		signal, drain, unsubscribe := w()
		opts = append(opts, waitfor.Wake(signal))
		subscribe(waitfor.Before(drain), unsubscribe)
	}
	return opts, func() {
		for _, s := range stops {
			s()
		}
	}
}

// waitLaunchers waits until n launchers are live.
// Every running launcher sees them too (it judges labels and pools by its
// own view).
func (h *harness) waitLaunchers(n int) {
	h.t.Helper()
	h.until(10*time.Second, fmt.Sprintf("%d live launchers", n), func() bool { return h.components.Len() == n })
	h.mu.Lock()
	running := slices.DeleteFunc(slices.Clone(h.launchers), func(l *launcher) bool {
		select {
		case <-l.done:
			return true
		default:
			return false
		}
	})
	h.mu.Unlock()
	opts := []waitfor.Option{}
	for _, l := range running {
		c := l.Components()
		sub := c.Subscribe()
		defer c.Unsubscribe(sub)
		opts = append(opts, waitfor.Changes(sub))
	}
	// A launcher that stopped meanwhile sees nothing more: it is left
	// out (the poll notices it stopped).
	seeing := func(l *launcher) bool { return isDone(l.done) || l.Components().Len() == n }
	waitfor.Until(h.t, 10*time.Second, fmt.Sprintf("every running launcher to see %d live launchers", n),
		func() bool { return !slices.ContainsFunc(running, func(l *launcher) bool { return !seeing(l) }) },
		append(opts, waitfor.Detail(func() string {
			var b strings.Builder
			for _, l := range running {
				if !seeing(l) {
					fmt.Fprintf(&b, "a launcher sees %d live launchers, want %d\n", l.Components().Len(), n)
				}
			}
			return b.String()
		}))...)
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// dump describes the records, for failure messages.
func (h *harness) dump() string {
	var b strings.Builder
	b.WriteString("requests:\n")
	h.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		r := e.Value
		fmt.Fprintf(&b, "  %s %s labels=%v nodes=%v pool=%s declined=%v reason=%q\n", r.ID, r.State, r.Labels, r.Nodes, kv.PoolRef(r.Provider, r.Pool), r.DeclinedBy, r.Reason)
		return true
	})
	b.WriteString("nodes:\n")
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := e.Value
		fmt.Fprintf(&b, "  %s %s %v %s alloc=%q launcher=%q ext=%q reason=%q\n", n.ID, n.State, n.Labels, kv.PoolRef(n.Provider, n.Pool), n.AllocatedTo, n.Launcher, n.ExternalID, n.Reason)
		return true
	})
	for cloud, c := range h.instances {
		fmt.Fprintf(&b, "instances of %s: %d\n", cloud, c.Len())
	}
	return b.String()
}

func (h *harness) submit(m events.RequestMessage) string {
	h.t.Helper()
	id, err := h.client.Submit(h.t.Context(), m)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// submitRecorded submits a request and waits until its record exists:
// requests submitted at the same instant are recorded by concurrent intake
// workers in any order, so a test that needs "earlier submission first"
// submits one after the other's record.
func (h *harness) submitRecorded(m events.RequestMessage) string {
	h.t.Helper()
	id := h.submit(m)
	h.until(10*time.Second, "request "+id+" recorded", func() bool {
		_, ok := h.request(id)
		return ok
	})
	return id
}

func (h *harness) publishRaw(data string) {
	h.t.Helper()
	if _, err := h.js.Publish(h.t.Context(), events.NewRequestSubject, []byte(data)); err != nil {
		h.t.Fatal(err)
	}
}

// request returns the cached record of a request.
func (h *harness) request(id string) (kv.Request, bool) {
	e, ok := h.requests.Get(id)
	return e.Value, ok
}

// node reads a node record from the bucket (not the cache, which may be
// behind the request cache).
func (h *harness) node(id string) (kv.Node, bool) {
	e, err := h.b.Nodes.Get(h.t.Context(), id)
	return e.Value, err == nil
}

// waitDone waits until a request is fulfilled or failed.
func (h *harness) waitDone(timeout time.Duration, ids ...string) {
	h.t.Helper()
	h.until(timeout, fmt.Sprintf("requests %v to end", ids), func() bool {
		for _, id := range ids {
			r, ok := h.request(id)
			if !ok || !r.Done() {
				return false
			}
		}
		return true
	})
}

// countNodes counts nodes matching a predicate.
func (h *harness) countNodes(pred func(*kv.Node) bool) int {
	n := 0
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if pred(&e.Value) {
			n++
		}
		return true
	})
	return n
}

// instanceCount is the number of instances in a fake cloud now.
func (h *harness) instanceCount(cloud string) int { return h.instances[cloud].Len() }

// instancesEverCreated counts the instances ever created in a fake cloud:
// every instance id is a subject of the cloud's stream, and a deleted one
// keeps its delete marker.
func (h *harness) instancesEverCreated(cloud string) int {
	h.t.Helper()
	s, err := h.js.Stream(h.t.Context(), "KV_"+fake.BucketName(cloud))
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := s.Info(h.t.Context(), jetstream.WithSubjectFilter(">"))
	if err != nil {
		h.t.Fatal(err)
	}
	return len(info.State.Subjects)
}

// checkNoLeaks asserts that every instance has a node record that names it
// and every node that names an instance has it.
func (h *harness) checkConsistent(cloud string) {
	h.t.Helper()
	// The node and instance caches follow their buckets independently, so
	// one may briefly lag the other (a node record already gone whose
	// instance's delete is not seen yet): wait, with a deadline, for them
	// to agree, and report what still disagrees then. A real leak or
	// dangling record does not go away.
	var bad []string
	h.wait(10*time.Second, func() bool {
		bad = h.inconsistencies(cloud)
		return len(bad) == 0
	})
	for _, b := range bad {
		h.t.Error(b)
	}
}

// inconsistencies lists the nodes pointing to a missing instance and the
// instances that no node names.
func (h *harness) inconsistencies(cloud string) []string {
	var bad []string
	byExt := map[string]string{}
	h.instances[cloud].Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		byExt[e.Key] = e.Value.Tags["nodepool_node_id"]
		return true
	})
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := e.Value
		if n.ExternalID != "" && n.State != kv.NodeDeleting {
			if _, ok := byExt[n.ExternalID]; !ok {
				bad = append(bad, fmt.Sprintf("node %s (%s) points to instance %s, which does not exist", n.ID, n.State, n.ExternalID))
			}
		}
		return true
	})
	for ext, nodeID := range byExt {
		n, ok := h.node(nodeID)
		// A node still building owns the instance its create's token
		// made, whether or not it recorded the id yet (an idempotent
		// driver records it when the node is ready).
		if !ok || (n.ExternalID != ext && n.State != kv.NodeBuilding) {
			bad = append(bad, fmt.Sprintf("instance %s (node %q) has no node record naming it", ext, nodeID))
		}
	}
	slices.Sort(bad)
	return bad
}
