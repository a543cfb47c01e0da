package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

const metaCLIConfig = `
labels:
  - name: big
  - name: small
providers:
  - name: cloud
    driver: fake
    boot-delay: 1.5
    delete-delay: 0.2
    pools:
      - name: main
        labels: [big]
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 4
            grace-time: 1
`

// `nodepool run` killed while backing nodes boot, and started again on the
// same data: every carved node is served, each backing node was created
// once, and once everything is given back nothing is left.
func TestRunMetastaticKilled(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, metaCLIConfig)
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	env["NODEPOOL_ID"] = "launcher-a"
	p := startRun(t, env, "-c", cfg)
	p.waitLog("launcher running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	_, c := connectClient(t, url)
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("m%d", i)
		if _, err := c.JetStream().Publish(t.Context(), "nodepool.requests.new", fmt.Appendf(nil, `{"id": %q, "labels": ["small"]}`, id)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	func() {
		rec := watchRecords(t, url, "cloud")
		rec.until(20*time.Second, "two backing nodes booting", func() bool { return rec.booting() == 2 })
	}()
	_ = p.stop(syscall.SIGKILL, 20*time.Second)

	p2 := startRun(t, env, "-c", cfg)
	p2.waitLog("launcher running", 30*time.Second)
	rec := watchRecords(t, url, "cloud")
	rec.until(30*time.Second, "every request done", func() bool {
		for _, id := range ids {
			e, ok := rec.requests.Get(id)
			if !ok || !e.Value.Done() {
				return false
			}
		}
		return true
	})
	var carved []string
	for _, id := range ids {
		e, _ := rec.requests.Get(id)
		if e.Value.State != kv.RequestFulfilled {
			t.Fatalf("request %s is %s: %s", id, e.Value.State, e.Value.Reason)
		}
		for _, nid := range e.Value.Nodes {
			if _, err := c.Take(t.Context(), nid, id, "tester", nil); err != nil {
				t.Fatal(err)
			}
			carved = append(carved, nid)
		}
		if err := c.DeleteRequest(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.instancesEverCreated("cloud"); got != 2 {
		t.Errorf("%d backing instances created for 6 nodes of 4 slots, want 2", got)
	}
	for _, nid := range carved {
		if err := c.Return(t.Context(), nid); err != nil {
			t.Fatal(err)
		}
	}
	rec.until(30*time.Second, "every node, request and instance gone", func() bool {
		return rec.nodes.Len() == 0 && rec.requests.Len() == 0 && rec.instances.Len() == 0
	})
	_ = p2.stop(syscall.SIGTERM, 20*time.Second)
}
