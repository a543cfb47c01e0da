package record

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
)

// launcherNode is a node as the launcher writes it: every member, UTC
// times, a lease, driver data, attributes, host keys.
func launcherNode() Node {
	at := time.Date(2026, 11, 28, 5, 6, 7, 891011000, time.UTC)
	return Node{ID: "0b4x9m2kq7p1z", State: NodeInUse, Labels: []string{"ubuntu-noble", "large"}, Provider: "cloud1", Pool: "main",
		Cloud: "cloud1", Region: "RegionOne", AZ: "nova", ExternalID: "9d51c04f-4175-4de1-8c57-508b06d55a79", Hostname: "np0000000001",
		InterfaceIP: "203.0.113.7", PublicIPv4: "203.0.113.7", PrivateIPv4: "10.0.0.7", PublicIPv6: "2001:db8::7",
		ConnectionType: "ssh", ConnectionPort: 22, Username: "zuul", PythonPath: "auto", ShellType: "", HostKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"},
		ImageID: "ubuntu-noble-0000000042", AllocatedTo: "req-1", Holder: "zuul", LeaseUntil: &at, Launcher: "launcher-1",
		Resources:  Resources{Cores: 4, RAM: 8192, Instances: 1, Other: map[string]int{"L-1216C47A": 4}},
		Attributes: map[string]string{"tenant": "openstack", "é": "ü"}, DriverData: json.RawMessage(`{"step":"boot","ports":["p1"],"n":1.5,"q":"a\"}b"}`),
		UserData: json.RawMessage(`null`), Tenant: "openstack", Requestor: "zuul-scheduler", Created: at.Add(-time.Hour), StateTime: at,
		Reason: "", Attempt: 2, Owner: "zuul", ZooKeeperID: "0000000001"}
}

