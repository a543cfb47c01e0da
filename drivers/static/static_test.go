package static

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/kv"
)

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) (string, int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	_ = ln.Close()
	return addr.IP.String(), addr.Port
}

func TestCheckHost(t *testing.T) {
	t.Parallel()
	up := sshtest.Start(t, sshtest.Ed25519, sshtest.ECDSA)
	other := sshtest.Start(t)
	refusing := sshtest.Start(t)
	refusing.SetMode(sshtest.Refusing)
	silent := sshtest.Start(t)
	silent.SetMode(sshtest.Silent)
	closedHost, closed := closedPort(t)
	no := false

	node := func(s *sshtest.Server, mod func(*config.StaticNode)) *config.StaticNode {
		t := true
		n := &config.StaticNode{Name: s.Host, Labels: config.LabelList{"a"}, Username: "zuul", ConnectionType: "ssh",
			ConnectionPort: s.Port, HostKeyChecking: &t, Timeout: config.Duration(2 * time.Second), MaxParallelJobs: 1}
		if mod != nil {
			mod(n)
		}
		return n
	}
	cases := []struct {
		name     string
		node     *config.StaticNode
		wantKeys []string
		wantErr  string
		contacts *sshtest.Server // must have been connected to
	}{
		{"no host-key configured", node(up, nil), up.HostKeys(), "", up},
		{"configured host-key offered", node(up, func(n *config.StaticNode) { n.HostKey = config.StringList{up.HostKeys()[1] + " comment"} }), up.HostKeys(), "", up},
		{"host key mismatch", node(up, func(n *config.StaticNode) { n.HostKey = other.HostKeys() }), nil, "host key mismatch: " + up.Addr() + " does not offer the configured host-key " + other.HostKeys()[0], up},
		{"refusing", node(refusing, nil), nil, "host " + refusing.Addr() + " is unreachable", refusing},
		{"silent", node(silent, func(n *config.StaticNode) { n.Timeout = config.Duration(300 * time.Millisecond) }), nil, "no SSH handshake from " + silent.Addr() + " within 300ms", silent},
		{"nothing listening", node(up, func(n *config.StaticNode) { n.Name, n.ConnectionPort = closedHost, closed }), nil, "connection refused", nil},
		{"winrm reachable", node(up, func(n *config.StaticNode) { n.ConnectionType = "winrm" }), []string{}, "", up},
		{"winrm unreachable", node(up, func(n *config.StaticNode) { n.ConnectionType, n.Name, n.ConnectionPort = "winrm", closedHost, closed }), nil, "is unreachable", nil},
		{"no host-key-checking", node(refusing, func(n *config.StaticNode) { n.HostKeyChecking = &no; n.HostKey = other.HostKeys() }), other.HostKeys(), "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before int64
			if tc.contacts != nil {
				before = tc.contacts.Accepted()
			}
			refusedBefore := refusing.Accepted()
			keys, err := CheckHost(t.Context(), tc.node)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(keys)
			want := slices.Clone(tc.wantKeys)
			slices.Sort(want)
			if !slices.Equal(keys, want) {
				t.Errorf("keys = %v, want %v", keys, want)
			}
			if tc.contacts != nil {
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				if !tc.contacts.WaitAccepted(ctx, before) {
					t.Errorf("the host was not contacted")
				}
			}
			if tc.contacts == nil && refusing.Accepted() != refusedBefore {
				t.Errorf("the host was contacted although host-key-checking is off")
			}
		})
	}
}

func TestNodeIDsAndReregister(t *testing.T) {
	t.Parallel()
	h := config.StaticNode{Name: "host1.example.com", Username: "zuul", ConnectionPort: 22}
	id0, id1 := NodeID("rack", "main", &h, 0), NodeID("rack", "main", &h, 1)
	if id0 == id1 || id0 != NodeID("rack", "main", &h, 0) || !strings.HasPrefix(id0, "static-") || !strings.HasSuffix(id1, "-1") {
		t.Errorf("node ids %q, %q are not fixed per host and slot", id0, id1)
	}
	h2 := h
	h2.ConnectionPort = 2222
	if NodeID("rack", "main", &h2, 0) == id0 || NodeID("rack", "other", &h, 0) == id0 {
		t.Error("another port or pool gives the same id")
	}

	until := time.Now()
	n := &kv.Node{ID: id0, State: kv.NodeUsed, AllocatedTo: "r1", Holder: "me", LeaseUntil: &until, Requestor: "zuul", Launcher: "l1",
		DriverData: NodeData{Host: h.Name, Spec: "0123456789abcdef", Failures: 2, NextCheck: until.Add(time.Hour)}.raw()}
	(&Provider{}).Reregister(n, until)
	d := nodeData(n)
	if n.State != kv.NodeInit || n.AllocatedTo != "" || n.Holder != "" || n.LeaseUntil != nil || n.Launcher != "" || d.Spec != "0123456789abcdef" || d.Failures != 0 || !d.NextCheck.IsZero() {
		t.Errorf("re-registered node = %+v, driver data %+v", n, d)
	}
}

// A node record whose driver_data is not valid (a negative failure count
// made the recheck backoff shift by a negative amount and panic) is
// registered again with data of its own, and its host is checked as usual.
func TestManageRegistersNodesWithBadDataAgain(t *testing.T) {
	t.Parallel()
	host, port := closedPort(t)
	cfg, err := config.Parse("test.yaml", fmt.Appendf(nil, `
labels:
  - name: a
providers:
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: %s
            labels: [a]
            connection-port: %d
            timeout: 1
`, host, port))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := t.Context()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := kv.Ensure(ctx, js, kv.Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := cfg.Provider("rack")
	h := &pc.Pools[0].Nodes[0]
	id := NodeID("rack", "main", h, 0)
	now := time.Now().UTC()
	bad := []string{
		fmt.Sprintf(`{"host": %q, "slot": 0, "spec": %q, "failures": -100}`, host, spec(h, map[string]string(pc.Pools[0].NodeAttributes))),
		fmt.Sprintf(`{"host": %q, "slot": -3, "spec": %q}`, host, spec(h, map[string]string(pc.Pools[0].NodeAttributes))),
		`{"host": 7}`,
	}
	for i, data := range bad {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			e, err := b.Nodes.Get(ctx, id)
			n := &kv.Node{ID: id, State: kv.NodeInit, Provider: "rack", Pool: "main", Labels: []string{"a"}, HostKeys: []string{}, Created: now, StateTime: now}
			if err == nil {
				n = &e.Value
			}
			n.DriverData = json.RawMessage(data)
			n.State = kv.NodeInit
			if err == nil {
				_, err = b.Nodes.Update(ctx, id, n, e.Revision)
			} else {
				_, err = b.Nodes.Create(ctx, id, n)
			}
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(pc, Options{Nodes: kv.NewCache(b.Nodes, log), Log: log})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			mctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); p.Manage(mctx, 50*time.Millisecond) }()
			defer func() { cancel(); <-done }()
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			defer wcancel()
			w, err := b.Nodes.Bucket().Watch(wctx, id)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.Stop() }()
			for {
				select {
				case <-wctx.Done():
					t.Fatal("node not registered again and checked within 20s")
				case ke := <-w.Updates():
					if ke == nil {
						continue
					}
					var got kv.Node
					if json.Unmarshal(ke.Value(), &got) != nil {
						continue
					}
					if d, err := decodeNodeData(got.DriverData); err == nil && d.Failures >= 1 && strings.Contains(got.Reason, "unreachable") {
						return
					}
				}
			}
		})
	}
}
