package metastatic

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

func TestBackingDataSlots(t *testing.T) {
	t.Parallel()
	now := time.Now()
	d := BackingData{Slots: 3, Allocations: make([]string, 3)}
	steps := []struct {
		op, node string
		want     int // slot for allocate, 1/0 for free
		after    []string
		idle     bool
	}{
		{"allocate", "a", 0, []string{"a", "", ""}, false},
		{"allocate", "b", 1, []string{"a", "b", ""}, false},
		{"allocate", "a", 0, []string{"a", "b", ""}, false}, // again: same slot
		{"allocate", "c", 2, []string{"a", "b", "c"}, false},
		{"allocate", "d", -1, []string{"a", "b", "c"}, false}, // full
		{"free", "b", 1, []string{"a", "", "c"}, false},
		{"free", "x", 0, []string{"a", "", "c"}, false}, // not there
		{"allocate", "d", 1, []string{"a", "d", "c"}, false},
		{"free", "a", 1, []string{"", "d", "c"}, false},
		{"free", "d", 1, []string{"", "", "c"}, false},
		{"free", "c", 1, []string{"", "", ""}, true}, // the last one: idle from now
	}
	for i, s := range steps {
		var got int
		if s.op == "allocate" {
			got = d.allocate(s.node, func(string) bool { return true })
		} else if d.free(s.node, now) {
			got = 1
		}
		if got != s.want || !slices.Equal(d.Allocations, s.after) || (d.IdleSince != nil) != s.idle {
			t.Fatalf("step %d (%s %s) = %d, %v, idle %v; want %d, %v, idle %v", i, s.op, s.node, got, d.Allocations, d.IdleSince, s.want, s.after, s.idle)
		}
	}
	if d.Used() != 0 {
		t.Errorf("Used = %d", d.Used())
	}
}

