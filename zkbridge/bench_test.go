package zkbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// The Zuul side of the benchmarks takes Zuul's steps with a Go ZooKeeper
// client (kazoo's lock recipe, as zkbridge writes it), so that the
// client's own speed does not hide the installation's: a request written
// as Zuul's scheduler writes it, its fulfilment seen through a watch, its
// nodes locked, the request deleted, the nodes in-use, used and unlocked,
// their deletion seen through a watch.

type zuulClient struct {
	c      *zkbridge.Conn
	system string
}

func newZuulClient(tb testing.TB, e *env) *zuulClient {
	tb.Helper()
	cfg, err := config.Parse("z.yaml", []byte("labels: []\n"+e.zk.ConfigYAML(e.chroot)))
	if err != nil {
		tb.Fatal(err)
	}
	c, err := zkbridge.Dial(tb.Context(), cfg.ZooKeeper(), testLog(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return &zuulClient{c: c, system: fmt.Sprintf("%016x", rand.Uint64())}
}

// submit writes a request and returns its id.
func (z *zuulClient) submit(labels []string) (string, error) {
	now := float64(time.Now().UnixNano()) / 1e9
	data, _ := json.Marshal(map[string]any{
		"requestor_data": map[string]any{"build_set_uuid": "b", "tenant_name": "tenant-one", "pipeline_name": "check", "job_uuid": "j", "job_name": "job", "span_info": nil},
		"node_types":     labels, "requestor": z.system, "created_time": now, "provider": nil, "state": "requested",
		"state_time": now, "relative_priority": 0, "event_id": "e", "tenant_name": "tenant-one",
	})
	p, err := z.c.Create(zkbridge.RequestsPath+"/200-", data, zk.FlagSequence)
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(p, zkbridge.RequestsPath+"/"), nil
}

// waitRequest waits, through watches, for a request to be fulfilled or
// failed.
func (z *zuulClient) waitRequest(ctx context.Context, id string) (map[string]any, error) {
	for ctx.Err() == nil {
		data, _, ch, err := z.c.GetW(zkbridge.RequestsPath + "/" + id)
		if err != nil {
			return nil, err
		}
		var r map[string]any
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, err
		}
		if r["state"] == "fulfilled" || r["state"] == "failed" {
			return r, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	return nil, ctx.Err()
}

// accept locks the request's nodes and deletes the request, then marks
// the nodes in-use; it returns the locks.
func (z *zuulClient) accept(id string, r map[string]any) ([]*zkbridge.Lock, []string, error) {
	var nodes []string
	for _, n := range r["nodes"].([]any) {
		nodes = append(nodes, n.(string))
	}
	var locks []*zkbridge.Lock
	for _, n := range nodes {
		var l *zkbridge.Lock
		var err error
		for range 100 { // Zuul waits up to 30 s: the bridge never holds it
			if l, err = z.c.TryLockNode(n, ""); !errors.Is(err, zkbridge.ErrLocked) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("locking node %s: %w", n, err)
		}
		locks = append(locks, l)
	}
	if err := z.c.Delete(zkbridge.RequestsPath+"/"+id, -1); err != nil {
		return nil, nil, err
	}
	for _, n := range nodes {
		if err := z.setNodeState(n, "in-use"); err != nil {
			return nil, nil, err
		}
	}
	return locks, nodes, nil
}

func (z *zuulClient) setNodeState(n, state string) error {
	p := zkbridge.NodesPath + "/" + n
	data, _, err := z.c.Get(p)
	if err != nil {
		return err
	}
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		return err
	}
	d["id"], d["state"], d["state_time"] = n, state, float64(time.Now().UnixNano())/1e9
	if state == "in-use" {
		d["user_data"] = map[string]any{"zuul_system": z.system, "project_name": "p"}
	}
	out, _ := json.Marshal(d)
	_, err = z.c.Set(p, out, -1)
	return err
}

// giveBack marks nodes used, unlocks them, and waits for their znodes to
// go.
func (z *zuulClient) giveBack(ctx context.Context, nodes []string, locks []*zkbridge.Lock) error {
	for _, n := range nodes {
		if err := z.setNodeState(n, "used"); err != nil {
			return err
		}
	}
	for _, l := range locks {
		if err := l.Release(); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		for ctx.Err() == nil {
			ok, _, ch, err := z.c.ExistsW(zkbridge.NodesPath + "/" + n)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
			}
		}
	}
	return ctx.Err()
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkZuulBurst: a burst of 200 fresh requests (one node each) from
// Zuul; throughput as Zuul sees it (requests fulfilled per second from the
// first submission to the last fulfilment), submit-to-fulfilled latency,
// and, once Zuul gives every node back, the time until their znodes are
// gone. The fake cloud boots in 0.1 s.
func BenchmarkZuulBurst(b *testing.B) {
	const n = 200
	for range b.N {
		b.StopTimer()
		e := newBenchEnv(b, "")
		e.installation()
		z := newZuulClient(b, e)
		ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
		b.StartTimer()
		start := time.Now()
		lat := make([]time.Duration, n)
		results := make([]map[string]any, n)
		ids := make([]string, n)
		var wg sync.WaitGroup
		var failed sync.Map
		for i := range n {
			wg.Go(func() {
				t0 := time.Now()
				id, err := z.submit([]string{"small"})
				if err != nil {
					failed.Store(i, err)
					return
				}
				r, err := z.waitRequest(ctx, id)
				if err != nil || r["state"] != "fulfilled" {
					failed.Store(i, fmt.Errorf("request %s: %v %v", id, r, err))
					return
				}
				lat[i], results[i], ids[i] = time.Since(t0), r, id
			})
		}
		wg.Wait()
		makespan := time.Since(start)
		failed.Range(func(k, v any) bool { b.Fatal(v); return false })
		b.StopTimer()
		var returned time.Time
		var mu sync.Mutex
		var lastGone time.Time
		for i := range n {
			wg.Go(func() {
				locks, nodes, err := z.accept(ids[i], results[i])
				if err != nil {
					failed.Store(i, err)
					return
				}
				mu.Lock()
				if t := time.Now(); t.After(returned) {
					returned = t
				}
				mu.Unlock()
				if err := z.giveBack(ctx, nodes, locks); err != nil {
					failed.Store(i, err)
					return
				}
				mu.Lock()
				if t := time.Now(); t.After(lastGone) {
					lastGone = t
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		failed.Range(func(k, v any) bool { b.Fatal(v); return false })
		cancel()
		b.ReportMetric(float64(n)/makespan.Seconds(), "req/s")
		b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(lastGone.Sub(returned).Seconds(), "return-to-gone-s")
		e.stopAll()
	}
}

// BenchmarkZuulReady: 100 requests, one at a time, each served from a
// ready node (min-ready 10), taken, used and given back: the latency from
// submission to fulfilment as Zuul sees it, and from giving the node back
// to its znode being gone.
func BenchmarkZuulReady(b *testing.B) {
	const n = 100
	for range b.N {
		b.StopTimer()
		e := newBenchEnv(b, "")
		e.cfg = strings.Replace(e.cfg, "  - name: small\n", "  - name: small\n    min-ready: 10\n", 1)
		e.installation()
		z := newZuulClient(b, e)
		e.waitFor(60*time.Second, "10 ready nodes", func() bool { return len(e.readyFree("small")) >= 10 })
		ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
		b.StartTimer()
		var lat, gone []time.Duration
		for range n {
			e.waitFor(60*time.Second, "a ready node", func() bool { return len(e.readyFree("small")) >= 1 })
			t0 := time.Now()
			id, err := z.submit([]string{"small"})
			if err != nil {
				b.Fatal(err)
			}
			r, err := z.waitRequest(ctx, id)
			if err != nil || r["state"] != "fulfilled" {
				b.Fatalf("request %s: %v %v", id, r, err)
			}
			lat = append(lat, time.Since(t0))
			locks, nodes, err := z.accept(id, r)
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := z.giveBack(ctx, nodes, locks); err != nil {
				b.Fatal(err)
			}
			gone = append(gone, time.Since(t1))
		}
		b.StopTimer()
		cancel()
		b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.95).Microseconds())/1000, "p95-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(percentile(gone, 0.5).Microseconds())/1000, "return-to-gone-p50-ms")
		e.stopAll()
	}
}
