package record

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Records written as the contract documents them read the same with
// Unmarshal as with encoding/json, nulls, empties and escapes included.
func TestUnmarshalReadsWhatEncodingJSONReads(t *testing.T) {
	lease := time.Date(2026, 11, 27, 3, 4, 5, 123456789, time.UTC)
	full := Node{ID: "n1", State: NodeInUse, Labels: []string{"a", "b"}, Provider: "p", Pool: "main",
		ExternalID: "i-1", HostKeys: []string{"ssh-ed25519 AAA"}, ConnectionPort: 22, LeaseUntil: &lease,
		Resources:  Resources{Cores: 2, RAM: 1024, Instances: 1, Other: map[string]int{"L-1216C47A": 2}},
		Attributes: map[string]string{"<b>": "&é\u2028"}, DriverData: json.RawMessage(`{"step":"boot","n":[1,2]}`),
		Kubernetes: &KubernetesAccess{Name: "ns", Namespace: "ns", SkipTLS: true}, Created: lease, Attempt: 3}
	fullJSON, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []struct {
		name string
		data string
	}{
		{"written by encoding/json", string(fullJSON)},
		{"zero node", mustMarshal(t, Node{})},
		{"nulls", `{"id":"n","labels":null,"host_keys":null,"lease_until":null,"hold_expiration":null,"attributes":null,"driver_data":null,"user_data":null,"kubernetes":null,"resources":null}`},
		{"empties", `{"id":"n","labels":[],"host_keys":[],"attributes":{},"driver_data":{},"user_data":[],"resources":{}}`},
		{"missing fields", `{"id":"n","state":"ready"}`},
		{"escapes", `{"id":"n\u00e9\ud83d\ude00","comment":"a\"b\\c\/d\n\t\u003c"}`},
		{"unknown members", `{"id":"n","future":{"x":[1,{"y":null}]},"state":"ready"}`},
		{"numbers", `{"id":"n","connection_port":65535,"attempt":0,"resources":{"cores":-1,"ram":1e3,"instances":0}}`},
		{"times", `{"id":"n","created":"2026-11-27T03:04:05Z","state_time":"2026-11-27T04:04:05.5+01:00"}`},
	}
	for _, tc := range nodes {
		t.Run(tc.name, func(t *testing.T) {
			var want, got Node
			errWant := json.Unmarshal([]byte(tc.data), &want)
			errGot := Unmarshal([]byte(tc.data), &got)
			if (errWant == nil) != (errGot == nil) {
				t.Fatalf("encoding/json: %v; Unmarshal: %v", errWant, errGot)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Unmarshal read\n%#v\nencoding/json read\n%#v", got, want)
			}
		})
	}
	var wantReq, gotReq Request
	data := mustMarshal(t, Request{ID: "r", Labels: []string{"x"}, Nodes: []string{}, RequestorData: json.RawMessage(`{"a":1}`)})
	if err := json.Unmarshal([]byte(data), &wantReq); err != nil {
		t.Fatal(err)
	}
	if err := Unmarshal([]byte(data), &gotReq); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotReq, wantReq) {
		t.Fatalf("request: Unmarshal read %#v, encoding/json %#v", gotReq, wantReq)
	}
}

// What no writer of the contract produces is refused, with an error that
// says what was wrong.
func TestUnmarshalRefusesAmbiguousRecords(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"a member twice", `{"id":"n","state":"ready","state":"deleting"}`, "duplicate"},
		{"invalid UTF-8", "{\"id\":\"n\xff\"}", "UTF-8"},
		{"wrong type", `{"id":"n","connection_port":"22"}`, "connection_port"},
		{"resources not integers", `{"id":"n","resources":{"cores":"many"}}`, "resources"},
		{"trailing data", `{"id":"n"} {}`, "after top-level value"},
		{"not an object", `[]`, "array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n Node
			err := Unmarshal([]byte(tc.data), &n)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Unmarshal(%s) = %v, want an error naming %q", tc.data, err, tc.want)
			}
		})
	}
}

// FuzzUnmarshalNode: whatever Unmarshal reads, encoding/json reads too,
// into the same node, unless a member name differs from the contract's
// only in case (which encoding/json matches and Unmarshal does not); and
// nothing panics.
func FuzzUnmarshalNode(f *testing.F) {
	f.Add([]byte(`{"id":"n","state":"ready","labels":["a"],"resources":{"cores":2,"x":1}}`))
	f.Add([]byte(`{"id":"n","lease_until":"2026-11-27T03:04:05Z","driver_data":{"a":[1]},"user_data":null}`))
	f.Add([]byte(`{"ID":"n","kubernetes":{"name":"x","skiptls":true}}`))
	f.Add([]byte(`{"id":"n","id":"m"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want Node
		if err := Unmarshal(data, &got); err != nil || !exactNames(reflect.TypeFor[Node](), data) {
			return
		}
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("Unmarshal read %q; encoding/json refused it: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: Unmarshal read\n%#v\nencoding/json read\n%#v", data, got, want)
		}
	})
}

// exactNames reports whether every member of the JSON object data, and of
// the objects in it that are structs, is named exactly as a field of t or
// by no field of t even ignoring case.
func exactNames(t reflect.Type, data []byte) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return true
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil {
		return true
	}
	for name, raw := range members {
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			if tag == name && !exactNames(f.Type, raw) {
				return false
			}
			if tag != name && strings.EqualFold(tag, name) {
				return false
			}
		}
	}
	return true
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