// The nodes a backing request listed have the first claim on the backing
// node's free slots while they wait: a node that came later takes a slot
// only if more are free than they need, and a listed node that stopped
// waiting loses its claim. (Two later nodes took the slots of the listed
// ones, which then had a fourth backing node requested for them, in
// consumers' TestMetastaticTwoLaunchersNeverShareASlot under load.)
func TestReservedSlots(t *testing.T) {
	t.Parallel()
	d := BackingData{Owner: Requestor("meta"), Slots: 3, Allocations: make([]string, 3), Reserved: []string{"a", "b"}}
	gone := map[string]bool{}
	waiting := func(id string) bool { return !gone[id] }
	steps := []struct {
		node     string
		gone     string // stops waiting first
		want     int
		reserved []string
	}{
		{"c", "", 0, []string{"a", "b"}},  // three free for two reserved
		{"e", "", -1, []string{"a", "b"}}, // two free for two reserved
		{"a", "", 1, []string{"b"}},
		{"e", "", -1, []string{"b"}},
		{"e", "b", 2, nil}, // b failed: its claim goes
	}
	for i, s := range steps {
		if s.gone != "" {
			gone[s.gone] = true
		}
		if got := d.allocate(s.node, waiting); got != s.want || !slices.Equal(d.Reserved, s.reserved) {
			t.Fatalf("step %d: allocate(%s) = %d, reserved %v; want %d, %v", i, s.node, got, d.Reserved, s.want, s.reserved)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
}

const testConfig = `
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
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 8
`

// Two providers on their own connections (two processes) and many
// machines allocate slots of one backing node at once: every slot goes to
// exactly one carved node, and the rest wait.
func TestSlotsAreNeverGivenTwice(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t, testConfig)
	ctx, b := t.Context(), env.b
	me := Requestor("meta")
	now := time.Now().UTC()
	backing := &kv.Node{ID: "backing1", State: kv.NodeInUse, Holder: me, Labels: []string{"big"}, Provider: "cloud", Pool: "main",
		InterfaceIP: "10.0.0.7", Username: "zuul", ConnectionType: "ssh", ConnectionPort: 22, HostKeys: []string{"ssh-ed25519 AAAA"},
		UserData: encodeJSON(BackingData{Owner: me, Pool: "main", Label: "small", Slots: 8, Allocations: make([]string, 8), Taken: now}),
		Created:  now, StateTime: now}
	if _, err := b.Nodes.Create(ctx, backing.ID, backing); err != nil {
		t.Fatal(err)
	}
	// The env's provider, and another one on a connection of its own,
	// both seeing the backing node.
	waitFor(t, env.p.nodes, "the backing node in the cache", func() bool { return env.p.nodes.Has(backing.ID) })
	_, pjs := env.srv.Connect(t)
	second, err := New(pjs, env.p.cfg, views(t, pjs, env.log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	providers := []*Provider{env.p, second}

	const machines = 20
	results := make([]drivers.Step, machines)
	states := make([]CarvedData, machines)
	var wg sync.WaitGroup
	for i := range machines {
		wg.Go(func() {
			p := providers[i%2]
			sm, err := p.Create(drivers.CreateRequest{NodeID: fmt.Sprintf("carved%02d", i), Provider: "meta", Pool: "main", Label: "small", Attempt: 1}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			step, err := sm.Advance(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = step
			states[i], _ = decodeCarved(sm.State())
		})
	}
	wg.Wait()

	e, err := b.Nodes.Get(ctx, backing.ID)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := decodeBacking(e.Value.UserData)
	done, waiting := 0, 0
	for i, step := range results {
		id := fmt.Sprintf("carved%02d", i)
		switch {
		case step.Done:
			done++
			if d.Allocations[states[i].Slot] != id || states[i].BackingNode != backing.ID {
				t.Errorf("%s got slot %d of %s; the slot map says %q", id, states[i].Slot, states[i].BackingNode, d.Allocations[states[i].Slot])
			}
			inst := step.Instance
			if inst.ExternalID != id || inst.InterfaceIP != "10.0.0.7" || inst.Username != "zuul" || inst.ConnectionPort != 22 || !slices.Equal(inst.HostKeys, backing.HostKeys) {
				t.Errorf("%s instance = %+v", id, inst)
			}
		case states[i].Step == StepWaiting:
			waiting++
			if slices.Contains(d.Allocations, id) {
				t.Errorf("%s waits but has a slot", id)
			}
		default:
			t.Errorf("%s neither done nor waiting: %+v", id, states[i])
		}
	}
	if done != 8 || waiting != machines-8 || d.Used() != 8 {
		t.Errorf("%d allocated, %d waiting, %d slots used; want 8, %d, 8: %v", done, waiting, d.Used(), machines-8, d.Allocations)
	}

	// A resumed machine finds the slot it has; a delete frees it, once.
	first := d.Allocations[0]
	sm, _ := providers[1].Create(drivers.CreateRequest{NodeID: first, Provider: "meta", Pool: "main", Label: "small", Attempt: 1}, nil)
	step, err := sm.Advance(ctx)
	if err != nil || !step.Done || sm.ExternalID() != first {
		t.Fatalf("resumed machine of %s: %+v, %v", first, step, err)
	}
	waitFor(t, providers[0].nodes, "the first provider to see 8 slots of the backing node used", func() bool {
		got, _ := providers[0].nodes.Get(backing.ID)
		gd, _ := decodeBacking(got.Value.UserData)
		return gd.Used() == 8
	})
	dm, _ := providers[0].Delete(first, nil)
	for range 2 {
		if step, err := dm.Advance(ctx); err != nil || !step.Done {
			t.Fatalf("delete of %s: %+v, %v", first, step, err)
		}
	}
	e, _ = b.Nodes.Get(ctx, backing.ID)
	d, _ = decodeBacking(e.Value.UserData)
	if d.Used() != 7 || slices.Contains(d.Allocations, first) {
		t.Errorf("after delete: %v", d.Allocations)
	}
}

// waitFor waits up to 10 s for a condition on a cache, checking it at each
// change.
func waitFor[T any](t *testing.T, c drivers.Records[T], what string, cond func() bool) {
	t.Helper()
	changed, stop := c.Changes()
	defer stop()
	waitfor.Until(t, 10*time.Second, what, cond, waitfor.Wake(changed))
}

// BenchmarkSlotCycle measures taking a slot of a backing node and freeing
// it again: two revision-checked updates of the backing node's record on a
// real server.
func BenchmarkSlotCycle(b *testing.B) {
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	srv := natstest.Start(b)
	_, js := srv.Connect(b)
	ctx := b.Context()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := events.Ensure(ctx, js, 1, log); err != nil {
		b.Fatal(err)
	}
	bs, err := kv.Ensure(ctx, js, kv.Options{}, log)
	if err != nil {
		b.Fatal(err)
	}
	me := Requestor("meta")
	now := time.Now().UTC()
	if _, err := bs.Nodes.Create(ctx, "backing1", &kv.Node{ID: "backing1", State: kv.NodeInUse, Holder: me, Labels: []string{"big"}, Provider: "cloud", Pool: "main",
		UserData: encodeJSON(BackingData{Owner: me, Pool: "main", Label: "small", Slots: 8, Allocations: make([]string, 8), Taken: now}),
		Created:  now, StateTime: now}); err != nil {
		b.Fatal(err)
	}
	meta, _ := cfg.Provider("meta")
	p, err := New(js, meta, views(b, js, log))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := p.synced(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		bid, _, err := p.allocate(ctx, "carved", "big")
		if err != nil || bid != "backing1" {
			b.Fatalf("allocate: %q, %v", bid, err)
		}
		if err := p.deallocate(ctx, "carved"); err != nil {
			b.Fatal(err)
		}
	}
}
