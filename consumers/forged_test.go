package consumers_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// A node record is writable by requestors: one that names another node's
// instance as its own before giving the node back does not get that
// instance deleted. The record goes; the other node keeps its instance;
// the given-back node's own instance, left without a node, is a leak for
// the leak sweep (not waited for here).
func TestForgedExternalIDDeletesNothingElse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, twoReadyConfig)
	h.startLauncher("l1")
	h.untilReady(2)
	var nodes []kv.Node
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool { nodes = append(nodes, e.Value); return true })
	forger, victim := nodes[0], nodes[1]

	// The requestor takes the forger node, writes the victim's instance
	// as the node's, and gives it back.
	if _, err := h.b.Nodes.Modify(t.Context(), forger.ID, func(n *kv.Node) error {
		n.State, n.Holder, n.ExternalID = kv.NodeUsed, "mallory", victim.ExternalID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// (Seen gone in the cache the checks below read.)
	h.until(10*time.Second, "the forger node's record gone", func() bool {
		_, ok := h.nodes.Get(forger.ID)
		return !ok
	})
	if _, ok := h.instances["cloud1"].Get(victim.ExternalID); !ok {
		t.Fatalf("the victim's instance %s was deleted for a record that named it", victim.ExternalID)
	}
	if n, ok := h.node(victim.ID); !ok || n.State != kv.NodeReady {
		t.Fatalf("victim node: %+v, %v", n, ok)
	}
}

// The same with carved nodes: a record naming another carved node's slot
// as its own does not free that slot while its node still runs there.
func TestForgedExternalIDFreesNoOtherSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, metaConfig("0.05", "            max-parallel-jobs: 4\n"))
	h.startLauncher("l1")
	nodes := h.requestSmall(2)
	forger, victim := nodes[0], nodes[1]
	if _, err := h.b.Nodes.Modify(t.Context(), forger, func(n *kv.Node) error {
		n.State, n.ExternalID = kv.NodeUsed, victim
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// (Seen gone in the cache the checks below read.)
	h.until(10*time.Second, "the forger node's record gone", func() bool {
		_, ok := h.nodes.Get(forger)
		return !ok
	})
	held := false
	for _, bn := range h.backings() {
		d, _ := backingData(&bn)
		held = held || slices.Contains(d.Allocations, victim)
	}
	if !held {
		t.Fatalf("the victim %s lost its slot to a record that named it\n%s", victim, h.dump())
	}
	h.checkCarved()
}
