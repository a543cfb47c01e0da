// Package bench measures a running nodepool the way users feel it, through
// the public contract only: it publishes requests on nodepool.requests.new,
// watches the request and node buckets, and takes and gives back nodes as a
// requestor does. It can start the system it measures (launcher processes
// with a scenario's configuration, against a NATS server of its own) or
// drive one that runs already.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/freeport"
	"github.com/nodepool-nats/nodepool/kv"
)

// Stats summarises durations.
type Stats struct {
	Min, P50, P95, P99, Max time.Duration
}

// Summarise computes Stats of a sample.
func Summarise(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{Min: s[0], P50: q(0.50), P95: q(0.95), P99: q(0.99), Max: s[len(s)-1]}
}

// Result is what one run of a scenario measured.
type Result struct {
	Scenario   string        `json:"scenario"`
	Launchers  int           `json:"launchers"`
	Requests   int           `json:"requests"`
	Makespan   time.Duration `json:"makespan_ns"`
	Throughput float64       `json:"throughput_per_s"`
	Latency    Stats         `json:"latency_ns"`
	// Cleanup is the time from giving the nodes back to their records
	// being gone.
	Cleanup time.Duration `json:"cleanup_ns"`
	// LauncherCPU and LauncherPeakRSS add up every launcher process.
	LauncherCPU     time.Duration `json:"launcher_cpu_ns"`
	LauncherPeakRSS int64         `json:"launcher_peak_rss_bytes"`
	// KVUpdateRate is revision-checked KV updates per second on the same
	// server, measured in the same run; Ratio is Throughput over it.
	KVUpdateRate float64 `json:"kv_updates_per_s"`
	Ratio        float64 `json:"throughput_to_kv_ratio"`
	// Extra holds figures particular to a scenario.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// System is what a scenario drives.
type System struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	Client *client.Client
	URL    string
	Log    *slog.Logger

	// launchers this bench started (empty when driving a running system).
	procs []*Launcher
	// embedder is the launcher that runs the embedded server, if any.
	embedder string
	binary   string
	cfgPath  string
	workDir  string
	env      []string
}

// Launcher is a launcher process started by the bench.
type Launcher struct {
	ID  string
	Cmd *exec.Cmd
	// started is when the process was started.
	started time.Time
	done    chan struct{}
	log     *os.File
}

// Options say how to set up a system.
type Options struct {
	// URL of a running system's NATS server; empty starts launchers.
	URL string
	// Binary is the nodepool binary for launcher processes.
	Binary string
	// WorkDir holds configurations, logs and data.
	WorkDir string
	Log     *slog.Logger
	// Env is added to the launchers' environment.
	Env []string
	// Cloud is the cloud scenario's settings.
	Cloud CloudOptions
	// DevCloud is the nodepool-devcloud binary the cloud scenario runs
	// its cloud with.
	DevCloud string
	// Replicas, above 1, runs the bench's NATS as a cluster of that many
	// servers (in the bench's process) and the launchers with streams and
	// buckets of that many replicas, as production runs.
	Replicas int
}

// startSystem starts n launchers with the scenario's configuration: the
// first with an embedded NATS server (when embedded) or all against url.
func startSystem(ctx context.Context, o Options, config string, n int, embedded bool, url string) (*System, error) {
	s := &System{Log: o.Log, binary: o.Binary, workDir: o.WorkDir}
	if o.URL != "" {
		s.URL = o.URL
		return s, s.connect(ctx)
	}
	s.cfgPath = filepath.Join(o.WorkDir, "nodepool.yaml")
	if err := os.WriteFile(s.cfgPath, []byte(config), 0o600); err != nil {
		return nil, err
	}
	s.env = append([]string{"NODEPOOL_ROLES=launcher", "NODEPOOL_HTTP_ADDR=", "NODEPOOL_LOG_LEVEL=warn"}, o.Env...)
	if embedded {
		ports, err := freeport.Ports(1)
		if err != nil {
			return nil, err
		}
		listen := fmt.Sprintf("127.0.0.1:%d", ports[0])
		s.env = append(s.env, "NODEPOOL_NATS_LISTEN="+listen, "NODEPOOL_DATA_DIR="+filepath.Join(o.WorkDir, "data"))
		s.URL = "nats://" + listen
		s.embedder = "bench-launcher-0"
	} else {
		s.URL = url
		s.env = append(s.env, "NODEPOOL_NATS_URL="+url)
	}
	for i := range n {
		if _, err := s.startLauncher(ctx, fmt.Sprintf("bench-launcher-%d", i)); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.connect(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, s.waitLaunchers(ctx, n)
}

func (s *System) connect(ctx context.Context) error {
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.NC, err = nats.Connect(s.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("connecting to %s: %w", s.URL, err)
		}
		time.Sleep(100 * time.Millisecond) // the launcher's embedded server is starting
	}
	for {
		s.Client, err = client.New(ctx, s.NC)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("opening the buckets: %w", err)
		}
		time.Sleep(100 * time.Millisecond) // the launcher is creating them
	}
	s.JS = s.Client.JetStream()
	return nil
}

