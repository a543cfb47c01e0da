package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// reloadConfig is the configuration of the reload test; %s are what
// changes between its versions.
const reloadConfig = `
labels:
  - name: slow
  - name: b
    min-ready: %d
  - name: c
providers:
  - name: steady
    driver: fake
    cloud: steady
    boot-delay: 3
    pools:
      - name: main
        max-servers: 5
        labels: [slow]
  - name: second
    driver: fake
    cloud: second
    boot-delay: 0.1
    pools:
      - name: keep
        labels: [b]
%s
%s`

const secondGone = `      - name: gone
        labels: [c]`

const addedProvider = `  - name: added
    driver: fake
    cloud: added
    boot-delay: 0.1
    pools:
      - name: main
        labels: [c]`

// replaceFile writes a file as editors do: a new file renamed over it.
func replaceFile(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// countLog counts the log lines containing s.
func (p *proc) countLog(s string) int {
	return strings.Count(p.output(), s)
}

// waitLogCount waits until s was logged n times.
func (p *proc) waitLogCount(s string, n int, timeout time.Duration) {
	p.t.Helper()
	if err := p.untilLog(fmt.Sprintf("%q %d times", s, n), timeout, func(out string) bool { return strings.Count(out, s) >= n }); err != nil {
		p.t.Fatal(err)
	}
}

// SIGHUP and a change of the file reload the configuration in a running
// process: a provider added, a pool removed, a label changed take effect;
// a launch in flight on an unchanged provider completes, once; a broken
// file is refused with every error logged and the old configuration keeps
// running. SIGUSR2 dumps every goroutine's stack to the log.
func TestReloadAndSignals(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(reloadConfig, 0, secondGone, ""))
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	env["NODEPOOL_ROLES"] = "launcher"
	env["NODEPOOL_LOG_LEVEL"] = "info" // the default: the operator's lines are at info
	p := startRun(t, env, "-c", cfg)
	p.waitLog("launcher running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	rec := watchRecords(t, url, "steady")
	cli := map[string]string{"NODEPOOL_NATS_URL": url}
	ctx := t.Context()

	// A launch in flight on the provider that stays as it is.
	if _, err := rec.client.Submit(ctx, events.RequestMessage{ID: "slow-1", Labels: []string{"slow"}, Requestor: "tester"}); err != nil {
		t.Fatal(err)
	}
	rec.until(20*time.Second, "the slow launch booting", func() bool { return rec.booting() == 1 })

	// Add a provider, remove a pool, change a label (min-ready 0 -> 1).
	replaceFile(t, cfg, fmt.Sprintf(reloadConfig, 1, "", addedProvider))
	p.waitLog(`msg="configuration reloaded"`, 20*time.Second)
	if !strings.Contains(p.output(), "providers_added=[added] providers_changed=[second] providers_removed=[]") {
		t.Errorf("the reload's summary is not in the log:\n%s", p.output())
	}
	rec.until(30*time.Second, "the slow request fulfilled", func() bool {
		r, ok := rec.requests.Get("slow-1")
		return ok && r.Value.State == kv.RequestFulfilled
	})
	if n := rec.instancesEverCreated("steady"); n != 1 {
		t.Errorf("the launch in flight made %d instances, want 1", n)
	}
	if n := p.countLog(`msg="request fulfilled" id=`); n < 1 {
		t.Errorf("no request fulfilled line")
	}
	// The added provider serves; the changed label's min-ready node comes.
	if _, err := rec.client.Submit(ctx, events.RequestMessage{ID: "c-1", Labels: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	rec.until(20*time.Second, "c-1 fulfilled by the added provider, and a min-ready node of b", func() bool {
		r, ok := rec.requests.Get("c-1")
		readyB := false
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			readyB = readyB || (e.Value.Labels[0] == "b" && e.Value.State == kv.NodeReady)
			return !readyB
		})
		return ok && r.Value.State == kv.RequestFulfilled && r.Value.Provider == "added" && readyB
	})
	out, _, _ := nodepool(t, cli, "label-list")
	if strings.Contains(out, "second/gone") || !strings.Contains(out, "added/main") {
		t.Errorf("label-list after the reload still shows the removed pool, or not the added one:\n%s", out)
	}

	// A broken file: every error logged, the configuration in force runs on.
	replaceFile(t, cfg, "labels:\n  - name: x\n    min-ready: many\nproviders:\n  - name: q\n    driver: nope\n")
	p.waitLog("configuration not reloaded; the one in force keeps running", 20*time.Second)
	for _, want := range []string{`min-ready: expected an integer, got \"many\"`, `unknown driver \"nope\"`} {
		if !strings.Contains(p.output(), want) {
			t.Errorf("the log does not say %s:\n%s", want, p.output())
		}
	}
	if _, err := rec.client.Submit(ctx, events.RequestMessage{ID: "c-2", Labels: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	rec.until(20*time.Second, "c-2 fulfilled under the old configuration", func() bool {
		r, ok := rec.requests.Get("c-2")
		return ok && r.Value.State == kv.RequestFulfilled
	})

	// SIGHUP with the good file back.
	good := fmt.Sprintf(reloadConfig, 1, "", addedProvider)
	replaceFile(t, cfg, good)
	p.waitLogCount(`msg="configuration reloaded"`, 2, 20*time.Second)
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLogCount(`msg="configuration reloaded"`, 3, 20*time.Second)

	// SIGUSR2: every goroutine's stack, between a log line and an end mark.
	_ = p.cmd.Process.Signal(syscall.SIGUSR2)
	p.waitLog("-- end of stack dump", 20*time.Second)
	dump := p.output()[strings.Index(p.output(), "stack dump (SIGUSR2) follows"):]
	if !strings.Contains(dump, "goroutine 1 [") || !strings.Contains(dump, "main.(*app).run") {
		t.Errorf("the stack dump lacks the main goroutine:\n%.2000s", dump)
	}

	// The operator's lines at the default level, with their ids.
	for _, re := range []string{
		`msg="launch started" .*node=\w+ provider=steady pool=main label=slow request=slow-1`,
		`msg="node ready" .*node=\w+ provider=steady pool=main label=slow request=slow-1`,
		`msg="request fulfilled" .*request=slow-1 provider=steady pool=main nodes=\[\w+\]`,
	} {
		if !regexp.MustCompile(re).MatchString(p.output()) {
			t.Errorf("no log line matching %s", re)
		}
	}
	if err := p.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
}

// statusAddr is where a process's status API listens, from its log.
func (p *proc) statusAddr() string {
	p.t.Helper()
	p.waitLog(`msg="status API listening"`, 30*time.Second)
	m := regexp.MustCompile(`msg="status API listening".* addr=(\S+)`).FindStringSubmatch(p.output())
	if m == nil {
		p.t.Fatalf("no status address in the log:\n%s", p.output())
	}
	return m[1]
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Two launchers on one system: the labelled launch series appear in the
// process that launched, the gauges of the whole system in exactly one of
// the two; both send Nodepool's statsd names to a real UDP socket.
func TestMetricsAndStatsd(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	url := srv.ClientURL()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = udp.Close() })
	packets := make(chan string, 1000)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := udp.ReadFrom(buf)
			if err != nil {
				close(packets)
				return
			}
			packets <- string(buf[:n])
		}
	}()
	cfg := writeConfig(t, fmt.Sprintf(cliConfig, "0.1"))
	var procs []*proc
	for _, id := range []string{"m1", "m2"} {
		env := launcherEnv(url, id)
		env["NODEPOOL_HTTP_ADDR"] = "127.0.0.1:0"
		env["STATSD_HOST"] = "127.0.0.1"
		env["STATSD_PORT"] = fmt.Sprint(udp.LocalAddr().(*net.UDPAddr).Port)
		procs = append(procs, startRun(t, env, "-c", cfg))
	}
	addrs := []string{procs[0].statusAddr(), procs[1].statusAddr()}
	rec := watchRecords(t, url, "cloud1")
	if _, err := rec.client.Submit(t.Context(), events.RequestMessage{ID: "big-1", Labels: []string{"big"}, Requestor: "zuul.tenant:a"}); err != nil {
		t.Fatal(err)
	}
	rec.until(30*time.Second, "big-1 fulfilled", func() bool {
		r, ok := rec.requests.Get("big-1")
		return ok && r.Value.State == kv.RequestFulfilled
	})

	launch := regexp.MustCompile(`nodepool_launch_duration_seconds_count\{az="fake-az",image="",label="big",provider="cloud1",result="ready"\} 1`)
	launched, system, calls := 0, 0, 0
	waitfor.Until(t, 20*time.Second, "one process to show the launch and one the system gauges", func() bool {
		// The launch and its driver calls are counted by the process
		// that ran it; the system gauges by the one that leads cleanup,
		// which may be the other one.
		launched, system, calls = 0, 0, 0
		for _, a := range addrs {
			m := scrape(t, a)
			if launch.MatchString(m) {
				launched++
			}
			if strings.Contains(m, `nodepool_driver_call_duration_seconds_count{method="create",provider="cloud1"}`) {
				calls++
			}
			if strings.Contains(m, `nodepool_nodes{pool="main",provider="cloud1",state="ready"}`) &&
				strings.Contains(m, `nodepool_label_nodes{label="big",provider="cloud1",state="ready"} 1`) &&
				strings.Contains(m, `nodepool_pool_quota_limit{pool="main",provider="cloud1",resource="instances"} 20`) {
				system++
			}
		}
		return launched == 1 && system == 1 && calls >= 1
	}, waitfor.Every(100*time.Millisecond), // scrapes are polled, as Prometheus does
		waitfor.Detail(func() string {
			return fmt.Sprintf("after the launch: %d processes show the launch (want 1), %d the system gauges (want 1), %d create calls (want 1 or more)\n%s\n----\n%s",
				launched, system, calls, scrape(t, addrs[0]), scrape(t, addrs[1]))
		}))

	// Nodepool's statsd names, the requestor normalized as Nodepool does.
	want := map[string]bool{
		"nodepool.launch.ready:1|c": false, "nodepool.launch.provider.cloud1.ready:1|c": false,
		"nodepool.launch.provider.cloud1.fake-az.ready:1|c": false, "nodepool.launch.requestor.zuul_tenant_a.ready:1|c": false,
		"nodepool.launch.ready:": false, "nodepool.nodes.ready:": false, "nodepool.label.big.nodes.ready:": false,
		"nodepool.provider.cloud1.pool.main.addressable_requests:": false, "nodepool.provider.cloud1.max_servers:20|g": false,
	}
	timeout := time.After(20 * time.Second)
	for missing := len(want); missing > 0; {
		select {
		case pkt, ok := <-packets:
			if !ok {
				t.Fatal("the UDP socket closed")
			}
			for _, line := range strings.Split(pkt, "\n") {
				for w, seen := range want {
					if !seen && strings.HasPrefix(line, w) {
						want[w] = true
						missing--
					}
				}
			}
		case <-timeout:
			t.Fatalf("statsd lines never received: %v", want)
		}
	}
}
