package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/internal/freeport"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// binary is the nodepool command built once for these tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodepool-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "nodepool")
	args := []string{"build", "-o", binary, "."}
	if raceEnabled {
		args = []string{"build", "-race", "-o", binary, "."}
	}
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building nodepool:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// freePort returns a port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ports, err := freeport.Ports(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// proc is a running `nodepool run`.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	more  chan struct{}
	done  chan struct{}
	err   error
}

// startRun starts `nodepool run` with the given environment.
func startRun(t *testing.T, env map[string]string, args ...string) *proc {
	t.Helper()
	return startDaemon(t, env, append([]string{"run"}, args...)...)
}

// startDaemon starts a long-running nodepool command (run, builder).
func startDaemon(t *testing.T, env map[string]string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "NODEPOOL_LOG_LEVEL=debug", "GOTRACEBACK=all")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.more <- struct{}{}:
			default:
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if t.Failed() && !isClosed(p.done) {
			// A failed test may have a process stuck: SIGQUIT makes it
			// print every goroutine's stack (GOTRACEBACK=all) first.
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
			}
		}
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("nodepool run output:\n%s", p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLog waits for a line of the log containing s.
func (p *proc) waitLog(s string, timeout time.Duration) {
	p.t.Helper()
	if err := p.untilLog(fmt.Sprintf("%q", s), timeout, func(out string) bool { return strings.Contains(out, s) }); err != nil {
		p.t.Fatal(err)
	}
}

// untilLog waits until the log so far satisfies ok, re-checking it on
// every line logged; it tells why it did not (the run exited first, or
// the timeout passed), naming what.
func (p *proc) untilLog(what string, timeout time.Duration, ok func(log string) bool) error {
	var held, exited bool
	waitfor.True(timeout, func() bool {
		exited = isClosed(p.done) // the whole log is in once the run exited
		held = ok(p.output())
		return held || exited
	}, waitfor.Wake(p.more, p.done))
	switch {
	case held:
		return nil
	case exited:
		return fmt.Errorf("nodepool run exited (%v) before logging %s", p.err, what)
	}
	return fmt.Errorf("timed out after %s waiting for nodepool run to log %s", timeout, what)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// signal sends a signal and waits for the process to exit.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	p.t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.t.Fatalf("nodepool run did not exit within %s of %v", timeout, sig)
	}
	return nil
}