// waitLaunchers waits until n launchers have registered.
func (s *System) waitLaunchers(ctx context.Context, n int) error {
	w, err := s.Client.Buckets().Components.Bucket().WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	live := map[string]bool{}
	timeout := time.After(60 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout:
			return fmt.Errorf("only %d of %d launchers registered within a minute", len(live), n)
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() == jetstream.KeyValuePut {
				live[e.Key()] = true
			} else {
				delete(live, e.Key())
			}
			if len(live) >= n {
				return nil
			}
		}
	}
}

func (s *System) startLauncher(ctx context.Context, id string) (*Launcher, error) {
	logf, err := os.Create(filepath.Join(s.workDir, id+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.binary, "run", "-c", s.cfgPath)
	cmd.Env = append(append(os.Environ(), s.env...), "NODEPOOL_ID="+id)
	if s.embedder != "" && id != s.embedder {
		cmd.Env = append(cmd.Env, "NODEPOOL_NATS_URL="+s.URL)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", s.binary, err)
	}
	l := &Launcher{ID: id, Cmd: cmd, started: time.Now(), done: make(chan struct{}), log: logf}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(l.done)
	}()
	s.procs = append(s.procs, l)
	return l, nil
}

// stopLauncher stops a launcher cleanly.
func (s *System) stopLauncher(l *Launcher) {
	_ = l.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		_ = l.Cmd.Process.Kill()
		<-l.done
	}
	s.procs = slices.DeleteFunc(s.procs, func(x *Launcher) bool { return x == l })
}

// Close stops what the bench started.
func (s *System) Close() {
	if s.NC != nil {
		s.NC.Close()
	}
	for _, l := range slices.Clone(s.procs) {
		s.stopLauncher(l)
	}
}

// usage reads CPU time and peak RSS of the launchers: those the bench
// started, or, when driving a running system, the live launchers on this
// machine named in nodepool-components.
func (s *System) usage(ctx context.Context) (time.Duration, int64) {
	var pids []int
	for _, l := range s.procs {
		pids = append(pids, l.Cmd.Process.Pid)
	}
	if len(s.procs) == 0 {
		host, _ := os.Hostname()
		comps, err := s.Client.Components(ctx)
		if err == nil {
			for _, c := range comps {
				if c.Value.Hostname == host && c.Value.PID > 0 {
					pids = append(pids, c.Value.PID)
				}
			}
		}
	}
	var cpu time.Duration
	var rss int64
	for _, pid := range pids {
		c, r, err := procUsage(pid)
		if err == nil {
			cpu += c
			rss += r
		}
	}
	return cpu, rss
}

// procUsage reads a process's CPU time (user+system) and peak RSS from
// /proc.
func procUsage(pid int) (time.Duration, int64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name may hold spaces; fields start after its ")".
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 13 {
		return 0, 0, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	cpu := time.Duration(utime+stime) * time.Second / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return cpu, 0, err
	}
	var rss int64
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			rss = kb * 1024
		}
	}
	return cpu, rss, nil
}

// addExtra adds figures particular to a scenario to those it has.
func (r *Result) addExtra(m map[string]float64) {
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	maps.Copy(r.Extra, m)
}

