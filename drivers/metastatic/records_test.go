package metastatic

import (
	"strings"
	"testing"
)

// Each decoder refuses data it did not write, naming what is wrong and
// what was expected.
func TestDecodersSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	decoders := map[string]func([]byte) error{
		"user_data":      func(b []byte) error { _, err := decodeBacking(b); return err },
		"requestor_data": func(b []byte) error { _, err := decodeRequest(b); return err },
		"driver_data":    func(b []byte) error { _, err := decodeCarved(b); return err },
	}
	cases := []struct {
		decoder, data, want string
	}{
		{"user_data", `{"owner": "o", "slots": 2, "allocations": ["a", ""]}`, ""},
		{"user_data", `{"owner": "o", "slots": 0, "allocations": []}`, "slots is 0; expected 1 to 10000"},
		{"user_data", `{"owner": "o", "slots": 10001}`, "slots is 10001"},
		{"user_data", `{"owner": "o", "slots": 2, "allocations": [""]}`, "allocations has 1 entries; expected one per slot (2)"},
		{"user_data", `{"owner": "o", "slots": 2, "allocations": ["a", "a"]}`, "node a is listed twice (also at 0)"},
		{"user_data", `{"owner": "o", "slots": 1, "allocations": ["a b"]}`, `allocations[0] is "a b"; expected a node id`},
		{"user_data", `{"slots": 1, "allocations": [""]}`, "owner is empty"},
		{"user_data", ``, "it is empty"},
		{"user_data", `{"slots": "1"}`, "not valid JSON for it"},
		{"requestor_data", `{"provider": "meta", "slots": 2, "nodes": ["a"]}`, ""},
		{"requestor_data", `{"provider": "meta", "slots": -1}`, "slots is -1; expected 1 to 10000"},
		{"requestor_data", `{"slots": 1}`, "provider is empty"},
		{"requestor_data", `{"provider": "meta", "slots": 1, "nodes": ["a", "b"]}`, "nodes lists 2 nodes; expected at most one per slot (1)"},
		{"requestor_data", `null`, "it is empty"},
		{"driver_data", `{"step": "waiting", "slot": 0}`, ""},
		{"driver_data", `{"step": "allocated", "backing_node": "b1", "slot": 3}`, ""},
		{"driver_data", `{"step": "allocated", "slot": 3}`, `backing_node is ""; expected a node id`},
		{"driver_data", `{"step": "waiting", "backing_node": "b1"}`, "while waiting; expected none"},
		{"driver_data", `{"step": "allocated", "backing_node": "b1", "slot": 10000}`, "slot is 10000; expected 0 to 9999"},
		{"driver_data", `{"step": "boot"}`, `step is "boot"; expected "waiting" or "allocated"`},
	}
	for _, tc := range cases {
		err := decoders[tc.decoder]([]byte(tc.data))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %s: %v", tc.decoder, tc.data, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %s: error %v; want one naming %q", tc.decoder, tc.data, err, tc.want)
		}
	}
}
