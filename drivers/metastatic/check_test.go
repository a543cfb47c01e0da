package metastatic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
	"github.com/nodepool-nats/nodepool/kv"
)

// hostKeyConfig is a metastatic provider whose pool and label set
// host-key-checking as given ("" leaves the key out).
func hostKeyConfig(pool, label string) string {
	line := func(indent, v string) string {
		if v == "" {
			return ""
		}
		return indent + "host-key-checking: " + v + "\n"
	}
	return fmt.Sprintf(`
labels:
  - name: big
  - name: small
providers:
  - name: cloud
    driver: fake
    pools:
      - name: main
        labels: [big]
  - name: meta
    driver: metastatic
    boot-timeout: 5
    pools:
      - name: main
%s        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 4
%s`, line("        ", pool), line("            ", label))
}

// backingOn writes a backing node of ours reachable at an SSH server.
func (e *testEnv) backingOn(id string, srv *sshtest.Server) {
	me := Requestor("meta")
	e.node(&kv.Node{ID: id, State: kv.NodeInUse, Holder: me, Provider: "cloud", Pool: "main", Labels: []string{"big"},
		InterfaceIP: srv.Host, ConnectionPort: srv.Port, ConnectionType: "ssh", Username: "zuul", HostKeys: []string{"ssh-ed25519 AAAArecorded"},
		UserData: encodeJSON(BackingData{Owner: me, Slots: 4, Allocations: make([]string, 4), Taken: time.Now().UTC()})})
}

// host-key-checking (pool default, label override, off by default as in
// Nodepool): a carved node's connection is checked each time it gets a
// slot, and its host keys are the ones the check gathered.
func TestHostKeyChecking(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t, sshtest.Ed25519, sshtest.ECDSA)
	cases := []struct {
		pool, label string
		checks      bool
	}{
		{"", "", false},
		{"true", "", true},
		{"true", "false", false},
		{"false", "true", true},
		{"", "true", true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("pool %q label %q", tc.pool, tc.label), func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t, hostKeyConfig(tc.pool, tc.label))
			e.backingOn("bk", srv)
			before := srv.Accepted()
			sm, _ := e.p.Create(createReq("c1", "small"), nil)
			step, err := sm.Advance(t.Context())
			if err != nil || !step.Done {
				t.Fatalf("advance: %+v, %v", step, err)
			}
			want := []string{"ssh-ed25519 AAAArecorded"}
			if tc.checks {
				want = srv.HostKeys()
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				if !srv.WaitAccepted(ctx, before) {
					t.Error("the backing node was not contacted")
				}
			}
			got := slices.Clone(step.Instance.HostKeys)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("host keys = %v, want %v", got, want)
			}
		})
	}
}

// A failed check fails the attempt (the lifecycle frees its slot) and the
// backing node: it takes no new slots and goes back once empty, grace-time
// or not.
func TestHostKeyCheckFailsTheBackingNode(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	srv.SetMode(sshtest.Refusing)
	e := newTestEnv(t, hostKeyConfig("true", ""))
	e.backingOn("bk", srv)
	e.node(e.carved("c1", "small"))
	ctx := t.Context()

	sm, _ := e.p.Create(createReq("c1", "small"), nil)
	_, err := sm.Advance(ctx)
	if err == nil || errors.Is(err, drivers.ErrFatal) || !strings.Contains(err.Error(), "backing node bk failed the host-key check") {
		t.Fatalf("advance: %v; want a failed attempt naming the backing node", err)
	}
	if sm.ExternalID() != "c1" {
		t.Fatalf("external id %q: the lifecycle could not free the slot", sm.ExternalID())
	}
	bn, _ := e.p.nodes.Get("bk")
	d, _ := e.p.owned(&bn.Value)
	if d.Failed == "" || d.SlotOf("c1") < 0 {
		t.Fatalf("backing node after the failed check: %s", bn.Value.UserData)
	}
	dm, _ := e.p.Delete(sm.ExternalID(), nil)
	if step, err := dm.Advance(ctx); err != nil || !step.Done {
		t.Fatalf("delete: %+v, %v", step, err)
	}

	// The next attempt waits for another backing node.
	sm, _ = e.p.Create(drivers.CreateRequest{NodeID: "c1", Provider: "meta", Pool: "main", Label: "small", Attempt: 2}, nil)
	if step, err := sm.Advance(ctx); err != nil || step.Done {
		t.Fatalf("second attempt: %+v, %v; want it waiting", step, err)
	}
	e.manager().pass(ctx)
	bn, _ = e.p.nodes.Get("bk")
	if bn.Value.State != kv.NodeUsed {
		t.Errorf("failed backing node is %s, want given back (used)", bn.Value.State)
	}
	if n := e.published(); n != 1 {
		t.Errorf("%d backing requests published, want one for the waiting node", n)
	}
}
