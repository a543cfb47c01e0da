package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// Scenario is one way of loading the system.
type Scenario struct {
	Name        string
	Description string
	// DefaultN is the default size (requests, or nodes for scale).
	DefaultN int
	// Config is the nodepool.yaml the launchers run, for a size n.
	Config func(n int) string
	// Run measures one run on a fresh system.
	Run func(ctx context.Context, o Options, n int) ([]Result, error)
}

const fakeCloud = `
providers:
  - name: bench
    driver: fake
    boot-delay: 0.1
    delete-delay: 0
    %s
    pools:
      - name: main
        max-servers: %d
        labels: [bench]
`

func cloudConfig(labels string, maxServers int, extra string) string {
	return "labels:\n" + labels + fmt.Sprintf(fakeCloud, extra, maxServers)
}

// Scenarios lists the scenarios by name.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name: "fresh", DefaultN: 200,
			Description: "N single-node requests at once for a label with min-ready 0 (max-servers 5000), then every node given back",
			Config:      func(n int) string { return cloudConfig("  - name: bench\n", max(5000, n), "") },
			Run:         runFresh,
		},
		{
			Name: "ready", DefaultN: 100,
			Description: "a label with min-ready 20: N requests one at a time, then N in bursts of 20, served from the ready pool",
			Config:      func(int) string { return cloudConfig("  - name: bench\n    min-ready: 20\n", 5000, "") },
			Run:         runReady,
		},
		{
			Name: "churn", DefaultN: 200,
			Description: "max-servers 20, N requests at once, each node given back as soon as its request is fulfilled",
			Config:      func(int) string { return cloudConfig("  - name: bench\n", 20, "") },
			Run:         runChurn,
		},
		{
			Name: "scale", DefaultN: 10000,
			Description: "N node records (booted by the fake cloud at once): time of `nodepool list`, launcher RSS (with its embedded server unless --replicas), restart time",
			Config:      func(n int) string { return cloudConfig("  - name: bench\n", n+100, "") },
			Run:         runScale,
		},
		{
			Name: "scaleout", DefaultN: 300,
			Description: "cloud calls take 50 ms, max-concurrency 8 per process: N requests with 1 and with 3 launcher processes",
			Config: func(int) string {
				return cloudConfig("  - name: bench\n", 5000, "api-delay: 0.05\n    max-concurrency: 8")
			},
			Run: runScaleout,
		},
		{
			Name: "queued", DefaultN: 10000,
			Description: "max-concurrency 8 and a 0.1 s boot: N requests at once, most of them queued behind the launch slots; deliveries of node changes per request, and the redeliveries among them",
			Config: func(n int) string {
				return cloudConfig("  - name: bench\n", max(5000, n), "max-concurrency: 8")
			},
			Run: runQueued,
		},
		{
			Name: "cloud", DefaultN: 500,
			Description: "a real driver against its cloud on loopback, run by nodepool-devcloud (--cloud: aws or openstack; 50 ms per API call, 2 s boot): N requests at once with 1 and 3 launchers, without and with a rate limit",
			Config: func(n int) string {
				return CloudTargets[defaultCloud()].Config(n, 0)
			},
			Run: runCloud,
		},
	}
}

