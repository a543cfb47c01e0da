package zkbridge

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// A node's znode carries what Zuul's executor reads, typed as it needs
// it, and none of the keys Zuul would take for attributes of its own.
func TestNodeRecord(t *testing.T) {
	created := time.Date(2026, 11, 25, 10, 0, 0, 500_000_000, time.UTC)
	for _, c := range []struct {
		name string
		node kv.Node
		want map[string]any
	}{
		{"cloud node", kv.Node{ID: "abc", Labels: []string{"small"}, Provider: "p", Pool: "main", Cloud: "c", Region: "r", AZ: "az1",
			ExternalID: "i-1", Hostname: "h", InterfaceIP: "10.0.0.1", PublicIPv4: "10.0.0.1", ConnectionType: "ssh", ConnectionPort: 2222,
			Username: "ubuntu", PythonPath: "/usr/bin/python3", ShellType: "sh", HostKeys: []string{"ssh-ed25519 AAAA"},
			Attributes: map[string]string{"executor-zone": "z"}, Resources: kv.Resources{Cores: 2, RAM: 2048, Instances: 1},
			Tenant: "t", Requestor: "zuul-1", Created: created},
			map[string]any{"state": "ready", "allocated_to": "200-0000000001", "type": []any{"small"}, "connection_port": 2222.0, "ssh_port": 2222.0,
				"username": "ubuntu", "python_path": "/usr/bin/python3", "host_keys": []any{"ssh-ed25519 AAAA"}, "interface_ip": "10.0.0.1",
				"attributes": map[string]any{"executor-zone": "z"}, "resources": map[string]any{"cores": 2.0, "ram": 2048.0, "instances": 1.0},
				"tenant_name": "t", "requestor": "zuul-1", "created_time": 1795600800.5, "hold_expiration": nil, "user_data": nil, "slot": nil,
				"nats_id": "abc", "cloud": "c", "region": "r", "az": "az1", "external_id": "i-1", "provider": "p", "pool": "main"}},
		{"defaults", kv.Node{ID: "d", Labels: []string{"x"}},
			map[string]any{"connection_port": 22.0, "username": "zuul", "python_path": "auto", "host_keys": []any{}, "interface_ip": nil, "tenant_name": nil}},
		// As Nodepool's kubernetes driver: connection_port is the
		// namespace and its credentials, which Zuul's executor writes a
		// kubeconfig from.
		{"kubernetes pod", kv.Node{ID: "k", Labels: []string{"pod"}, ConnectionType: "kubectl", InterfaceIP: "pod-fedora", Cloud: "admin-ctx",
			Kubernetes: &kv.KubernetesAccess{Name: "main-k", Namespace: "main-k", Host: "https://10.0.0.1:6443", Token: "tok", User: "zuul-worker",
				CACert: "LS0t", Pod: "pod-fedora"}},
			map[string]any{"connection_type": "kubectl", "interface_ip": "pod-fedora", "cloud": "admin-ctx",
				"connection_port": map[string]any{"name": "main-k", "namespace": "main-k", "host": "https://10.0.0.1:6443", "skiptls": false,
					"token": "tok", "user": "zuul-worker", "ca_crt": "LS0t", "pod": "pod-fedora"},
				"ssh_port": map[string]any{"name": "main-k", "namespace": "main-k", "host": "https://10.0.0.1:6443", "skiptls": false,
					"token": "tok", "user": "zuul-worker", "ca_crt": "LS0t", "pod": "pod-fedora"}}},
		{"metastatic slot", kv.Node{ID: "m", DriverData: json.RawMessage(`{"step": "allocated", "backing_node": "b", "slot": 3}`)},
			map[string]any{"slot": 3.0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got map[string]any
			if err := json.Unmarshal(NodeRecord(&c.node, "200-0000000001", "pool-id", created), &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range c.want {
				gj, _ := json.Marshal(got[k])
				wj, _ := json.Marshal(v)
				if _, ok := got[k]; !ok || string(gj) != string(wj) {
					t.Errorf("%s = %s, want %s", k, gj, wj)
				}
			}
			for _, k := range []string{"lock", "stat", "name", "label", "aliases", "id"} {
				if _, ok := got[k]; ok {
					t.Errorf("the record holds %q, which Zuul would take for its own attribute", k)
				}
			}
		})
	}
}

// Requests are written back with every key they were read with.
func TestRequestRoundTrip(t *testing.T) {
	in := `{"requestor_data": {"job_uuid": "j"}, "node_types": ["a", "b"], "requestor": "z", "created_time": 1.5, "provider": null, "state": "requested", "state_time": 1.5, "relative_priority": -2, "event_id": "e", "tenant_name": "t", "span_info": {"x": 1}}`
	r, err := ParseRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if r.RelativePriority != -2 || !r.Reuse || r.TenantName != "t" || len(r.NodeTypes) != 2 {
		t.Fatalf("%+v", r)
	}
	r.State, r.Nodes, r.DeclinedBy = "fulfilled", []string{"0000000001", "0000000002"}, nil
	var out map[string]any
	if err := json.Unmarshal(r.Encode(), &out); err != nil {
		t.Fatal(err)
	}
	if out["state"] != "fulfilled" || out["span_info"] == nil || out["requestor_data"].(map[string]any)["job_uuid"] != "j" || out["relative_priority"] != -2.0 {
		t.Errorf("written back: %v", out)
	}
	if d, ok := out["declined_by"].([]any); !ok || len(d) != 0 {
		t.Errorf("declined_by: %v", out["declined_by"])
	}
}
