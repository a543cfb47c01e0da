package static

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// FuzzNodeData: any driver_data of a static node is either refused with a
// reason (the node is then registered again) or safe for the checks that
// read it: the recheck backoff stays within its bounds, and a used node is
// put back in line.
func FuzzNodeData(f *testing.F) {
	f.Add([]byte(`{"host": "host1.example.com", "slot": 0, "spec": "0123456789abcdef"}`))
	f.Add([]byte(`{"host": "10.0.0.1", "slot": 2, "spec": "0123456789abcdef", "failures": 3, "next_check": "2024-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"host": "h", "slot": 0, "spec": "0123456789abcdef", "failures": -100}`))
	f.Add([]byte(`{"host": "h", "slot": -1, "spec": "x"}`))
	f.Add([]byte(`{"failures": 9223372036854775807}`))
	f.Add([]byte(`null`))
	m := &manager{interval: time.Second}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // a record's driver_data is JSON: the record would not decode
		}
		d, err := decodeNodeData(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused without a reason")
			}
			if nd := nodeData(&kv.Node{DriverData: raw}); nd != (NodeData{}) {
				t.Fatalf("data that is not valid read as %+v", nd)
			}
		} else if wait := m.recheckAfter(d.Failures + 1); wait <= 0 || wait > maxRecheck {
			t.Fatalf("recheck after %d failures in %s", d.Failures+1, wait)
		}
		n := &kv.Node{State: kv.NodeUsed, DriverData: raw}
		(&Provider{}).Reregister(n, time.Now())
		if n.State != kv.NodeInit {
			t.Fatalf("used node not put back in line: %s", n.State)
		}
	})
}