// Lookup finds a scenario by name.
func Lookup(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// withSystem starts a NATS server of the bench's own (unless o.URL names
// a running system) and launchers, runs fn, and tears it all down.
func withSystem(ctx context.Context, o Options, config string, launchers int, fn func(*System) error) error {
	url := o.URL
	if url == "" && o.Replicas > 1 {
		c, err := startCluster(ctx, o.WorkDir, o.Replicas)
		if err != nil {
			return err
		}
		defer c.Shutdown()
		url = c.URLs()
		o.Env = append(slices.Clone(o.Env), fmt.Sprintf("NODEPOOL_REPLICAS=%d", o.Replicas))
	} else if url == "" {
		ns, err := service.StartEmbedded("127.0.0.1:0", filepath.Join(o.WorkDir, "nats"), discard())
		if err != nil {
			return err
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		url = ns.ClientURL()
	}
	s, err := startSystem(ctx, o, config, launchers, false, url)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

// finish fills in what every result carries: launcher usage, the KV update
// rate on the same server, and the ratio.
func finish(ctx context.Context, s *System, r *Result) {
	r.LauncherCPU, r.LauncherPeakRSS = s.usage(ctx)
	// The nodes bucket's replicas as the servers report them (its leader
	// and the replicas following it): what the figures were measured on.
	if info, err := s.JS.Stream(ctx, "KV_"+kv.BucketNodes); err == nil {
		peers := 1
		if cl := info.CachedInfo().Cluster; cl != nil {
			peers += len(cl.Replicas)
		}
		r.addExtra(map[string]float64{"replicas": float64(peers)})
	}
	rate, err := KVUpdateRate(ctx, s.JS, int(r.Extra["replicas"]), 2*time.Second)
	if err == nil && rate > 0 {
		r.KVUpdateRate = rate
		r.Ratio = r.Throughput / rate
	}
}

// waitDone waits until every id has a final record; it returns the records.
func waitDone(ctx context.Context, t *tracker, ids []string, timeout time.Duration) ([]kv.Request, error) {
	err := t.waitFor(ctx, timeout, fmt.Sprintf("%d requests to finish", len(ids)), func() bool {
		for _, id := range ids {
			if _, ok := t.done[id]; !ok {
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]kv.Request, 0, len(ids))
	for _, id := range ids {
		r := t.final[id]
		if r.State != kv.RequestFulfilled {
			return nil, fmt.Errorf("request %s %s: %s", id, r.State, r.Reason)
		}
		out = append(out, r)
	}
	return out, nil
}

// latencies measures each request from publish to fulfilled.
func latencies(t *tracker, ids []string, sent map[string]time.Time) (Stats, time.Time, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ds []time.Duration
	first, last := time.Time{}, time.Time{}
	for _, id := range ids {
		ds = append(ds, t.done[id].Sub(sent[id]))
		if first.IsZero() || sent[id].Before(first) {
			first = sent[id]
		}
		if t.done[id].After(last) {
			last = t.done[id]
		}
	}
	return Summarise(ds), first, last
}

// giveBack returns nodes and measures until their records are gone.
func giveBack(ctx context.Context, s *System, t *tracker, nodes []string) (time.Duration, error) {
	start := time.Now()
	if err := returnAll(ctx, s.Client, nodes); err != nil {
		return 0, err
	}
	err := t.waitFor(ctx, 5*time.Minute, "returned nodes deleted", func() bool {
		for _, n := range nodes {
			if _, there := t.nodes[n]; there {
				return false
			}
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	for _, n := range nodes {
		if t.nodesGone[n].After(last) {
			last = t.nodesGone[n]
		}
	}
	return last.Sub(start), nil
}

func single(n int) [][]string {
	labels := make([][]string, n)
	for i := range labels {
		labels[i] = []string{"bench"}
	}
	return labels
}

// batch publishes n single-node requests at once, waits for all, takes
// every node, gives them all back and measures until their records are
// gone.
func batch(ctx context.Context, s *System, prefix string, n int, timeout time.Duration) (Result, error) {
	t := newTracker()
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := t.watch(tctx, s.Client); err != nil {
		return Result{}, err
	}
	ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()), single(n))
	if err != nil {
		return Result{}, err
	}
	reqs, err := waitDone(ctx, t, ids, timeout)
	if err != nil {
		return Result{}, err
	}
	lat, first, last := latencies(t, ids, sent)
	nodes, err := takeAll(ctx, s.Client, reqs)
	if err != nil {
		return Result{}, err
	}
	cleanup, err := giveBack(ctx, s, t, nodes)
	if err != nil {
		return Result{}, err
	}
	res := Result{Requests: n, Makespan: last.Sub(first), Throughput: float64(n) / last.Sub(first).Seconds(), Latency: lat, Cleanup: cleanup}
	finish(ctx, s, &res)
	return res, nil
}

func runFresh(ctx context.Context, o Options, n int) ([]Result, error) {
	sc, _ := Lookup("fresh")
	var res Result
	err := withSystem(ctx, o, sc.Config(n), 1, func(s *System) error {
		var err error
		res, err = batch(ctx, s, "fresh", n, 5*time.Minute)
		res.Scenario, res.Launchers = "fresh", 1
		return err
	})
	return []Result{res}, err
}

// readyNodes counts unallocated ready nodes (under the tracker's lock).
func readyNodes(t *tracker) int {
	n := 0
	for _, nd := range t.nodes {
		if nd.State == kv.NodeReady && nd.AllocatedTo == "" {
			n++
		}
	}
	return n
}

func runReady(ctx context.Context, o Options, n int) ([]Result, error) {
	sc, _ := Lookup("ready")
	var out []Result
	err := withSystem(ctx, o, sc.Config(n), 1, func(s *System) error {
		t := newTracker()
		tctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if err := t.watch(tctx, s.Client); err != nil {
			return err
		}
		refilled := func() error {
			return t.waitFor(ctx, time.Minute, "20 ready nodes", func() bool { return readyNodes(t) >= 20 })
		}
		if err := refilled(); err != nil {
			return err
		}
		prefix := fmt.Sprintf("ready%d", time.Now().UnixNano())
		// One at a time.
		var allIDs []string
		allSent := map[string]time.Time{}
		start := time.Now()
		for i := range n {
			ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("%s-one%d", prefix, i), single(1))
			if err != nil {
				return err
			}
			reqs, err := waitDone(ctx, t, ids, time.Minute)
			if err != nil {
				return err
			}
			allIDs = append(allIDs, ids...)
			allSent[ids[0]] = sent[ids[0]]
			nodes, err := takeAll(ctx, s.Client, reqs)
			if err != nil {
				return err
			}
			if err := returnAll(ctx, s.Client, nodes); err != nil {
				return err
			}
			if err := refilled(); err != nil {
				return err
			}
		}
		lat, _, _ := latencies(t, allIDs, allSent)
		one := Result{Scenario: "ready, one at a time", Launchers: 1, Requests: n, Makespan: time.Since(start),
			Throughput: float64(n) / time.Since(start).Seconds(), Latency: lat}
		finish(ctx, s, &one)
		out = append(out, one)

		// Bursts of 20, each once the pool is full again.
		allIDs, allSent = nil, map[string]time.Time{}
		start = time.Now()
		for b := 0; b*20 < n; b++ {
			ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("%s-burst%d", prefix, b), single(20))
			if err != nil {
				return err
			}
			reqs, err := waitDone(ctx, t, ids, time.Minute)
			if err != nil {
				return err
			}
			allIDs = append(allIDs, ids...)
			for k, v := range sent {
				allSent[k] = v
			}
			nodes, err := takeAll(ctx, s.Client, reqs)
			if err != nil {
				return err
			}
			if err := returnAll(ctx, s.Client, nodes); err != nil {
				return err
			}
			if err := refilled(); err != nil {
				return err
			}
		}
		lat, _, _ = latencies(t, allIDs, allSent)
		burst := Result{Scenario: "ready, bursts of 20", Launchers: 1, Requests: len(allIDs), Makespan: time.Since(start),
			Throughput: float64(len(allIDs)) / time.Since(start).Seconds(), Latency: lat}
		finish(ctx, s, &burst)
		out = append(out, burst)
		return nil
	})
	return out, err
}

func runChurn(ctx context.Context, o Options, n int) ([]Result, error) {
	sc, _ := Lookup("churn")
	var res Result
	err := withSystem(ctx, o, sc.Config(n), 1, func(s *System) error {
		t := newTracker()
		tctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if err := t.watch(tctx, s.Client); err != nil {
			return err
		}
		ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("churn%d", time.Now().UnixNano()), single(n))
		if err != nil {
			return err
		}
		// A requestor per request: take the node the moment the request is
		// fulfilled, and give it back at once.
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		var returned []string
		for _, id := range ids {
			wg.Go(func() {
				reqs, err := waitDone(ctx, t, []string{id}, 5*time.Minute)
				if err == nil {
					var nodes []string
					if nodes, err = takeAll(ctx, s.Client, reqs); err == nil {
						err = returnAll(ctx, s.Client, nodes)
						mu.Lock()
						returned = append(returned, nodes...)
						mu.Unlock()
					}
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return firstErr
		}
		// Done when the last node given back is gone.
		if err := t.waitFor(ctx, 5*time.Minute, "all nodes gone", func() bool {
			for _, nd := range returned {
				if _, there := t.nodes[nd]; there {
					return false
				}
			}
			return true
		}); err != nil {
			return err
		}
		lat, first, _ := latencies(t, ids, sent)
		makespan := time.Since(first)
		res = Result{Scenario: "churn", Launchers: 1, Requests: n, Makespan: makespan,
			Throughput: float64(n) / makespan.Seconds(), Latency: lat}
		finish(ctx, s, &res)
		return nil
	})
	return []Result{res}, err
}

func runScale(ctx context.Context, o Options, n int) ([]Result, error) {
	sc, _ := Lookup("scale")
	// Unreplicated, the launcher runs the embedded server, so its RSS
	// includes it; with --replicas it runs against the bench's cluster,
	// as in production, and its RSS is its own.
	url, embedded := "", o.URL == ""
	if o.URL == "" && o.Replicas > 1 {
		c, err := startCluster(ctx, o.WorkDir, o.Replicas)
		if err != nil {
			return nil, err
		}
		defer c.Shutdown()
		url, embedded = c.URLs(), false
		o.Env = append(slices.Clone(o.Env), fmt.Sprintf("NODEPOOL_REPLICAS=%d", o.Replicas))
	}
	s, err := startSystem(ctx, o, sc.Config(n), 1, embedded, url)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	t := newTracker()
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := t.watch(tctx, s.Client); err != nil {
		return nil, err
	}
	// Requests of up to 200 nodes each.
	var labels [][]string
	for left := n; left > 0; left -= 200 {
		ls := make([]string, min(200, left))
		for i := range ls {
			ls[i] = "bench"
		}
		labels = append(labels, ls)
	}
	start := time.Now()
	ids, sent, err := publish(ctx, s.JS, fmt.Sprintf("scale%d", time.Now().UnixNano()), labels)
	if err != nil {
		return nil, err
	}
	reqs, err := waitDone(ctx, t, ids, 30*time.Minute)
	if err != nil {
		return nil, err
	}
	launched := time.Since(start)
	lat, _, _ := latencies(t, ids, sent)
	if _, err := takeAll(ctx, s.Client, reqs); err != nil {
		return nil, err
	}
	res := Result{Scenario: fmt.Sprintf("scale, %d nodes", n), Launchers: 1, Requests: len(ids), Makespan: launched,
		Throughput: float64(n) / launched.Seconds(), Latency: lat, Extra: map[string]float64{}}
	res.LauncherCPU, res.LauncherPeakRSS = s.usage(ctx)
	if len(s.procs) > 0 {
		res.Extra["launcher_rss_mib"] = float64(currentRSS(s.procs[0].Cmd.Process.Pid)) / (1 << 20)
	}

	// `nodepool list` of every node, as an operator runs it.
	listStart := time.Now()
	cmd := exec.CommandContext(ctx, o.Binary, "list")
	cmd.Env = append(os.Environ(), "NODEPOOL_NATS_URL="+s.URL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nodepool list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	res.Extra["list_seconds"] = time.Since(listStart).Seconds()
	res.Extra["list_lines"] = float64(countLines(out))

	// Restart the launcher: from start to serving a new request. Against
	// a cluster, the JetStream API requests the restart makes (the
	// bench's own probe among them) are counted as the servers see them.
	if len(s.procs) > 0 {
		s.stopLauncher(s.procs[0])
		var requests atomic.Int64
		if !embedded {
			sub, err := s.NC.Subscribe("$JS.API.>", func(*nats.Msg) { requests.Add(1) })
			if err != nil {
				return nil, err
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := s.NC.Flush(); err != nil {
				return nil, err
			}
		}
		restart := time.Now()
		if _, err := s.startLauncher(ctx, "bench-launcher-0"); err != nil {
			return nil, err
		}
		if embedded {
			// The server went down with the launcher that embeds it:
			// connect afresh once it is back.
			s.NC.Close()
			if err := s.connect(ctx); err != nil {
				return nil, err
			}
		}
		if err := s.waitLaunchers(ctx, 1); err != nil {
			return nil, err
		}
		// The bench's watches may have missed the restart of the server
		// the launcher embeds: wait on the probe with a fresh watch.
		probe, _, err := publish(ctx, s.JS, fmt.Sprintf("probe%d", time.Now().UnixNano()), single(1))
		if err != nil {
			return nil, err
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
		_, err = s.Client.Wait(wctx, probe[0])
		wcancel()
		if err != nil {
			return nil, err
		}
		res.Extra["restart_seconds"] = time.Since(restart).Seconds()
		if !embedded {
			res.Extra["restart_api_requests"] = float64(requests.Load())
		}
	}
	rate, err := KVUpdateRate(ctx, s.JS, 1, 2*time.Second)
	if err == nil && rate > 0 {
		res.KVUpdateRate, res.Ratio = rate, res.Throughput/rate
	}
	return []Result{res}, nil
}

// currentRSS reads a process's resident set size now.
func currentRSS(pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			_, _ = fmt.Sscanf(rest, "%d", &kb)
			return kb * 1024
		}
	}
	return 0
}

func countLines(b []byte) int { return strings.Count(string(b), "\n") }

func runScaleout(ctx context.Context, o Options, n int) ([]Result, error) {
	if o.URL != "" {
		return nil, errors.New("scaleout starts its own launchers; it cannot drive a running system")
	}
	sc, _ := Lookup("scaleout")
	var out []Result
	for _, launchers := range []int{1, 3} {
		dir := filepath.Join(o.WorkDir, fmt.Sprintf("launchers-%d", launchers))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		oo := o
		oo.WorkDir = dir
		var res Result
		err := withSystem(ctx, oo, sc.Config(n), launchers, func(s *System) error {
			var err error
			res, err = batch(ctx, s, "scaleout", n, 10*time.Minute)
			res.Scenario, res.Launchers = fmt.Sprintf("scaleout, %d launcher(s)", launchers), launchers
			return err
		})
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	if len(out) == 2 && out[0].Throughput > 0 {
		out[1].addExtra(map[string]float64{"speedup_vs_1": out[1].Throughput / out[0].Throughput})
	}
	return out, nil
}

// oldLifecycleConsumer is the consumer of every node change that versions
// before the work stream ran: the bench counts it when it drives one.
const oldLifecycleConsumer = "node-lifecycle"

// counts are what the node-lifecycle consumer (of versions before the
// work stream) and the work stream's consumers have delivered, and how
// many node record writes and work messages there have been.
type counts struct {
	lifecycle, writes, work, workMsgs uint64
}

// deliveryCounts reads the counts (a consumer a launcher has not made yet
// has delivered nothing).
func deliveryCounts(ctx context.Context, s *System) (counts, error) {
	var c counts
	var err error
	if c.writes, err = lastSeq(ctx, s, "KV_"+kv.BucketNodes); err != nil {
		return c, err
	}
	if c.workMsgs, err = lastSeq(ctx, s, events.WorkStream); err != nil {
		return c, err
	}
	lc, err := s.JS.Consumer(ctx, "KV_"+kv.BucketNodes, oldLifecycleConsumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return c, fmt.Errorf("the %s consumer: %w", oldLifecycleConsumer, err)
	default:
		ci, err := lc.Info(ctx)
		if err != nil {
			return c, err
		}
		c.lifecycle = ci.Delivered.Consumer
	}
	st, err := s.JS.Stream(ctx, events.WorkStream)
	if err != nil {
		return c, err
	}
	infos := st.ListConsumers(ctx)
	for ci := range infos.Info() {
		c.work += ci.Delivered.Consumer
	}
	return c, infos.Err()
}

// lastSeq is a stream's last sequence (0 if it does not exist yet).
func lastSeq(ctx context.Context, s *System, stream string) (uint64, error) {
	st, err := s.JS.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return si.State.LastSeq, nil
}

// runQueued measures what a queue of launches behind max-concurrency
// costs in deliveries: each launch is delivered once to a launch consumer
// when a slot frees, each delete once (before the work stream, every node
// record write was delivered to the node-lifecycle consumer, and a launch
// without a free slot again and again).
func runQueued(ctx context.Context, o Options, n int) ([]Result, error) {
	sc, _ := Lookup("queued")
	var res Result
	err := withSystem(ctx, o, sc.Config(n), 1, func(s *System) error {
		c0, err := deliveryCounts(ctx, s)
		if err != nil {
			return err
		}
		res, err = batch(ctx, s, "queued", n, 30*time.Minute)
		res.Scenario, res.Launchers = "queued", 1
		if err != nil {
			return err
		}
		c1, err := deliveryCounts(ctx, s)
		if err != nil {
			return err
		}
		per := func(a, b uint64) float64 { return float64(b-a) / float64(n) }
		lifecycle, writes := per(c0.lifecycle, c1.lifecycle), per(c0.writes, c1.writes)
		work, workMsgs := per(c0.work, c1.work), per(c0.workMsgs, c1.workMsgs)
		redelivered := max(0, work-workMsgs)
		if lifecycle > 0 {
			redelivered += max(0, lifecycle-writes)
		}
		res.addExtra(map[string]float64{
			"deliveries_per_request":           lifecycle + work,
			"lifecycle_deliveries_per_request": lifecycle,
			"work_deliveries_per_request":      work,
			"work_messages_per_request":        workMsgs,
			"writes_per_request":               writes,
			"redeliveries_per_request":         redelivered,
			"redeliveries_per_minute":          redelivered * float64(n) / res.Makespan.Minutes(),
		})
		return nil
	})
	return []Result{res}, err
}

// Median summarises several runs of one measurement: median, min, max.
type Median struct {
	Median, Min, Max float64
}

// Summarize takes the median, min and max of values.
func Summarize(values []float64) Median {
	if len(values) == 0 {
		return Median{}
	}
	v := slices.Clone(values)
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Median{Median: m, Min: v[0], Max: v[len(v)-1]}
}
