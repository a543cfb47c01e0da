package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// Faults tried from outside with the real binary, as an operator would meet
// them: each ends with nothing lost, nothing stuck and nothing leaked.

const slowBootConfig = `
labels:
  - name: small
providers:
  - name: cloud1
    driver: fake
    boot-delay: 8
    delete-delay: 0.2
    pools:
      - name: main
        max-servers: 5
        labels: [small]
`

// launcherEnv is the environment of a launcher process on an external
// server, with short leases so a dead one is noticed quickly.
func launcherEnv(url, id string) map[string]string {
	return map[string]string{
		"NODEPOOL_NATS_URL": url, "NODEPOOL_ID": id, "NODEPOOL_ROLES": "launcher",
		"NODEPOOL_HTTP_ADDR": "", "NODEPOOL_LEASE_TTL": "2s", "NODEPOOL_SYNC_INTERVAL": "500ms",
	}
}

// A node deleted by an operator while it boots, whose launcher is killed
// 300 ms later, is deleted by another launcher, and so is its instance
// (it used to stay deleting, with no launcher, for ever).
func TestDeleteWhileBootingThenKill(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	url := srv.ClientURL()
	cfg := writeConfig(t, slowBootConfig)
	l1 := startRun(t, launcherEnv(url, "launcher-1"), "-c", cfg)
	l1.waitLog("launcher running", 60*time.Second)
	rec := watchRecords(t, url, "cloud1")
	_, c := connectClient(t, url)
	id, err := c.Submit(t.Context(), events.RequestMessage{Labels: []string{"small"}, Requestor: "faults-test"})
	if err != nil {
		t.Fatal(err)
	}
	var node string
	rec.until(30*time.Second, "a node booting with its instance", func() bool {
		r, ok := rec.requests.Get(id)
		if !ok || len(r.Value.Nodes) == 0 {
			return false
		}
		node = r.Value.Nodes[0]
		n, ok := rec.nodes.Get(node)
		return ok && n.Value.State == kv.NodeBuilding && n.Value.Launcher == "launcher-1" && rec.instances.Len() == 1
	})
	if err := c.DeleteNode(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the scenario: the kill comes 300 ms after the delete
	_ = l1.stop(syscall.SIGKILL, 30*time.Second)
	l2 := startRun(t, launcherEnv(url, "launcher-2"), "-c", cfg)
	l2.waitLog("launcher running", 60*time.Second)
	if err := c.DeleteRequest(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	rec.until(60*time.Second, "the deleted node and its instance gone", func() bool {
		_, there := rec.nodes.Get(node)
		return !there && rec.consistent()
	})
	_ = l2.stop(syscall.SIGTERM, 30*time.Second)
}

// consistent reports whether every instance is the one a node record
// names, and every node that names an instance has it.
func (r *records) consistent() bool {
	ok := true
	named := map[string]bool{}
	r.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if ext := e.Value.ExternalID; ext != "" {
			named[ext] = true
			_, there := r.instances.Get(ext)
			ok = ok && (there || e.Value.State == kv.NodeDeleting)
		}
		return ok
	})
	r.instances.Range(func(e *kv.Entry[fake.InstanceRecord]) bool {
		ok = ok && named[e.Key]
		return ok
	})
	return ok
}

// A second daemon on the data directory of a running one (another NATS
// port, the same store) exits at once, naming the process that holds it,
// instead of opening the same JetStream files.
func TestSecondDaemonOnOneDataDirExits(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, slowBootConfig)
	dataDir := t.TempDir()
	first := startRun(t, runEnv(t, dataDir, freePort(t)), "-c", cfg, "--id", "first")
	first.waitLog("launcher running", 60*time.Second)
	second := startRun(t, runEnv(t, dataDir, freePort(t)), "-c", cfg, "--id", "second")
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the second daemon did not exit")
	}
	out := second.output()
	if second.err == nil || !strings.Contains(out, "is held by another nodepool process") || !strings.Contains(out, "id first") ||
		!strings.Contains(out, fmt.Sprintf("pid %d", first.cmd.Process.Pid)) {
		t.Errorf("second daemon: %v\n%s", second.err, out)
	}
	// The first runs on, and its data directory opens again once it stops.
	_ = first.stop(syscall.SIGTERM, 30*time.Second)
	third := startRun(t, runEnv(t, dataDir, freePort(t)), "-c", cfg, "--id", "third")
	third.waitLog("launcher running", 60*time.Second)
	_ = third.stop(syscall.SIGTERM, 30*time.Second)
}

// givesUpConfig is slowBootConfig with a label per case of
// TestRequestorThatGivesUpFreesItsNodes: the node a case leaves to boot
// on, free, must not serve the next case's request once ready (the
// requestor then takes it at once, and a node taken is the requestor's:
// a run at a load average of 7 killed the command after it took a node
// the first case left, and the test waited for that node to be free).
var givesUpConfig = strings.NewReplacer(
	"  - name: small\n", "  - name: timeout\n  - name: interrupt\n  - name: killed\n",
	"labels: [small]", "labels: [timeout, interrupt, killed]",
).Replace(slowBootConfig)

// A `nodepool request` that gives up (past --timeout, interrupted, or
// killed and its lease run out) while its node boots leaves nothing
// allocated to it: its request is deleted and its node goes back to the
// pool.
func TestRequestorThatGivesUpFreesItsNodes(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	url := srv.ClientURL()
	cfg := writeConfig(t, givesUpConfig)
	l := startRun(t, launcherEnv(url, "launcher-1"), "-c", cfg)
	l.waitLog("launcher running", 60*time.Second)
	rec := watchRecords(t, url, "cloud1")
	cli := map[string]string{"NODEPOOL_NATS_URL": url}
	for _, tc := range []struct {
		name string
		args []string
		end  func(p *exec.Cmd)
	}{
		// A timeout well within the 8 s boot, yet long enough for the
		// request to be planned on a loaded machine before the command
		// gives up (1 s was not, once, at a load average of 13).
		{"timeout", []string{"--timeout", "4s"}, nil},
		{"interrupt", nil, func(p *exec.Cmd) { _ = p.Process.Signal(syscall.SIGINT) }},
		{"killed", []string{"--lease", "3s"}, func(p *exec.Cmd) { _ = p.Process.Kill() }},
	} {
		id := "gives-up-" + tc.name
		cmd := exec.Command(binary, append([]string{"request", "--id", id, tc.name}, tc.args...)...)
		cmd.Env = os.Environ()
		for k, v := range cli {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var node string
		rec.until(30*time.Second, tc.name+": its node booting", func() bool {
			r, ok := rec.requests.Get(id)
			if ok && len(r.Value.Nodes) == 1 {
				node = r.Value.Nodes[0]
			}
			return node != ""
		})
		if tc.end != nil {
			tc.end(cmd)
		}
		err := cmd.Wait()
		if err == nil {
			t.Errorf("%s: nodepool request exited 0:\n%s", tc.name, out.String())
		}
		t.Logf("%s: %v\n%s", tc.name, err, out.String())
		rec.until(30*time.Second, tc.name+": the request deleted and its node free", func() bool {
			_, there := rec.requests.Get(id)
			n, ok := rec.nodes.Get(node)
			return !there && ok && n.Value.AllocatedTo == ""
		})
		if tc.name != "killed" && !strings.Contains(out.String(), "withdrawn") {
			t.Errorf("%s: the command does not say it withdrew its request:\n%s", tc.name, out.String())
		}
	}
	_ = l.stop(syscall.SIGTERM, 30*time.Second)
}
