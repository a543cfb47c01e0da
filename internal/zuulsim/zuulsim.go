// Package zuulsim drives zuulsim.py, a stand-in for Zuul's scheduler and
// executors in ZooKeeper written with kazoo (Debian's python3-kazoo), so
// that tests of the zookeeper role face kazoo's own locks and Zuul's own
// steps and checks. Each Zuul is a process with a ZooKeeper session of its
// own; killing it lets its session expire, as a crashed Zuul's would.
package zuulsim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Python is Debian's interpreter, which sees python3-kazoo (a python3
// earlier on PATH may not).
const Python = "/usr/bin/python3"

// Install is what to run when kazoo is missing.
const Install = "apt-get install -y python3-kazoo"

// Zuul is one running stand-in.
type Zuul struct {
	t        testing.TB
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      *bufio.Scanner
	mu       sync.Mutex
	stderr   *lockedWriter
	SystemID string
}

// Server is what a Zuul needs to reach ZooKeeper: zuul.conf's [zookeeper]
// hosts (with the chroot) and TLS files.
type Server struct {
	Hosts         string
	CA, Cert, Key string
	// SessionTimeout in seconds (Zuul's session_timeout).
	SessionTimeout float64
}

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "zuulsim.py")
}

// Start starts a Zuul; it stops when the test ends.
func Start(t testing.TB, s Server) *Zuul {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		t.Fatalf("%s is missing (%s)", Python, Install)
	}
	if s.SessionTimeout == 0 {
		s.SessionTimeout = 10
	}
	cmd := exec.Command(Python, script(), s.Hosts, s.CA, s.Cert, s.Key, fmt.Sprint(s.SessionTimeout))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedWriter{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	z := &Zuul{t: t, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout), stderr: stderr}
	z.out.Buffer(make([]byte, 1<<20), 16<<20)
	t.Cleanup(z.Kill)
	// What the stand-in said (its ZooKeeper session suspended or lost,
	// its ephemeral locks with it) goes with a failure.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("zuulsim's stderr:\n%s", stderr)
		}
	})
	var id string
	if err := z.reply(&id); err != nil {
		t.Fatalf("starting the Zuul stand-in: %v", err)
	}
	z.SystemID = id
	return z
}

// lockedWriter is the stand-in's stderr, written by the process and read
// by the test.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Call runs one command and decodes its result into out (nil: ignore).
func (z *Zuul) Call(out any, op string, args map[string]any) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	cmd := map[string]any{"op": op}
	for k, v := range args {
		cmd[k] = v
	}
	line, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	if _, err := z.stdin.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("zuulsim %s: %w", op, err)
	}
	if err := z.reply(out); err != nil {
		return fmt.Errorf("zuulsim %s: %w", op, err)
	}
	return nil
}

func (z *Zuul) reply(out any) error {
	if !z.out.Scan() {
		return fmt.Errorf("no answer (exited?); stderr:\n%s", z.stderr.String())
	}
	var r struct {
		OK     bool            `json:"ok"`
		Result json.RawMessage `json:"result"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(z.out.Bytes(), &r); err != nil {
		return fmt.Errorf("bad answer %q: %w", z.out.Text(), err)
	}
	if !r.OK {
		return errors.New(r.Error)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Result, out)
}

// Must runs a command that must succeed.
func (z *Zuul) Must(out any, op string, args map[string]any) {
	z.t.Helper()
	if err := z.Call(out, op, args); err != nil {
		z.t.Fatal(err)
	}
}

// Request is a request as the stand-in reads it.
type Request struct {
	ID               string          `json:"_id"`
	Version          int             `json:"_version"`
	State            string          `json:"state"`
	Nodes            []string        `json:"nodes"`
	NodeTypes        []string        `json:"node_types"`
	DeclinedBy       []string        `json:"declined_by"`
	RelativePriority int             `json:"relative_priority"`
	Requestor        string          `json:"requestor"`
	RequestorData    json.RawMessage `json:"requestor_data"`
	EventID          string          `json:"event_id"`
	TenantName       *string         `json:"tenant_name"`
	Raw              map[string]any  `json:"-"`
}

// Node is a node as the stand-in reads it.
type Node map[string]any

// State is the node's state.
func (n Node) State() string { s, _ := n["state"].(string); return s }

// Submit writes a request, as Zuul's scheduler does (persistent, priority
// 200 unless args say otherwise), and returns its id.
func (z *Zuul) Submit(labels []string, args map[string]any) string {
	z.t.Helper()
	a := map[string]any{"labels": labels}
	for k, v := range args {
		a[k] = v
	}
	var id string
	z.Must(&id, "submit", a)
	return id
}

// Wait waits until a request is fulfilled or failed.
func (z *Zuul) Wait(id string, timeout time.Duration) Request {
	z.t.Helper()
	var r Request
	z.Must(&r, "wait", map[string]any{"id": id, "timeout": timeout.Seconds()})
	return r
}

// Get reads a request (nil when it is gone).
func (z *Zuul) Get(id string) *Request {
	z.t.Helper()
	var r *Request
	z.Must(&r, "request", map[string]any{"id": id})
	return r
}

// Node reads a node (nil when it is gone).
func (z *Zuul) Node(id string) Node {
	z.t.Helper()
	var n Node
	z.Must(&n, "node", map[string]any{"id": id})
	return n
}

// Accept locks a fulfilled request's nodes (30 s each, as Zuul's
// executor) and deletes the request, and returns the nodes.
func (z *Zuul) Accept(id string) []string {
	z.t.Helper()
	var nodes []string
	z.Must(&nodes, "accept", map[string]any{"id": id})
	return nodes
}

// Use marks locked nodes in-use with Zuul's user_data.
func (z *Zuul) Use(nodes []string) {
	z.t.Helper()
	z.Must(nil, "use", map[string]any{"nodes": nodes})
}

// Return marks in-use nodes used and unlocks them.
func (z *Zuul) Return(nodes []string) {
	z.t.Helper()
	z.Must(nil, "return_nodes", map[string]any{"nodes": nodes})
}

// Kill kills the process: its session expires after its timeout, as a
// crashed Zuul's does.
func (z *Zuul) Kill() {
	if z.cmd.Process != nil {
		_ = z.cmd.Process.Kill()
		_ = z.cmd.Wait()
	}
}

// Stop closes the session cleanly: its ephemeral nodes (locks) go at once.
func (z *Zuul) Stop() {
	_ = z.Call(nil, "stop", nil)
	z.Kill()
}
