package consumers_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers/static"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/kv"
)

// staticNodeID is the id of a slot of a host of pool rack/main.
func staticNodeID(srv *sshtest.Server, username string, slot int) string {
	return static.NodeID("rack", "main", &config.StaticNode{Name: srv.Host, Username: username, ConnectionPort: srv.Port}, slot)
}

func staticData(n kv.Node) static.NodeData {
	var d static.NodeData
	_ = json.Unmarshal(n.DriverData, &d)
	return d
}

// noDeletes fails the test if a node of ids is ever deleted while the test
// runs (it follows every write to the nodes bucket).
func (h *harness) noDeletes(ids ...string) {
	natstest.Writes(h.t, h.nc, kv.BucketNodes, ">", func(key string, _ []byte, deleted bool) {
		if deleted && slices.Contains(ids, key) {
			h.t.Errorf("static node %s was deleted; it should have been registered again", key)
		}
	})
}

// Hosts are registered as max-parallel-jobs ready nodes with the host keys
// a real SSH handshake gathered; requests are served only from them (never
// a new node), a request waits while all are in use, and a used node is
// checked again and comes back ready under the same record.
func TestStaticHostsServeAndComeBack(t *testing.T) {
	t.Parallel()
	srvA := sshtest.Start(t, sshtest.Ed25519, sshtest.ECDSA)
	srvB := sshtest.Start(t)
	h := newHarness(t, fmt.Sprintf(`
labels:
  - name: static-a
  - name: static-b
providers:
  - name: rack
    driver: static
    rate: 1000 # the driver is wrapped by the rate limiter; its hooks still work
    pools:
      - name: main
        node-attributes: {rack: r1}
        nodes:
          - name: %s
            connection-port: %d
            labels: [static-a]
            max-parallel-jobs: 2
            host-key: %q
          - name: %s
            connection-port: %d
            labels: static-a static-b
            python-path: /usr/bin/python3
            shell-type: bash
`, srvA.Host, srvA.Port, srvA.HostKeys()[1], srvB.Host, srvB.Port))
	a0, a1, b0 := staticNodeID(srvA, "zuul", 0), staticNodeID(srvA, "zuul", 1), staticNodeID(srvB, "zuul", 0)
	ids := []string{a0, a1, b0}
	h.noDeletes(ids...)
	h.startLauncher("l1")

	h.until(10*time.Second, "three ready static nodes", func() bool {
		return h.countNodes(func(n *kv.Node) bool { return n.State == kv.NodeReady }) == 3
	})
	for _, id := range ids {
		n, ok := h.node(id)
		if !ok {
			t.Fatalf("no node %s; the ids are not the fixed per-slot ids", id)
		}
		want := srvA.HostKeys()
		if id == b0 {
			want = srvB.HostKeys()
		}
		if !slices.Equal(sorted(n.HostKeys), sorted(want)) {
			t.Errorf("node %s host keys %v, want the server's %v", id, n.HostKeys, want)
		}
		if n.InterfaceIP != "127.0.0.1" || n.Username != "zuul" || n.ConnectionType != "ssh" || n.Provider != "rack" || n.Pool != "main" ||
			n.Attributes["rack"] != "r1" {
			t.Errorf("node %s = %+v", id, n)
		}
	}
	// static.rst's defaults, and a host's own python-path and shell-type.
	if n, _ := h.node(a0); n.PythonPath != "/usr/bin/python2" || n.ShellType != "sh" {
		t.Errorf("node of host A: python_path %q shell_type %q", n.PythonPath, n.ShellType)
	}
	if n, _ := h.node(b0); !slices.Equal(n.Labels, []string{"static-a", "static-b"}) || n.ConnectionPort != srvB.Port ||
		n.PythonPath != "/usr/bin/python3" || n.ShellType != "bash" {
		t.Errorf("node of host B = %v port %d python_path %q shell_type %q", n.Labels, n.ConnectionPort, n.PythonPath, n.ShellType)
	}

	// static-b only B has; reuse=false does not make a static pool launch.
	f := false
	rb := h.submit(events.RequestMessage{Labels: []string{"static-b"}, Reuse: &f})
	h.waitDone(10*time.Second, rb)
	if r, _ := h.request(rb); r.State != kv.RequestFulfilled || !slices.Equal(r.Nodes, []string{b0}) {
		t.Fatalf("request for static-b = %s %v (%s), want fulfilled with %s", r.State, r.Nodes, r.Reason, b0)
	}
	h.takeAll(rb)

	// The other two static-a nodes go to one request; the next one waits.
	ra := h.submit(events.RequestMessage{Labels: []string{"static-a", "static-a"}})
	h.waitDone(10*time.Second, ra)
	r, _ := h.request(ra)
	if r.State != kv.RequestFulfilled || !slices.Equal(sorted(r.Nodes), sorted([]string{a0, a1})) {
		t.Fatalf("request for two static-a = %s %v (%s), want %s and %s", r.State, r.Nodes, r.Reason, a0, a1)
	}
	h.takeAll(ra)
	waiting := h.submit(events.RequestMessage{Labels: []string{"static-a"}})
	h.until(10*time.Second, "the request recorded", func() bool { _, ok := h.request(waiting); return ok })

	// Give B back: it is checked again (a new handshake) and serves the
	// waiting request; the pool never made a node of its own.
	acceptedB := srvB.Accepted()
	if r, _ := h.request(waiting); r.State == kv.RequestFulfilled {
		t.Fatalf("request %s fulfilled while every static-a node is in use", waiting)
	}
	if err := h.client.Return(t.Context(), b0); err != nil {
		t.Fatal(err)
	}
	h.waitDone(10*time.Second, waiting)
	if r, _ := h.request(waiting); r.State != kv.RequestFulfilled || !slices.Equal(r.Nodes, []string{b0}) {
		t.Fatalf("waiting request = %s %v (%s), want fulfilled with the returned %s", r.State, r.Nodes, r.Reason, b0)
	}
	if srvB.Accepted() == acceptedB {
		t.Error("the returned node went back into service without a new host key check")
	}
	if n, _ := h.node(b0); n.State != kv.NodeReady || n.Holder != "" || n.AllocatedTo != waiting || len(n.HostKeys) == 0 {
		t.Errorf("re-registered node = %s holder %q allocated to %q keys %v", n.State, n.Holder, n.AllocatedTo, n.HostKeys)
	}
	if got := h.nodes.Len(); got != 3 {
		t.Errorf("%d node records, want the 3 registered ones:\n%s", got, h.dump())
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// A host whose key does not match stays out of service and says why; an
// unreachable host is not handed out, is checked again and again, and
// serves as soon as it answers.
func TestStaticHostKeyMismatchAndUnreachableHost(t *testing.T) {
	t.Parallel()
	good := sshtest.Start(t)
	impostor := sshtest.Start(t)
	other := sshtest.Start(t)
	down := sshtest.Start(t)
	down.SetMode(sshtest.Refusing)
	h := newHarness(t, fmt.Sprintf(`
labels:
  - name: static-a
  - name: static-b
  - name: static-c
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: %s
            connection-port: %d
            labels: static-a
            host-key: %q
          - name: %s
            connection-port: %d
            labels: static-b
            host-key: %q
          - name: %s
            connection-port: %d
            labels: static-c
`, good.Host, good.Port, good.HostKeys()[0], impostor.Host, impostor.Port, other.HostKeys()[0], down.Host, down.Port))
	goodID, badID, downID := staticNodeID(good, "zuul", 0), staticNodeID(impostor, "zuul", 0), staticNodeID(down, "zuul", 0)
	h.startLauncher("l1")

	rb := h.submit(events.RequestMessage{Labels: []string{"static-b"}})
	rc := h.submit(events.RequestMessage{Labels: []string{"static-c"}})
	h.until(10*time.Second, "the good host ready, the others out of service with a reason", func() bool {
		g, _ := h.nodes.Get(goodID)
		b, _ := h.nodes.Get(badID)
		d, _ := h.nodes.Get(downID)
		return g.Value.State == kv.NodeReady &&
			b.Value.State == kv.NodeInit && strings.Contains(b.Value.Reason, "host key mismatch") &&
			d.Value.State == kv.NodeInit && strings.Contains(d.Value.Reason, "unreachable")
	})
	b, _ := h.node(badID)
	if !strings.Contains(b.Reason, other.HostKeys()[0]) || !strings.Contains(b.Reason, impostor.HostKeys()[0]) {
		t.Errorf("mismatch reason %q names neither the configured nor the offered key", b.Reason)
	}

	// Both hosts are checked again; meanwhile nothing is handed out.
	h.until(15*time.Second, "the failing hosts checked at least three times", func() bool {
		b, _ := h.nodes.Get(badID)
		d, _ := h.nodes.Get(downID)
		return staticData(b.Value).Failures >= 3 && staticData(d.Value).Failures >= 3
	})
	for _, id := range []string{rb, rc} {
		if r, _ := h.request(id); r.State == kv.RequestFulfilled {
			t.Fatalf("request %s fulfilled from a host out of service", id)
		}
	}
	for _, id := range []string{badID, downID} {
		if n, _ := h.node(id); n.AllocatedTo != "" || n.State != kv.NodeInit {
			t.Errorf("node %s is %s allocated to %q", id, n.State, n.AllocatedTo)
		}
	}

	// The host comes up: its node goes into service and serves the request.
	down.SetMode(sshtest.Up)
	h.waitDone(15*time.Second, rc)
	if r, _ := h.request(rc); r.State != kv.RequestFulfilled || !slices.Equal(r.Nodes, []string{downID}) {
		t.Fatalf("request %s = %s %v (%s)", rc, r.State, r.Nodes, r.Reason)
	}
	if n, _ := h.node(downID); n.Reason != "" || !slices.Equal(n.HostKeys, down.HostKeys()) {
		t.Errorf("node of the revived host: reason %q, keys %v", n.Reason, n.HostKeys)
	}
	if r, _ := h.request(rb); r.State == kv.RequestFulfilled {
		t.Errorf("request %s fulfilled from the host whose key does not match", rb)
	}
}

// Config changes while nodes are in use: a removed host leaves the pool once
// its node is given back, a changed host's node in use stays as it is until
// given back and is then registered with the new settings, new slots appear
// at once, and idle nodes of removed hosts go at once.
func TestStaticConfigChangesWhileInUse(t *testing.T) {
	t.Parallel()
	srv1, srv2, srv3 := sshtest.Start(t), sshtest.Start(t), sshtest.Start(t)
	const cfgA = `
labels:
  - name: static-a
  - name: static-b
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - {name: %[1]s, connection-port: %[2]d, labels: [static-a]}
          - {name: %[1]s, connection-port: %[3]d, labels: [static-a]}
          - {name: %[1]s, connection-port: %[4]d, labels: [static-b]}
`
	const cfgB = `
labels:
  - name: static-a
  - name: static-b
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - {name: %[1]s, connection-port: %[3]d, labels: [static-a, static-b], max-parallel-jobs: 2, username: zuul, connection-type: network_cli}
`
	h := newHarness(t, fmt.Sprintf(cfgA, "127.0.0.1", srv1.Port, srv2.Port, srv3.Port))
	n1, n2, n3 := staticNodeID(srv1, "zuul", 0), staticNodeID(srv2, "zuul", 0), staticNodeID(srv3, "zuul", 0)
	n2b := staticNodeID(srv2, "zuul", 1)
	l1 := h.startLauncher("l1")
	r := h.submit(events.RequestMessage{Labels: []string{"static-a", "static-a"}})
	h.waitDone(10*time.Second, r)
	h.takeAll(r)
	h.until(10*time.Second, "the static-b node ready", func() bool {
		e, _ := h.nodes.Get(n3)
		return e.Value.State == kv.NodeReady
	})
	l1.Stop()

	cfg, err := config.Parse("b.yaml", []byte(fmt.Sprintf(cfgB, "127.0.0.1", srv1.Port, srv2.Port, srv3.Port)))
	if err != nil {
		t.Fatal(err)
	}
	h.startLauncherWith("l2", cfg)
	h.until(10*time.Second, "the new slot ready, the idle removed node gone", func() bool {
		e, ok := h.nodes.Get(n2b)
		return ok && e.Value.State == kv.NodeReady && e.Value.ConnectionType == "network_cli" && !h.nodes.Has(n3)
	})
	for _, id := range []string{n1, n2} {
		n, ok := h.node(id)
		if !ok || n.State != kv.NodeInUse || n.ConnectionType != "ssh" || !slices.Equal(n.Labels, []string{"static-a"}) {
			t.Errorf("node %s in use changed under its holder: %+v", id, n)
		}
	}

	for _, id := range []string{n1, n2} {
		if err := h.client.Return(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	h.until(10*time.Second, "the removed host's node gone, the changed host's node ready with its new settings", func() bool {
		e, ok := h.nodes.Get(n2)
		return !h.nodes.Has(n1) && ok && e.Value.State == kv.NodeReady && e.Value.ConnectionType == "network_cli" &&
			slices.Equal(e.Value.Labels, []string{"static-a", "static-b"})
	})
	if got := h.nodes.Len(); got != 2 {
		t.Errorf("%d node records, want the 2 slots of the one host left:\n%s", got, h.dump())
	}
	// The changed host serves its new label.
	rb := h.submit(events.RequestMessage{Labels: []string{"static-b", "static-b"}})
	h.waitDone(10*time.Second, rb)
	if r, _ := h.request(rb); r.State != kv.RequestFulfilled || !slices.Equal(sorted(r.Nodes), sorted([]string{n2, n2b})) {
		t.Errorf("request for static-b = %s %v (%s)", r.State, r.Nodes, r.Reason)
	}
}

// A static pool declines at once a request its hosts could never hold
// together, and serves one they can.
func TestStaticDeclinesWhatItsHostsCannotHold(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	h := newHarness(t, fmt.Sprintf(`
labels:
  - name: static-a
  - name: static-b
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: %s
            connection-port: %d
            labels: [static-a, static-b]
            max-parallel-jobs: 2
`, srv.Host, srv.Port))
	h.startLauncher("l1")
	cases := []struct {
		labels []string
		reason string
	}{
		{[]string{"static-b", "static-b", "static-b"}, "needs 3 nodes of static-b; the pool's hosts give 2"},
		{[]string{"static-a", "static-b", "static-a"}, "needs 3 nodes; the pool's hosts give 2 in all"},
		{[]string{"static-a", "static-b"}, ""},
	}
	for _, c := range cases {
		id := h.submit(events.RequestMessage{Labels: c.labels})
		h.waitDone(20*time.Second, id)
		r, _ := h.request(id)
		switch {
		case c.reason == "" && r.State != kv.RequestFulfilled:
			t.Errorf("%v: %s %q, want fulfilled", c.labels, r.State, r.Reason)
		case c.reason != "" && (r.State != kv.RequestFailed || !strings.Contains(r.Reason, c.reason)):
			t.Errorf("%v: %s %q, want failed: %s", c.labels, r.State, r.Reason, c.reason)
		}
	}
}