// nodepool runs an admin command and returns its output and exit code.
func nodepool(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nodepool.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// records watches the node and request buckets and a fake cloud of a
// connectClient connects to a running server, reconnecting through its
// restarts, and returns the connection and a client of the buckets (which
// must exist); the connection closes when the test ends.
func connectClient(t *testing.T, urls string) (*nats.Conn, *client.Client) {
	t.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(t.Context(), nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, c
}

// running server, so tests wait on records.
type records struct {
	t         *testing.T
	nodes     *kv.Cache[kv.Node]
	requests  *kv.Cache[kv.Request]
	instances *kv.Cache[fake.InstanceRecord]
	// instanceStore reads the instances from the server (not the watch).
	instanceStore *kv.Store[fake.InstanceRecord]
	// cloud is the provider whose instances these are.
	cloud  string
	client *client.Client
	js     jetstream.JetStream
}

func watchRecords(t *testing.T, url, cloud string) *records {
	t.Helper()
	_, c := connectClient(t, url)
	js := c.JetStream()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &records{t: t, client: c, js: js, cloud: cloud,
		nodes: kv.NewCache(c.Buckets().Nodes, log), requests: kv.NewCache(c.Buckets().Requests, log)}
	runs := []func(context.Context) error{r.nodes.Run, r.requests.Run}
	if cloud != "" {
		bucket, err := js.KeyValue(t.Context(), fake.BucketName(cloud))
		if err != nil {
			t.Fatal(err)
		}
		r.instanceStore = kv.NewStore[fake.InstanceRecord](bucket)
		r.instances = kv.NewCache(r.instanceStore, log)
		runs = append(runs, r.instances.Run)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range runs {
		wg.Go(func() { _ = run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// until waits for cond, re-checking it on every change of the records
// (and, for a cloud whose instances are not records, every 100 ms).
func (r *records) until(timeout time.Duration, what string, cond func() bool) {
	r.t.Helper()
	sn, sr := r.nodes.Subscribe(), r.requests.Subscribe()
	defer r.nodes.Unsubscribe(sn)
	defer r.requests.Unsubscribe(sr)
	// Conditions may also read what the test's own watchers gathered
	// from the records, which can lag the records: look again now and
	// then too.
	opts := []waitfor.Option{waitfor.Every(100 * time.Millisecond), waitfor.Changes(sn), waitfor.Changes(sr), waitfor.Detail(r.dump)}
	if r.instances != nil {
		si := r.instances.Subscribe()
		defer r.instances.Unsubscribe(si)
		opts = append(opts, waitfor.Changes(si))
	}
	waitfor.Until(r.t, timeout, what, cond, opts...)
}

// dump describes the records, for failure messages.
func (r *records) dump() string {
	var b strings.Builder
	r.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		q := e.Value
		fmt.Fprintf(&b, "request %s %s %v nodes=%v pool=%s/%s reason=%q\n", q.ID, q.State, q.Labels, q.Nodes, q.Provider, q.Pool, q.Reason)
		return true
	})
	r.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		n := e.Value
		exists := "unknown" // a cloud whose instances are not records
		if r.instances != nil {
			_, ok := r.instances.Get(n.ExternalID)
			exists = strconv.FormatBool(ok)
		}
		fmt.Fprintf(&b, "node %s %s %v %s/%s alloc=%q launcher=%q ext=%q (exists %s) age=%s reason=%q\n", n.ID, n.State, n.Labels, n.Provider, n.Pool,
			n.AllocatedTo, n.Launcher, n.ExternalID, exists, time.Since(n.StateTime).Round(time.Millisecond), n.Reason)
		return true
	})
	if r.instances != nil {
		r.instances.Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
			fmt.Fprintf(&b, "instance %s node=%s\n", e.Key, e.Value.Tags["nodepool_node_id"])
			return true
		})
	}
	return b.String()
}

// booting counts instances in the cloud whose node is still building.
func (r *records) booting() int {
	n := 0
	r.instances.Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		if nd, ok := r.nodes.Get(e.Value.Tags["nodepool_node_id"]); ok && nd.Value.State == kv.NodeBuilding {
			n++
		}
		return true
	})
	return n
}

func (r *records) count(state kv.NodeState) int {
	n := 0
	r.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.State == state {
			n++
		}
		return true
	})
	return n
}

func (r *records) instancesEverCreated(cloud string) int {
	r.t.Helper()
	s, err := r.js.Stream(r.t.Context(), "KV_"+fake.BucketName(cloud))
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := s.Info(r.t.Context(), jetstream.WithSubjectFilter(">"))
	if err != nil {
		r.t.Fatal(err)
	}
	return len(info.State.Subjects)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := writeConfig(t, "labels: [{name: a}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [a]}]}]\n")
	out, _, code := nodepool(t, nil, "config-validate", good)
	if code != 0 || !strings.Contains(out, "is valid: 1 labels, 1 providers, 1 pools") {
		t.Errorf("valid file: code %d, output %q", code, out)
	}
	bad := writeConfig(t, "labels:\n  - name: a\n    min-ready: lots\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [a, b]}]}]\n")
	_, errOut, code := nodepool(t, nil, "config-validate", bad)
	if code != 1 {
		t.Errorf("invalid file: exit code %d, want 1", code)
	}
	for _, want := range []string{bad + ":3: labels[0].min-ready: expected an integer, got \"lots\""} {
		if !strings.Contains(errOut, want) {
			t.Errorf("output lacks %q:\n%s", want, errOut)
		}
	}
	_, errOut, code = nodepool(t, map[string]string{"NODEPOOL_CONFIG": bad}, "config-validate")
	if code != 1 || !strings.Contains(errOut, bad) {
		t.Errorf("NODEPOOL_CONFIG is not used: code %d, %q", code, errOut)
	}
}