// KVUpdateRate measures revision-checked updates per second on the server:
// 32 writers, each updating its own key of a scratch bucket (of the given
// replicas, as the records' buckets) with the revision it last wrote, for
// the given time.
func KVUpdateRate(ctx context.Context, js jetstream.JetStream, replicas int, d time.Duration) (float64, error) {
	name := fmt.Sprintf("nodepool-bench-scratch-%d", time.Now().UnixNano())
	b, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return 0, err
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), name) }()
	value := []byte(`{"id":"x","state":"ready","labels":["bench"],"provider":"bench","pool":"main"}`)
	var total int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 32 {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", w)
			rev, err := b.Create(ctx, key, value)
			if err != nil {
				return
			}
			n := int64(0)
			for time.Since(start) < d && ctx.Err() == nil {
				if rev, err = b.Update(ctx, key, value, rev); err != nil {
					return
				}
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds(), nil
}

// tracker follows request and node records, recording when each request
// reached a final state and when nodes disappear.
type tracker struct {
	mu        sync.Mutex
	done      map[string]time.Time
	final     map[string]kv.Request
	nodesGone map[string]time.Time
	nodes     map[string]kv.Node
	// changed is closed (and replaced) on every change, waking every
	// waiter at once.
	changed chan struct{}
}

func newTracker() *tracker {
	return &tracker{done: map[string]time.Time{}, final: map[string]kv.Request{}, nodesGone: map[string]time.Time{},
		nodes: map[string]kv.Node{}, changed: make(chan struct{})}
}

// signal wakes every waiter; the caller holds t.mu.
func (t *tracker) signal() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// watch follows both buckets until ctx ends.
func (t *tracker) watch(ctx context.Context, c *client.Client) error {
	rw, err := c.Buckets().Requests.Bucket().WatchAll(ctx)
	if err != nil {
		return err
	}
	nw, err := c.Buckets().Nodes.Bucket().WatchAll(ctx)
	if err != nil {
		_ = rw.Stop()
		return err
	}
	go func() {
		defer func() { _ = rw.Stop(); _ = nw.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-rw.Updates():
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				r, err := kv.Decode[kv.Request](e.Key(), e.Value())
				if err != nil || !r.Done() {
					continue
				}
				now := time.Now()
				t.mu.Lock()
				if _, seen := t.done[r.ID]; !seen {
					t.done[r.ID] = now
					t.final[r.ID] = r
				}
				t.signal()
				t.mu.Unlock()
			case e := <-nw.Updates():
				if e == nil {
					continue
				}
				now := time.Now()
				t.mu.Lock()
				if e.Operation() == jetstream.KeyValuePut {
					if n, err := kv.Decode[kv.Node](e.Key(), e.Value()); err == nil {
						t.nodes[e.Key()] = n
					}
				} else {
					delete(t.nodes, e.Key())
					t.nodesGone[e.Key()] = now
				}
				t.signal()
				t.mu.Unlock()
			}
		}
	}()
	return nil
}

// waitFor waits until cond (called under the tracker's lock) holds.
func (t *tracker) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.After(timeout)
	for {
		t.mu.Lock()
		ok := cond()
		changed := t.changed
		t.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		case <-changed:
		}
	}
}

// publish sends requests asynchronously and returns their ids and publish
// times.
func publish(ctx context.Context, js jetstream.JetStream, prefix string, labels [][]string) ([]string, map[string]time.Time, error) {
	ids := make([]string, len(labels))
	sent := make(map[string]time.Time, len(labels))
	var futures []jetstream.PubAckFuture
	for i, ls := range labels {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		ids[i] = id
		data, _ := json.Marshal(events.RequestMessage{ID: id, Labels: ls, Requestor: "nodepool-bench"})
		sent[id] = time.Now()
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: events.NewRequestSubject, Data: data}, jetstream.WithMsgID(id))
		if err != nil {
			return nil, nil, err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, nil, err
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return ids, sent, nil
}

// takeAll takes the nodes of fulfilled requests and deletes the requests,
// many at once.
func takeAll(ctx context.Context, c *client.Client, reqs []kv.Request) ([]string, error) {
	var mu sync.Mutex
	var nodes []string
	var firstErr error
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			for _, nid := range r.Nodes {
				if _, err := c.Take(ctx, nid, r.ID, "nodepool-bench", nil); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					continue
				}
				mu.Lock()
				nodes = append(nodes, nid)
				mu.Unlock()
			}
			if err := c.DeleteRequest(ctx, r.ID); err != nil && !errors.Is(err, kv.ErrNotFound) {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return nodes, firstErr
}

// returnAll gives nodes back, many at once.
func returnAll(ctx context.Context, c *client.Client, nodes []string) error {
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, nid := range nodes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := c.Return(ctx, nid); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// discard is a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
