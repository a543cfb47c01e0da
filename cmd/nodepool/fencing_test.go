package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// fencingConfig: cloud1's launches take 30 s to boot and give up after 28 s
// (a trap: a launch resumed by another launcher after 2 s or more boots in
// time; the launcher that started it, were it still driving, would give
// it up and delete its instance while the other drives it). cloud2 serves
// the requests made after that. The boots are long so that the launches
// are still booting when launcher-1 is cut off, after launcher-2 started:
// with 12 s, on a loaded machine (a second launcher taking 14 s to start),
// three of four were ready before the cut, and the test waited for
// launcher-2 to take over launches that had ended.
const fencingConfig = `
labels: [{name: small}, {name: other}]
providers:
  - name: cloud1
    driver: fake
    boot-delay: 30
    boot-timeout: 28
    launch-retries: 2
    pools: [{name: main, max-servers: 10, labels: [small]}]
  - name: cloud2
    driver: fake
    boot-delay: 0.2
    pools: [{name: main, max-servers: 10, labels: [other]}]
`

// A launcher cut off from NATS for longer than its lease, in the middle of
// its launches, while another launcher takes them over; then it comes
// back while the other still drives them. As long as the other launcher
// owns a launch, the cut-off one sends nothing that changes the node or
// its instance: it stopped driving its machines before they could be
// taken over, and what it had on its way is not delivered late. Every
// launch ends once, by its new owner.
//
// The cut-off launcher reaches NATS through a proxy that sees what it
// publishes, as the server receives it. Two ways to lose NATS: its
// connection is cut (its server died; the client reconnects when it
// comes back and would send what it buffered meanwhile), or stalled (a
// partition: nothing moves, and what was sent arrives once it heals).
func TestFencingCutOffLauncher(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cut", "stall"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testFencing(t, mode)
		})
	}
}