// config-validate prints warnings without failing, names a missing file
// with how to name another, and reads the secure file of -s (which is no
// longer --nats-url) or NODEPOOL_SECURE.
func TestConfigValidateWarningsAndSecure(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, `
labels: [{name: a}, {name: elsewhere}]
diskimages: [{name: debian, formats: [raw]}]
providers: [{name: p, driver: fake, pools: [{name: main, labels: [a]}]}]
`)
	out, errOut, code := nodepool(t, nil, "config-validate", cfg)
	if code != 0 || !strings.Contains(out, "is valid") ||
		!strings.Contains(errOut, "warning: "+cfg+`:2: labels[1].name: label "elsewhere" is not provided by any pool of this file`) {
		t.Errorf("warnings: code %d, stdout %q, stderr %q", code, out, errOut)
	}

	_, errOut, code = nodepool(t, nil, "config-validate", filepath.Join(t.TempDir(), "nodepool.yaml"))
	if code != 1 || !strings.Contains(errOut, "does not exist; name another with -c FILE or NODEPOOL_CONFIG") {
		t.Errorf("missing file: code %d, %q", code, errOut)
	}

	secure := filepath.Join(t.TempDir(), "secure.conf")
	if err := os.WriteFile(secure, []byte("diskimages:\n  - name: fedora\n    env-vars: {PASSWORD: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = nodepool(t, nil, "-s", secure, "config-validate", cfg)
	if code != 1 || !strings.Contains(errOut, secure+`:2: diskimages[0].name: diskimage "fedora" is not defined in `+cfg) {
		t.Errorf("-s: code %d, %q", code, errOut)
	}
	_, errOut, code = nodepool(t, map[string]string{"NODEPOOL_SECURE": secure}, "config-validate", cfg)
	if code != 1 || !strings.Contains(errOut, secure+":2:") {
		t.Errorf("NODEPOOL_SECURE: code %d, %q", code, errOut)
	}
	if err := os.WriteFile(secure, []byte("diskimages:\n  - name: debian\n    env-vars: {PASSWORD: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code = nodepool(t, nil, "--secure", secure, "config-validate", cfg); code != 0 {
		t.Errorf("--secure with a good secure file: code %d, %q %q", code, out, errOut)
	}
}

// With NODEPOOL_HTTP_ADDR unset, the status API listens where nodepool.yaml's
// webapp says, as Nodepool's webapp does.
func TestRunWebappAddress(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	cfg := writeConfig(t, fmt.Sprintf("webapp:\n  listen_address: 127.0.0.1\n  port: %d\nlabels: [{name: a}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [a]}]}]\n", port))
	env := runEnv(t, t.TempDir(), freePort(t))
	delete(env, "NODEPOOL_HTTP_ADDR")
	p := startRun(t, env, "-c", cfg)
	p.waitLog(fmt.Sprintf("addr=127.0.0.1:%d", port), 30*time.Second)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %s", resp.Status)
	}
}

func TestRunRejectsBadSettings(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "labels: [{name: a}]\nproviders: [{name: p, driver: fake, pools: [{name: main, labels: [a]}]}]\n")
	_, errOut, code := nodepool(t, map[string]string{"NODEPOOL_ROLES": "launcher,cook"}, "run", "-c", cfg)
	if code == 0 || !strings.Contains(errOut, `unknown role "cook"`) {
		t.Errorf("code %d, output %q", code, errOut)
	}
	_, errOut, code = nodepool(t, nil, "run", "-c", cfg, "--replicas", "2")
	if code == 0 || !strings.Contains(errOut, "NODEPOOL_REPLICAS: expected 1, 3 or 5, got 2") {
		t.Errorf("code %d, output %q", code, errOut)
	}
}

const cliConfig = `
labels:
  - name: small
    min-ready: 1
  - name: big
providers:
  - name: cloud1
    driver: fake
    boot-delay: %s
    pools:
      - name: main
        max-servers: 20
        labels: [small, big]
`

