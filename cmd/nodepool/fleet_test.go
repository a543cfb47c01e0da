package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// runningLine is the log line of a launcher that runs.
const runningLine = `msg="launcher running"`

// fleet is a set of `nodepool run` launcher processes, each with its own
// NATS URL list (so that they connect to different members of a
// cluster), that a test kills and starts again.
type fleet struct {
	t   *testing.T
	cfg string
	env func(id string) map[string]string

	mu    sync.Mutex
	procs map[string]*proc
}

// startFleet starts a launcher per id and waits until each runs.
func startFleet(t *testing.T, cfg string, env func(id string) map[string]string, ids ...string) *fleet {
	t.Helper()
	f := &fleet{t: t, cfg: cfg, env: env, procs: map[string]*proc{}}
	for _, id := range ids {
		f.procs[id] = startRun(t, env(id), "-c", cfg)
	}
	for _, id := range ids {
		f.procs[id].waitLog(runningLine, 90*time.Second)
	}
	return f
}

// ids lists the launchers.
func (f *fleet) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.procs {
		out = append(out, id)
	}
	return out
}

// get returns a launcher's current process.
func (f *fleet) get(id string) *proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[id]
}

// kill sends SIGKILL to the launchers at once and waits for them to die.
func (f *fleet) kill(ids ...string) {
	f.mu.Lock()
	var ps []*proc
	for _, id := range ids {
		ps = append(ps, f.procs[id])
	}
	f.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, p := range ps {
		<-p.done
	}
}

// restart starts a killed launcher again with the same id; it returns
// once the launcher runs, or an error (it may run from a goroutine).
func (f *fleet) restart(id string) error {
	p := startRun(f.t, f.env(id), "-c", f.cfg)
	f.mu.Lock()
	f.procs[id] = p
	f.mu.Unlock()
	return p.awaitLog(runningLine, 90*time.Second)
}

// stop ends every launcher with SIGTERM.
func (f *fleet) stop() {
	f.t.Helper()
	for _, id := range f.ids() {
		if p := f.get(id); p != nil {
			_ = p.stop(syscall.SIGTERM, 30*time.Second)
		}
	}
}

// awaitLog is waitLog for goroutines other than the test's: it returns an
// error instead of failing the test.
func (p *proc) awaitLog(s string, timeout time.Duration) error {
	return p.untilLog(fmt.Sprintf("%q", s), timeout, func(out string) bool { return strings.Contains(out, s) })
}

// outcome is how one request of a test requestor ended.
type outcome struct {
	id    string
	state kv.RequestState
	nodes []string
	err   error
}

// requestor plays a CI system: it submits requests (with acknowledgement,
// tried again with the same Nats-Msg-Id through elections, as the
// client does), waits for each, takes its nodes, deletes the request,
// holds the nodes a moment and gives them back.
type requestor struct {
	c *client.Client
}

func newRequestor(t *testing.T, urls string) *requestor {
	t.Helper()
	_, c := connectClient(t, urls)
	return &requestor{c: c}
}

// run does one request from start to end.
func (r *requestor) run(ctx context.Context, id string, labels []string, prio int, hold time.Duration) outcome {
	o := outcome{id: id}
	if _, err := r.c.Submit(ctx, events.RequestMessage{ID: id, Labels: labels, Priority: &prio, Requestor: "test-requestor"}); err != nil {
		o.err = fmt.Errorf("submitting: %w", err)
		return o
	}
	e, err := r.c.Wait(ctx, id)
	o.state, o.nodes = e.Value.State, e.Value.Nodes
	if err != nil {
		o.err = err
		_ = r.c.DeleteRequest(context.WithoutCancel(ctx), id)
		return o
	}
	var taken []string
	for _, nid := range e.Value.Nodes {
		if _, err := r.c.Take(ctx, nid, id, "test-requestor", nil); err != nil {
			o.err = fmt.Errorf("taking node %s: %w", nid, err)
			break
		}
		taken = append(taken, nid)
	}
	if err := r.c.DeleteRequest(ctx, id); err != nil && !errors.Is(err, kv.ErrNotFound) && o.err == nil {
		o.err = fmt.Errorf("deleting the request: %w", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(hold): // the job runs on its nodes
	}
	for _, nid := range taken {
		if err := r.c.Return(context.WithoutCancel(ctx), nid); err != nil && o.err == nil {
			o.err = fmt.Errorf("returning node %s: %w", nid, err)
		}
	}
	return o
}

// leakedInstance applies cleanup's rule: an instance of ours that its
// node record does not account for.
func leakedInstance(inst *fake.InstanceRecord, node func(string) (kv.Entry[kv.Node], bool)) bool {
	nid := inst.Tags["nodepool_node_id"]
	if nid == "" {
		return false // not nodepool's
	}
	e, ok := node(nid)
	if !ok {
		return true
	}
	if e.Value.ExternalID == inst.ID {
		return false
	}
	return e.Value.State != kv.NodeBuilding && e.Value.State != kv.NodeInit
}