// Records as the launcher and encoding/json write them take the fast
// path (so that it does not quietly stop being taken), and read as the
// general decoder reads them.
func TestDecodeNodeReadsWrittenRecords(t *testing.T) {
	full := launcherNode()
	fresh := Node{ID: "n", State: NodeBuilding, Labels: []string{"small"}, Provider: "p", Pool: "main", Created: full.Created, StateTime: full.StateTime}
	held := full
	held.State, held.HoldJob, held.HoldExpiration, held.Comment = NodeHold, "tenant/project/job", full.LeaseUntil, "debugging"
	for _, c := range []struct {
		name string
		data string
	}{
		{"in use", mustMarshal(t, full)},
		{"building", mustMarshal(t, fresh)},
		{"held", mustMarshal(t, held)},
		{"zero", mustMarshal(t, Node{})},
		{"nulls", `{"id":"n","labels":null,"host_keys":null,"lease_until":null,"hold_expiration":null,"attributes":null,"driver_data":null,"user_data":null,"kubernetes":null,"resources":null,"comment":null,"created":null}`},
		{"empties", `{"id":"n","labels":[],"host_keys":[],"attributes":{},"driver_data":{},"user_data":[],"resources":{}}`},
		{"spaces", " {\n \"id\" : \"n\" ,\t\"labels\" : [ \"a\" , \"b\" ] , \"driver_data\" : { \"a\" : [ 1 , 2 ] } , \"user_data\" : 5 ,\"connection_port\": -0 } \n"},
		{"fractions", `{"created":"2026-11-27T03:04:05Z","state_time":"2026-11-27T03:04:05.5Z","lease_until":"2024-02-29T23:59:59.000000001Z"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fast, general Node
			if !decodeNode([]byte(c.data), &fast) {
				t.Fatalf("not read by the fast path: %s", c.data)
			}
			if err := jsonv2.Unmarshal([]byte(c.data), &general); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(fast, general) {
				t.Fatalf("fast path read\n%#v\nthe general decoder\n%#v", fast, general)
			}
		})
	}
}

// What the fast path does not read goes to the general decoder, which
// reads it or says what is wrong.
func TestDecodeNodeLeavesTheRestToTheGeneralDecoder(t *testing.T) {
	for _, data := range []string{
		`{"id":"n\u00e9"}`,                        // an escape
		`{"id":"n","future":1}`,                   // a member it does not know
		`{"id":"n","id":"m"}`,                     // twice
		`{"created":"2026-11-27T04:04:05+01:00"}`, // not UTC
		`{"created":"2026-02-30T03:04:05Z"}`,      // no such day
		`{"connection_port":22.0}`,                // not a plain integer
		`{"connection_port":022}`,                 // leading zero
		`{"kubernetes":{"name":"ns"}}`,            // an object it leaves
		`{"resources":{"cores":1,"cores":2}}`,     // twice, inside
		`{"attributes":{"a":"1","a":"2"}}`,        // twice, inside
		`{"driver_data":{"a":1,"a":2}}`,           // twice, in raw data
		`{"driver_data":{"a":]}`,                  // not JSON
		"{\"id\":\"n\xff\"}",                      // not UTF-8
		`{"id":"n"} {}`,                           // trailing data
		`[]`,
	} {
		var n Node
		if decodeNode([]byte(data), &n) {
			t.Errorf("the fast path read %s", data)
		}
		// Unmarshal reads it as the general decoder does, or refuses it
		// as it does, whatever the fast path left in the node.
		var got, want Node
		errGot, errWant := Unmarshal([]byte(data), &got), jsonv2.Unmarshal([]byte(data), &want)
		if (errGot == nil) != (errWant == nil) || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Unmarshal read %#v (%v); the general decoder %#v (%v)", data, got, errGot, want, errWant)
		}
	}
}

// FuzzDecodeNodeAsTheGeneralDecoder: whatever the fast path reads, the
// general decoder reads into the same node; and nothing panics.
func FuzzDecodeNodeAsTheGeneralDecoder(f *testing.F) {
	full := launcherNode()
	data, err := json.Marshal(full)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"id":"n","labels":null,"attributes":{},"driver_data":null,"resources":{"cores":1,"x":2}}`))
	f.Add([]byte(` {"driver_data": "a\\"}" , "user_data" : [ {"b":[]} ] } `))
	f.Add([]byte(`{"created":"2026-11-27T03:04:05.123456789Z","lease_until":null,"attempt":-12}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast, general Node
		if !decodeNode(data, &fast) {
			return
		}
		if err := jsonv2.Unmarshal(data, &general); err != nil {
			t.Fatalf("the fast path read %q; the general decoder refused it: %v", data, err)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q: the fast path read\n%#v\nthe general decoder\n%#v", data, fast, general)
		}
	})
}

// BenchmarkUnmarshalNode: one node record as the launcher writes it, by
// Unmarshal (the fast path) and by the general decoder.
func BenchmarkUnmarshalNode(b *testing.B) {
	data, err := json.Marshal(launcherNode())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var n Node
			if err := Unmarshal(data, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var n Node
			if err := jsonv2.Unmarshal(data, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Random nodes, written by encoding/json with whitespace strewn between
// tokens, read the same by the fast path as by the general decoder, and
// most are read by the fast path at all.
func TestDecodeNodeRandomRecords(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 28))
	// Half the records have only what the fast path reads (the first
	// texts and times), half anything.
	texts := []string{"", "a", "main", "é", "\x7f", "10.0.0.1", "ünï", "a\"b", `c\d`, "\u2028", "<&>", "\t"}
	times := []time.Time{{}, time.Date(2026, 11, 28, 5, 6, 7, 0, time.UTC), time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.UTC),
		time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1999, 12, 31, 0, 0, 0, 1000, time.FixedZone("", 3600))}
	var clean bool
	pick := func() string {
		if clean {
			return texts[rng.IntN(7)]
		}
		return texts[rng.IntN(len(texts))]
	}
	when := func() time.Time {
		if clean {
			return times[rng.IntN(4)]
		}
		return times[rng.IntN(len(times))]
	}
	ints := []int{0, 1, -1, 22, 65535, -1 << 40, 1<<62 - 1}
	raws := []json.RawMessage{nil, json.RawMessage(`null`), json.RawMessage(`{}`), json.RawMessage(`[1,"]",{"a":"}"}]`), json.RawMessage(`"x\"y"`), json.RawMessage(`-1.5e3`), json.RawMessage(`true`)}
	fast := 0
	const n = 3000
	for i := range n {
		clean = i%2 == 0
		node := Node{ID: pick(), State: NodeState(pick()), Provider: pick(), Pool: pick(), ExternalID: pick(), InterfaceIP: pick(),
			Comment: pick(), ConnectionPort: ints[rng.IntN(len(ints))], Attempt: ints[rng.IntN(len(ints))],
			Created: when(), StateTime: when(),
			DriverData: raws[rng.IntN(len(raws))], UserData: raws[rng.IntN(len(raws))],
			Resources: Resources{Cores: ints[rng.IntN(len(ints))], RAM: rng.IntN(1 << 20)}}
		if rng.IntN(2) == 0 {
			node.Labels = []string{pick(), pick()}
		}
		if rng.IntN(2) == 0 {
			node.Attributes = map[string]string{pick(): pick()}
		}
		if rng.IntN(2) == 0 {
			node.Resources.Other = map[string]int{"L-1216C47A": rng.IntN(100), pick(): 1}
		}
		if rng.IntN(3) == 0 {
			at := when()
			node.LeaseUntil = &at
		}
		if !clean && rng.IntN(10) == 0 {
			node.Kubernetes = &KubernetesAccess{Name: pick()}
		}
		data, err := json.Marshal(node)
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(2) == 0 {
			data = strewn(rng, data)
		}
		var got, want Node
		errWant := jsonv2.Unmarshal(data, &want)
		if !decodeNode(data, &got) {
			continue
		}
		fast++
		if errWant != nil {
			t.Fatalf("the fast path read %s; the general decoder refused it: %v", data, errWant)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: the fast path read\n%#v\nthe general decoder\n%#v", data, got, want)
		}
	}
	if fast < n/4 {
		t.Errorf("the fast path read %d of %d records", fast, n)
	}
	t.Logf("the fast path read %d of %d records", fast, n)
}

// strewn puts whitespace between the tokens of data (outside strings).
func strewn(rng *rand.Rand, data []byte) []byte {
	ws := []string{" ", "\n", "\t", "\r\n  "}
	var out []byte
	in := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		out = append(out, c)
		switch {
		case in && c == '\\':
			i++
			out = append(out, data[i])
		case c == '"':
			in = !in
		case !in && (c == ',' || c == ':' || c == '{' || c == '[') && rng.IntN(2) == 0:
			out = append(out, ws[rng.IntN(len(ws))]...)
		}
	}
	return out
}
