package static

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
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
		DriverData: NodeData{Host: h.Name, Spec: "abc", Failures: 2, NextCheck: until.Add(time.Hour)}.raw()}
	(&Provider{}).Reregister(n, until)
	d := nodeData(n)
	if n.State != kv.NodeInit || n.AllocatedTo != "" || n.Holder != "" || n.LeaseUntil != nil || n.Launcher != "" || d.Spec != "abc" || d.Failures != 0 || !d.NextCheck.IsZero() {
		t.Errorf("re-registered node = %+v, driver data %+v", n, d)
	}
}
