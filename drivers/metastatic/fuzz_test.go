package metastatic

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// fuzzProvider is a provider with a configuration and no connection: what
// the decoders and checks of records need.
func fuzzProvider() *Provider {
	return &Provider{cfg: &config.Provider{Name: "meta", Driver: "metastatic"}, me: Requestor("meta")}
}

// FuzzSlotMap: any user_data of a node held by the provider is either
// refused with a reason or a slot map that allocating and freeing slots
// keep valid, and that reads back as written.
func FuzzSlotMap(f *testing.F) {
	f.Add([]byte(`{"owner": "NodePool:metastatic:meta", "pool": "main", "label": "small", "slots": 3, "allocations": ["a", "", "c"], "request": "metastatic-x", "taken": "2024-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"owner": "NodePool:metastatic:meta", "slots": 1, "allocations": [""], "idle_since": "2024-01-02T03:04:05Z", "failed": "host key"}`))
	f.Add([]byte(`{"owner": "NodePool:metastatic:meta", "slots": -1, "allocations": []}`))
	f.Add([]byte(`{"owner": "NodePool:metastatic:meta", "slots": 2, "allocations": ["a", "a"]}`))
	f.Add([]byte(`{"slots": 1e10}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`"text"`))
	p := fuzzProvider()
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // a record's user_data is JSON: the record would not decode
		}
		n := &kv.Node{State: kv.NodeInUse, Holder: p.me, Labels: []string{"big"}, UserData: raw}
		d, held, err := p.held(n)
		if !held {
			t.Fatal("a node in use held by the provider is not held")
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a reason")
			}
			return
		}
		if d.Slots < 1 || d.Slots > MaxSlots || len(d.Allocations) != d.Slots || d.Used() > d.Slots {
			t.Fatalf("accepted a slot map that is not one: %+v", d)
		}
		used := d.Used()
		had := d.SlotOf("fuzz-node") >= 0
		s := d.allocate("fuzz-node", func(string) bool { return true })
		switch {
		case s >= 0 && d.Allocations[s] != "fuzz-node":
			t.Fatalf("allocate gave slot %d, which holds %q", s, d.Allocations[s])
		case s < 0 && used < d.Slots && (d.Slots-used > len(d.Reserved) || slices.Contains(d.Reserved, "fuzz-node")):
			t.Fatalf("allocate found no free slot among %d used of %d, %d reserved", used, d.Slots, len(d.Reserved))
		case s >= 0 && !had && d.Used() != used+1:
			t.Fatalf("allocate took %d slots", d.Used()-used)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("allocating made the slot map invalid: %v", err)
		}
		back, err := decodeBacking(encodeJSON(d))
		if err != nil || back.Used() != d.Used() {
			t.Fatalf("slot map does not read back: %v", err)
		}
		if s >= 0 && (!d.free("fuzz-node", time.Now()) || d.SlotOf("fuzz-node") >= 0) {
			t.Fatal("free left the node in its slot")
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("freeing made the slot map invalid: %v", err)
		}
	})
}

// FuzzBackingRequest: any requestor_data of a request by the provider's
// requestor is either refused with a reason or safe to size a slot map by.
func FuzzBackingRequest(f *testing.F) {
	f.Add([]byte(`{"provider": "meta", "pool": "main", "label": "small", "slots": 8, "nodes": ["a", "b"]}`))
	f.Add([]byte(`{"slots": -1}`))
	f.Add([]byte(`{"provider": "meta", "slots": 1, "nodes": ["a", "b"]}`))
	f.Add([]byte(`{"provider": "meta", "slots": 2, "nodes": ["a", "a"]}`))
	f.Add([]byte(`{"provider": "meta", "slots": 2, "nodes": ["../etc"]}`))
	f.Add([]byte(`{"provider": "other", "slots": 2}`))
	f.Add([]byte(`[]`))
	p := fuzzProvider()
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		r := &kv.Request{Requestor: p.me, Labels: []string{"big"}, RequestorData: raw}
		d, ours, err := p.backingRequest(r)
		if !ours {
			t.Fatal("a request by the provider's requestor is not ours")
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a reason")
			}
			return
		}
		if d.Provider != "meta" || d.Slots < 1 || d.Slots > MaxSlots || len(d.Nodes) > d.Slots {
			t.Fatalf("accepted requestor_data that is not valid: %+v", d)
		}
		bd := BackingData{Owner: p.me, Slots: d.Slots, Allocations: make([]string, d.Slots)}
		for _, id := range d.Nodes {
			if bd.allocate(id, func(string) bool { return true }) < 0 {
				t.Fatalf("no slot for waiting node %q of %d", id, d.Slots)
			}
		}
		if err := bd.Validate(); err != nil {
			t.Fatalf("slot map of the listed nodes is not valid: %v", err)
		}
		if _, err := decodeRequest(encodeJSON(d)); err != nil {
			t.Fatalf("requestor_data does not read back: %v", err)
		}
	})
}

// FuzzCarvedData: any driver_data of a carved node either resumes a create
// machine or fails the node with a reason.
func FuzzCarvedData(f *testing.F) {
	f.Add([]byte(`{"step": "waiting", "slot": 0}`))
	f.Add([]byte(`{"step": "allocated", "backing_node": "abc123", "slot": 3}`))
	f.Add([]byte(`{"step": "allocated", "backing_node": "", "slot": -1}`))
	f.Add([]byte(`{"step": "boot"}`))
	f.Add([]byte(`null`))
	p := fuzzProvider()
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		sm, err := p.Create(drivers.CreateRequest{NodeID: "n1", Provider: "meta", Pool: "main", Label: "small", Attempt: 1}, raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a reason")
			}
			return
		}
		st := sm.State()
		d, err := decodeCarved(st)
		if err != nil && string(raw) != "null" {
			t.Fatalf("resumed from %s, the state %s does not read back: %v", raw, st, err)
		}
		if (sm.ExternalID() != "") != (d.Step == StepAllocated) {
			t.Fatalf("external id %q at step %q", sm.ExternalID(), d.Step)
		}
	})
}
