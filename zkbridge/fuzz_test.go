package zkbridge

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzParseRequest: whatever is written at a request's znode, ParseRequest
// returns (no panic); a request it accepts is written back as a JSON
// object that keeps every key it was read with and holds every key Zuul's
// parser requires, and reads back the same.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"requestor_data": {"build_set_uuid": "b", "tenant_name": "t", "pipeline_name": "check", "job_uuid": "j", "job_name": "job", "span_info": null}, "node_types": ["small", "large"], "requestor": "abc", "created_time": 1795627954.3, "provider": null, "state": "requested", "state_time": 1795627954.3, "relative_priority": 0, "event_id": "e", "tenant_name": "t"}`,
		`{"state": "pending", "node_types": ["a"], "declined_by": ["x"], "nodes": [], "reuse": false, "future_key": {"deep": [1, 2]}}`,
		`{"state": "fulfilled", "node_types": [], "nodes": ["0000000001"]}`,
		`{"state": "exploding", "node_types": ["a"]}`,
		`{"state": "requested", "node_types": "a"}`,
		`{"state": "requested", "node_types": ["a"], "relative_priority": 1e400}`,
		`{"state": 7}`, `{}`, `null`, `[]`, ``, `{`, `{"a":1} {"b":2}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRequest(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error that says nothing")
			}
			return
		}
		out := r.Encode()
		var back map[string]json.RawMessage
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("written back as %q: %v", out, err)
		}
		for k := range r.raw {
			if _, ok := back[k]; !ok {
				t.Fatalf("key %q lost in %q", k, out)
			}
		}
		for _, k := range []string{"requestor_data", "requestor", "node_types", "provider", "state", "state_time", "event_id"} {
			if _, ok := back[k]; !ok {
				t.Fatalf("written back without %q, which Zuul requires: %q", k, out)
			}
		}
		again, err := ParseRequest(out)
		if err != nil {
			t.Fatalf("written back as %q, which does not read: %v", out, err)
		}
		if again.State != r.State || !slices.Equal(again.NodeTypes, r.NodeTypes) || again.Reuse != r.Reuse || again.RelativePriority != r.RelativePriority {
			t.Fatalf("read back %+v, want %+v", again, r)
		}
	})
}

// FuzzParseNode: whatever is written at a node's znode, ParseNode returns
// (no panic), and a node it accepts is written back keeping every key.
func FuzzParseNode(f *testing.F) {
	for _, seed := range []string{
		`{"state": "in-use", "state_time": 1795627954.3, "provider": "p", "allocated_to": "200-0000000001", "user_data": {"zuul_system": "z", "project_name": "p"}, "nats_id": "abc", "id": "0000000001"}`,
		`{"state": "hold", "hold_job": "t p j .*", "comment": "why", "hold_expiration": 3600}`,
		`{"state": "hold", "hold_expiration": "soon"}`,
		`{"state": "used", "hold_expiration": 1e400}`,
		`{"provider": "p"}`, `{"state": 7}`, `null`, ``, `[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseNode(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error that says nothing")
			}
			return
		}
		if n.HoldExpiration != nil && (*n.HoldExpiration != *n.HoldExpiration) {
			t.Fatal("a hold_expiration that is not a number")
		}
		out := n.Encode()
		var back map[string]json.RawMessage
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("written back as %q: %v", out, err)
		}
		for k := range n.raw {
			if _, ok := back[k]; !ok {
				t.Fatalf("key %q lost", k)
			}
		}
		_ = fromEpoch(n.StateTime)
	})
}

// FuzzParsePoolComponent: another launcher's registration never panics
// the bridge, and one it accepts has an id.
func FuzzParsePoolComponent(f *testing.F) {
	for _, seed := range []string{
		`{"hostname": "h", "kind": "pool", "state": "running", "version": "10", "model_api": 0, "id": "h-PoolWorker.p-main-1", "name": "main", "provider_name": "p", "supported_labels": ["a"], "priority": 100, "paused": false}`,
		`{"id": "FakeLauncher", "supported_labels": ["label1"]}`,
		`{"id": "x", "supported_labels": null}`,
		`{"id": "x", "supported_labels": "abc"}`,
		`{"id": "", "priority": "high"}`, `null`, ``, `[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pc, err := ParsePoolComponent(data)
		if err == nil && pc.ID == "" {
			t.Fatal("accepted a pool without an id")
		}
	})
}