func testFencing(t *testing.T, mode string) {
	srv := natstest.Start(t)
	proxy := natstest.StartProxy(t, srv)
	cfg := writeConfig(t, fencingConfig)
	const ttl = 2 * time.Second
	env := func(id string) map[string]string {
		url := srv.ClientURL()
		if id == "launcher-1" {
			url = proxy.URL()
		}
		return map[string]string{
			"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher", "NODEPOOL_HTTP_ADDR": "",
			"NODEPOOL_LEASE_TTL": ttl.String(), "NODEPOOL_SYNC_INTERVAL": "500ms",
		}
	}
	fl := startFleet(t, cfg, env, "launcher-1")
	rec := watchRecords(t, srv.ClientURL(), "cloud1")
	audit, stopAudit := startAuditor(t, rec, limits{
		maxServers: map[string]int{"main": 10},
		cleanup:    20 * time.Second, stuck: 60 * time.Second, vanished: 3 * time.Second,
	})

	// When launcher-2 drove each node (from when it was first seen owning
	// it building, to when it was first seen otherwise), and which
	// instances each node had. The records' caches may skip revisions (a
	// node bucket keeps one per key, and a lagging watch resumes at the
	// newest), so this follows every write as the server stores it,
	// through a subscription to the buckets' subjects.
	type window struct{ from, to time.Time }
	var mu sync.Mutex
	drove := map[string]*window{}
	readyBy := map[string]string{} // node -> the launcher that made it ready
	instances := map[string][]string{}
	nc, _ := connectClient(t, srv.ClientURL())
	natstest.Writes(t, nc, kv.BucketNodes, ">", func(key string, value []byte, deleted bool) {
		now := time.Now()
		var n kv.Node
		if !deleted {
			if err := json.Unmarshal(value, &n); err != nil {
				t.Errorf("node %s: %v", key, err)
				return
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if n.State == kv.NodeReady && readyBy[key] == "" {
			readyBy[key] = n.Launcher
		}
		w := drove[key]
		driving := n.Launcher == "launcher-2" && n.State == kv.NodeBuilding
		switch {
		case w == nil && driving:
			drove[key] = &window{from: now}
		case w != nil && w.to.IsZero() && !driving:
			w.to = now
		}
	})
	seenInst := map[string]bool{}
	natstest.Puts(t, nc, fake.BucketName("cloud1"), ">", func(key string, inst fake.InstanceRecord) {
		mu.Lock()
		defer mu.Unlock()
		if !seenInst[key] {
			seenInst[key] = true
			nid := inst.Tags["nodepool_node_id"]
			instances[nid] = append(instances[nid], key)
		}
	})

	req := newRequestor(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	outcomes := make(chan outcome, 10)
	submit := func(from, n int, label string) {
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("r%d", i)
			wg.Go(func() { outcomes <- req.run(ctx, id, []string{label}, 100, 0) })
		}
	}
	const n = 4
	submit(0, n, "small")
	rec.until(60*time.Second, "every launch booting under launcher-1", func() bool {
		owned := 0
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeBuilding && e.Value.Launcher == "launcher-1" {
				owned++
			}
			return true
		})
		return owned == n && rec.booting() == n
	})
	fl2 := startFleet(t, cfg, env, "launcher-2")

	// launcher-1 loses NATS in the middle of its launches.
	cutAt := time.Now()
	if mode == "cut" {
		proxy.Cut()
	} else {
		proxy.Stall()
	}
	rec.until(60*time.Second, "launcher-2 owning every launch", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(drove) >= n
	})
	t.Logf("launcher-2 owns every launch %s after launcher-1 lost NATS", time.Since(cutAt).Round(time.Millisecond))

	// launcher-1 comes back while launcher-2 still drives its launches.
	proxy.Restore()
	comps := rec.client.Buckets().Components
	waitfor.Until(t, 60*time.Second, "launcher-1 to come back", func() bool {
		_, err := comps.Get(t.Context(), "launcher-1")
		return err == nil
	}, waitfor.Every(50*time.Millisecond))
	rec.until(60*time.Second, "every request fulfilled", func() bool { return audit.fulfilledCount() >= n })
	rec.until(10*time.Second, "every node taken over seen ready", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for nid := range drove {
			if readyBy[nid] == "" {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for nid, w := range drove {
		// (Once ready, the node may already be given back and its delete
		// taken by launcher-1: only who made it ready tells.)
		if by := readyBy[nid]; by != "launcher-2" {
			t.Errorf("node %s was made ready by %q, not by launcher-2 that took it over", nid, by)
		}
		if w.to.IsZero() {
			t.Errorf("launcher-2 still drives node %s", nid)
		}
	}
	mu.Unlock()
	submit(n, 2, "other")
	wg.Wait()
	close(outcomes)
	for o := range outcomes {
		if o.err != nil || o.state != kv.RequestFulfilled {
			t.Errorf("request %s ended %s: %v", o.id, o.state, o.err)
		}
	}
	rec.until(60*time.Second, "every node given back and deleted", func() bool { return rec.nodes.Len() == 0 && rec.instances.Len() == 0 })

	// From launcher-1, nothing that changes a node launcher-2 drove, or
	// any instance of it, while launcher-2 drove it.
	mu.Lock()
	defer mu.Unlock()
	for _, pub := range proxy.Published() {
		for nid, w := range drove {
			touched := pub.Subject == "$KV."+kv.BucketNodes+"."+nid
			for _, inst := range instances[nid] {
				touched = touched || pub.Subject == "$KV."+fake.BucketName("cloud1")+"."+inst
			}
			if touched && pub.Time.After(w.from) && (w.to.IsZero() || pub.Time.Before(w.to)) {
				t.Errorf("launcher-1 sent %s at %s, %s after launcher-2 took node %s over and before it was done with it",
					pub.Subject, pub.Time.Format("15:04:05.000"), pub.Time.Sub(w.from).Round(time.Millisecond), nid)
			}
		}
	}
	stopAudit()
	violations, summary := audit.report()
	t.Log(summary)
	for _, v := range violations {
		t.Error(v)
	}
	if t.Failed() {
		var b strings.Builder
		for _, pub := range proxy.Published() {
			if pub.Time.After(cutAt) && !strings.HasPrefix(pub.Subject, "_INBOX") {
				fmt.Fprintf(&b, "  %s %s\n", pub.Time.Format("15:04:05.000"), pub.Subject)
			}
		}
		t.Logf("launcher-1 published after it lost NATS at %s:\n%s", cutAt.Format("15:04:05.000"), b.String())
	}
	fl.stop()
	fl2.stop()
}
