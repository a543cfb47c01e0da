package kv_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

func TestNodeProblem(t *testing.T) {
	t.Parallel()
	ok := kv.Node{State: kv.NodeReady, Provider: "c", Pool: "p", Labels: []string{"small"}}
	tests := []struct {
		name string
		edit func(*kv.Node)
		want string // a part of the problem; "" for none
	}{
		{"valid", func(*kv.Node) {}, ""},
		{"unknown state", func(n *kv.Node) { n.State = "exploding" }, `unknown state "exploding" (expected one of init, building`},
		{"empty state", func(n *kv.Node) { n.State = "" }, `unknown state ""`},
		{"no provider", func(n *kv.Node) { n.Provider = "" }, "no provider"},
		{"no labels when ready", func(n *kv.Node) { n.Labels = nil }, "no labels in state ready"},
		{"no labels when failed", func(n *kv.Node) { n.Labels, n.State = nil, kv.NodeFailed }, ""},
		{"negative instances", func(n *kv.Node) { n.Resources.Instances = -5 }, "resources below zero"},
		{"negative cores", func(n *kv.Node) { n.Resources.Cores = -1 }, "resources below zero"},
		{"negative other", func(n *kv.Node) { n.Resources.Other = map[string]int{"volumes": -1} }, `resource "volumes" below zero`},
		{"many instances", func(n *kv.Node) { n.Resources.Instances = 1000 }, "resources of 1000 instances"},
		{"one instance", func(n *kv.Node) { n.Resources.Instances = 1 }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := ok.Clone()
			tc.edit(&n)
			got := n.Problem()
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Problem() = %q; want %q", got, tc.want)
			}
			if n.Accountable() != (got == "") {
				t.Errorf("Accountable() = %v with problem %q", n.Accountable(), got)
			}
		})
	}
}

func TestRequestProblem(t *testing.T) {
	t.Parallel()
	for _, st := range kv.RequestStates {
		if p := (&kv.Request{State: st}).Problem(); p != "" {
			t.Errorf("state %s: %q", st, p)
		}
	}
	if p := (&kv.Request{State: "exploding"}).Problem(); !strings.Contains(p, `unknown state "exploding"`) {
		t.Errorf("unknown state: %q", p)
	}
}

func TestSalvage(t *testing.T) {
	t.Parallel()
	n := kv.SalvageNode("k", []byte(`{"provider":"c","external_id":"i-1","pool":5,"state":{"x":1}}`))
	if n.ID != "k" || n.Provider != "c" || n.ExternalID != "i-1" || n.Pool != "" {
		t.Errorf("salvaged %+v", n)
	}
	if n := kv.SalvageNode("k", []byte("not json")); n.ID != "k" || n.Provider != "" {
		t.Errorf("salvaged from garbage %+v", n)
	}
	r := kv.SalvageRequest("r", []byte(`{"owner":"alice","labels":"x"}`))
	if r.ID != "r" || r.Owner != "alice" || r.Labels == nil {
		t.Errorf("salvaged %+v", r)
	}
}

// The cache keeps the records that do not decode, until a newer revision
// of their key replaces or deletes them.
func TestCacheKeepsBadRecords(t *testing.T) {
	t.Parallel()
	b := buckets(t)
	ctx := t.Context()
	c := kv.NewCache(b.Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Run(cctx) }()
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	rev, err := b.Nodes.Bucket().Put(ctx, "bad", []byte(`{"state": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	synced(t, c, "the bad record", func() bool {
		bad := c.BadRecords()
		return len(bad) == 1 && bad[0].Key == "bad" && bad[0].Revision == rev && bad[0].Err != nil && string(bad[0].Data) == `{"state": 5}`
	})
	if c.Has("bad") {
		t.Error("a record that does not decode is in the cache")
	}
	if _, err := b.Nodes.Update(ctx, "bad", &kv.Node{ID: "bad", State: kv.NodeFailed, Provider: "c"}, rev); err != nil {
		t.Fatal(err)
	}
	synced(t, c, "the good revision", func() bool { return c.Has("bad") && len(c.BadRecords()) == 0 })
	e, _ := c.Get("bad")
	if _, err := b.Nodes.Bucket().Update(ctx, "bad", []byte("garbage"), e.Revision); err != nil {
		t.Fatal(err)
	}
	synced(t, c, "bad again", func() bool { return !c.Has("bad") && len(c.BadRecords()) == 1 })
	if err := b.Nodes.Bucket().Delete(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	synced(t, c, "deleted", func() bool { return len(c.BadRecords()) == 0 })
}

// synced waits until the cache holds every change the bucket has, then
// checks cond.
func synced[T any](t *testing.T, c *kv.Cache[T], what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("syncing the cache for %s: %v", what, err)
	}
	if !cond() {
		t.Fatalf("not so once the cache caught up: %s", what)
	}
}

// FuzzNodeRecord: any stored bytes either decode into a node whose
// problem, if any, failing it and naming a provider cure, or are
// salvaged into a record keyed as the original; nothing panics.
func FuzzNodeRecord(f *testing.F) {
	f.Add([]byte(`{"state":"exploding","provider":"c","labels":["x"]}`))
	f.Add([]byte(`{"state":"ready","provider":"c","resources":{"instances":-5}}`))
	f.Add([]byte(`{"state":5}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"resources":{"cores":"many"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := kv.Decode[kv.Node]("k", data)
		if err != nil {
			s := kv.SalvageNode("k", data)
			if s.ID != "k" {
				t.Fatalf("salvaged id %q", s.ID)
			}
			return
		}
		_ = n.Problem()
		n.State = kv.NodeFailed
		if n.Provider == "" {
			n.Provider = "c"
		}
		if n.Resources.Problem() != "" {
			n.Resources = kv.Resources{}
		}
		if p := n.Problem(); p != "" {
			t.Fatalf("a failed node with a provider still has a problem: %q", p)
		}
	})
}
