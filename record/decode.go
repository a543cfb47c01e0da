package record

import (
	jsonv2 "github.com/go-json-experiment/json"
)

// Unmarshal decodes a record stored as JSON. It reads the JSON that
// encoding/json writes (and that the README documents) into the same
// values, about twice as fast and with half the allocations (the
// reference implementation of encoding/json/v2): every launcher, cache
// and `nodepool list` decodes every record of a bucket, 100,000 nodes and
// more. It is stricter than encoding/json on what no writer of the
// contract produces: member names match exactly (case-sensitive, as
// documented), a member named twice and invalid UTF-8 are errors, so a
// record two readers could read differently is a bad record instead.
//
// A node record is read whole into a *Node (a member it lacks is zero,
// whatever the node held), and, when written as the launcher and
// encoding/json write one, without the general decoder (decodeNode):
// faster (docs/benchmarks.md has by how much).
func Unmarshal(data []byte, v any) error {
	if n, ok := v.(*Node); ok {
		*n = Node{}
		if decodeNode(data, n) {
			return nil
		}
		*n = Node{}
	}
	return jsonv2.Unmarshal(data, v)
}