func runEnv(t *testing.T, dataDir string, port int) map[string]string {
	return map[string]string{
		"NODEPOOL_DATA_DIR":      dataDir,
		"NODEPOOL_NATS_LISTEN":   fmt.Sprintf("127.0.0.1:%d", port),
		"NODEPOOL_HTTP_ADDR":     "127.0.0.1:0",
		"NODEPOOL_LEASE_TTL":     "2s",
		"NODEPOOL_SYNC_INTERVAL": "500ms",
	}
}

// The CLI end to end against `nodepool run` on its embedded server.
func TestCLIEndToEnd(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(cliConfig, "0.1"))
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	p := startRun(t, env, "-c", cfg)
	p.waitLog("launcher running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	rec := watchRecords(t, url, "cloud1")
	cli := map[string]string{"NODEPOOL_NATS_URL": url}

	out, errOut, code := nodepool(t, cli, "request", "--json", "--holder", "ci@test", "small", "big")
	if code != 0 {
		t.Fatalf("request: code %d: %s", code, errOut)
	}
	var nodes []kv.Node
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("request --json output: %v\n%s", err, out)
	}
	if len(nodes) != 2 || nodes[0].Labels[0] != "small" || nodes[1].Labels[0] != "big" || nodes[0].State != kv.NodeInUse || nodes[0].Holder != "ci@test" {
		t.Fatalf("nodes = %+v", nodes)
	}
	out, _, code = nodepool(t, cli, "list")
	if code != 0 || !strings.Contains(out, nodes[0].ID) || !strings.Contains(out, "| in-use ") || !strings.HasPrefix(out, "+-") ||
		!strings.Contains(out, "| ci@test ") || !strings.Contains(strings.Split(out, "\n")[1], "| ID ") {
		t.Errorf("list: code %d\n%s", code, out)
	}
	out, _, code = nodepool(t, cli, "request-list", "--json")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "[") {
		t.Errorf("request-list --json: code %d\n%s", code, out)
	}
	// Someone else's nodes are refused without --force.
	_, errOut, code = nodepool(t, cli, "return", "--holder", "someone@else", nodes[0].ID)
	if code != 1 || !strings.Contains(errOut, `: the node belongs to someone else: in use by "ci@test", not by "someone@else"; refused (--force to return it anyway)`) {
		t.Errorf("return of someone else's node: code %d\n%s", code, errOut)
	}
	_, errOut, code = nodepool(t, cli, "delete", nodes[0].ID)
	if code != 1 || !strings.Contains(errOut, "refused (--force to delete it anyway)") {
		t.Errorf("delete of someone else's node: code %d\n%s", code, errOut)
	}
	out, errOut, code = nodepool(t, cli, "return", "--holder", "ci@test", nodes[0].ID, nodes[1].ID, "no-such-node")
	if code != 1 || !strings.Contains(out, nodes[0].ID+" returned") || !strings.Contains(errOut, `no node "no-such-node"`) {
		t.Errorf("return: code %d\n%s\n%s", code, out, errOut)
	}
	rec.until(10*time.Second, "returned nodes deleted", func() bool {
		_, a := rec.nodes.Get(nodes[0].ID)
		_, b := rec.nodes.Get(nodes[1].ID)
		return !a && !b
	})
	// delete takes a ready node away too; min-ready makes another.
	var ready string
	rec.until(10*time.Second, "a min-ready node", func() bool {
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeReady {
				ready = e.Key
			}
			return ready == ""
		})
		return ready != ""
	})
	if _, errOut, code := nodepool(t, cli, "delete", ready); code != 0 {
		t.Fatalf("delete: %s", errOut)
	}
	rec.until(10*time.Second, "deleted node gone and replaced", func() bool {
		_, there := rec.nodes.Get(ready)
		return !there && rec.count(kv.NodeReady) == 1
	})
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("nodepool run exited with %v after SIGTERM", err)
	}
	if !strings.Contains(p.output(), "launcher stopped") {
		t.Error("no clean shutdown in the log")
	}
}

