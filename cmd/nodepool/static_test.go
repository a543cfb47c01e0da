package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// watchNodes watches the node records of a running server.
func watchNodes(t *testing.T, url string) *kv.Cache[kv.Node] {
	t.Helper()
	_, c := connectClient(t, url)
	nodes := kv.NewCache(c.Buckets().Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = nodes.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return nodes
}

// untilNode waits for a node record to satisfy cond.
func untilNode(t *testing.T, nodes *kv.Cache[kv.Node], id string, timeout time.Duration, what string, cond func(kv.Node) bool) {
	t.Helper()
	sub := nodes.Subscribe()
	defer nodes.Unsubscribe(sub)
	waitfor.Until(t, timeout, fmt.Sprintf("node %s: %s", id, what), func() bool {
		e, ok := nodes.Get(id)
		return ok && cond(e.Value)
	}, waitfor.Changes(sub), waitfor.Detail(func() string {
		e, _ := nodes.Get(id)
		return fmt.Sprintf("it is %+v", e.Value)
	}))
}

// A static host that does not answer is listed with its state and why; once
// it answers it is handed out, and given back it is registered again.
func TestCLIStaticHost(t *testing.T) {
	t.Parallel()
	host := sshtest.Start(t)
	host.SetMode(sshtest.Refusing)
	cfg := writeConfig(t, fmt.Sprintf(`
labels:
  - name: static-a
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: %s
            connection-port: %d
            labels: [static-a]
            timeout: 2
`, host.Host, host.Port))
	port := freePort(t)
	p := startRun(t, runEnv(t, t.TempDir(), port), "-c", cfg)
	p.waitLog("launcher running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	cli := map[string]string{"NODEPOOL_NATS_URL": url}
	nodes := watchNodes(t, url)

	var id string
	sub := nodes.Subscribe()
	waitfor.Until(t, 20*time.Second, "the unreachable static host to say so in its node record", func() bool {
		nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.Provider == "rack" && strings.Contains(e.Value.Reason, "unreachable") {
				id = e.Key
			}
			return id == ""
		})
		return id != ""
	}, waitfor.Changes(sub))
	nodes.Unsubscribe(sub)
	out, _, code := nodepool(t, cli, "list")
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "| "+id+" ") {
			line = l
		}
	}
	if code != 0 || !strings.Contains(line, "| init ") || !strings.Contains(line, "is unreachable") || !strings.Contains(line, host.Addr()) {
		t.Errorf("nodepool list does not show the host's state and reason (code %d):\n%s", code, out)
	}

	host.SetMode(sshtest.Up)
	untilNode(t, nodes, id, 20*time.Second, "ready", func(n kv.Node) bool { return n.State == kv.NodeReady })
	out, errOut, code := nodepool(t, cli, "request", "--json", "--timeout", "30s", "static-a")
	if code != 0 {
		t.Fatalf("request: code %d: %s", code, errOut)
	}
	var got []kv.Node
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
		t.Fatalf("request --json: %v\n%s", err, out)
	}
	if got[0].ID != id || got[0].ConnectionPort != host.Port || !slices.Equal(got[0].HostKeys, host.HostKeys()) {
		t.Errorf("node handed out = %+v, want %s with the host's keys %v", got[0], id, host.HostKeys())
	}
	if _, errOut, code := nodepool(t, cli, "return", id); code != 0 {
		t.Fatalf("return: %s", errOut)
	}
	untilNode(t, nodes, id, 20*time.Second, "registered again and ready", func(n kv.Node) bool {
		return n.State == kv.NodeReady && n.Holder == "" && n.AllocatedTo == ""
	})
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("nodepool run exited with %v after SIGTERM", err)
	}
}