// `nodepool run` stopped in the middle of launches (cleanly, or killed)
// and started again on the same data: nothing is lost, nothing is launched
// twice.
func TestRunRestartMidLaunch(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			cfg := writeConfig(t, fmt.Sprintf(cliConfig, "1.5"))
			port := freePort(t)
			env := runEnv(t, t.TempDir(), port)
			env["NODEPOOL_ID"] = "launcher-a"
			p := startRun(t, env, "-c", cfg)
			p.waitLog("launcher running", 30*time.Second)
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			var ids []string
			func() {
				nc, err := nats.Connect(url)
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				c, err := client.New(t.Context(), nc)
				if err != nil {
					t.Fatal(err)
				}
				// Watching from before the requests: a watch that syncs
				// on a busy machine after the 1.5 s boots would never see
				// them booting.
				rec := watchRecords(t, url, "cloud1")
				for i := range 6 {
					id := fmt.Sprintf("r%d", i)
					msg := fmt.Sprintf(`{"id": %q, "labels": ["big", "small"]}`, id)
					if _, err := c.JetStream().Publish(t.Context(), "nodepool.requests.new", []byte(msg)); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				rec.until(20*time.Second, "launches booting", func() bool { return rec.booting() >= 12 })
			}()
			_ = p.stop(sig, 20*time.Second)

			p2 := startRun(t, env, "-c", cfg)
			p2.waitLog("launcher running", 30*time.Second)
			rec := watchRecords(t, url, "cloud1")
			rec.until(30*time.Second, "every request done", func() bool {
				for _, id := range ids {
					e, ok := rec.requests.Get(id)
					if !ok || !e.Value.Done() {
						return false
					}
				}
				return true
			})
			for _, id := range ids {
				e, _ := rec.requests.Get(id)
				if e.Value.State != kv.RequestFulfilled {
					t.Errorf("request %s is %s: %s", id, e.Value.State, e.Value.Reason)
				}
			}
			// 12 nodes for the requests and 1 min-ready node; each
			// instance created once.
			rec.until(20*time.Second, "min-ready node", func() bool { return rec.nodes.Len() == 13 && rec.instances.Len() == 13 })
			if got := rec.instancesEverCreated("cloud1"); got != 13 {
				t.Errorf("%d instances created for 13 nodes", got)
			}
			_ = p2.stop(syscall.SIGTERM, 20*time.Second)
		})
	}
}

// config-validate on files Nodepool accepts (a kubernetes provider among
// them), that are stricter here than there, or that were written before
// 3.0.
func TestConfigValidateNodepoolFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		code       int
		stdout     string
		stderr     []string
	}{
		{"kubernetes", "labels: [{name: pod}]\nproviders:\n  - name: k8s\n    driver: kubernetes\n    context: admin\n    pools: [{name: main, labels: [{name: pod, type: pod, image: fedora}]}]\n",
			0, "is valid: 1 labels, 1 providers, 1 pools", nil},
		{"throughput without gp3", "labels: [{name: a}]\nproviders:\n  - name: ec2\n    driver: aws\n    region-name: us-west-2\n    cloud-images: [{name: u, image-id: ami-1e749f67}]\n    pools:\n      - name: main\n        labels: [{name: a, cloud-image: u, instance-type: t3.medium, key-name: zuul, volume-type: io2, throughput: 200}]\n",
			0, "is valid", []string{"warning: ", "throughput applies to gp3 volumes only: AWS refuses a launch with throughput for its io2 volume"}},
		{"pre-3.0", "targets: [{name: jenkins}]\nlabels:\n  - name: a\n    image: precise\n",
			1, "", []string{"this file looks written for Nodepool before 3.0 (2018)", "docs/moving-from-nodepool.md#files-written-for-nodepool-before-30", ":1: targets: targets was removed in Nodepool 3.0.0 (2018)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeConfig(t, tc.yaml)
			out, errOut, code := nodepool(t, nil, "config-validate", file)
			if code != tc.code || !strings.Contains(out, tc.stdout) {
				t.Errorf("exit code %d (want %d), stdout %q", code, tc.code, out)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
			if tc.stderr == nil && errOut != "" {
				t.Errorf("stderr: %s", errOut)
			}
		})
	}
}
