package status_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/status"
)

func TestAge(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, c := range []struct {
		ago  time.Duration
		want string
	}{
		{0, "00:00:00:00"},
		{59 * time.Second, "00:00:00:59"},
		{time.Hour + 2*time.Minute + 3*time.Second, "00:01:02:03"},
		{50*time.Hour + 30*time.Second, "02:02:00:30"},
		{-time.Minute, "00:00:00:00"}, // a clock ahead of ours
	} {
		if got := status.Age(now.Add(-c.ago), now); got != c.want {
			t.Errorf("Age(%s ago) = %q, want %q", c.ago, got, c.want)
		}
	}
	if got := status.Age(time.Time{}, now); got != "" {
		t.Errorf("Age(zero) = %q, want empty", got)
	}
}

func sample() *status.Table {
	return &status.Table{
		Columns: []status.Column{{Key: "id", Header: "ID"}, {Key: "name", Header: "Name"}, {Key: "n", Header: "Count"}},
		Rows: [][]status.Cell{
			{{JSON: "1", Text: "1"}, {JSON: "ünïcode", Text: "ünïcode"}, {JSON: 3, Text: "3"}},
			{{JSON: "22", Text: "22"}, {JSON: "", Text: ""}, {JSON: nil, Text: ""}},
		},
	}
}

func TestWriteText(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := sample().WriteText(&b, nil); err != nil {
		t.Fatal(err)
	}
	want := `+----+---------+-------+
| ID | Name    | Count |
+----+---------+-------+
| 1  | ünïcode | 3     |
| 22 |         |       |
+----+---------+-------+
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	if err := sample().WriteText(&b, []string{"n", "id"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.Split(b.String(), "\n")[1], "| Count | ID |") {
		t.Errorf("fields in the order given:\n%s", b.String())
	}
	// Cells wider than one run of padding, and padding wider than one.
	long := strings.Repeat("x", 150)
	wide := &status.Table{Columns: []status.Column{{Key: "a", Header: "A"}, {Key: "b", Header: "B"}},
		Rows: [][]status.Cell{{{Text: long}, {Text: "é"}}, {{Text: "y"}, {Text: ""}}}}
	b.Reset()
	if err := wide.WriteText(&b, nil); err != nil {
		t.Fatal(err)
	}
	rule := "+" + strings.Repeat("-", 152) + "+---+\n"
	want = rule + "| A" + strings.Repeat(" ", 150) + "| B |\n" + rule +
		"| " + long + " | é |\n" + "| y" + strings.Repeat(" ", 150) + "|   |\n" + rule
	if b.String() != want {
		t.Errorf("wide table: got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	empty := &status.Table{Columns: []status.Column{{Key: "label", Header: "Label"}}}
	if err := empty.WriteText(&b, nil); err != nil || b.String() != "+-------+\n| Label |\n+-------+\n+-------+\n" {
		t.Errorf("empty table: %v\n%s", err, b.String())
	}
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := sample().WriteJSON(&b, []string{"name", "id"}); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != `[{"name":"ünïcode","id":"1"},{"name":"","id":"22"}]`+"\n" {
		t.Errorf("got %s", got)
	}
	b.Reset()
	empty := &status.Table{Columns: []status.Column{{Key: "label", Header: "Label"}}}
	if err := empty.WriteJSON(&b, nil); err != nil || b.String() != "[]\n" {
		t.Errorf("empty: %v %q", err, b.String())
	}
	if err := sample().WriteJSON(&b, []string{"id", "colour"}); err == nil || !strings.Contains(err.Error(), `unknown field "colour"; expected some of: id, name, n`) {
		t.Errorf("unknown field: %v", err)
	}
}

func TestParseFields(t *testing.T) {
	t.Parallel()
	if got := status.ParseFields(" id, ,state,"); fmt.Sprint(got) != "[id state]" {
		t.Errorf("ParseFields = %v", got)
	}
	if got := status.ParseFields(""); got != nil {
		t.Errorf("ParseFields(\"\") = %v", got)
	}
}

// A launcher whose component record is gone is not shown as the node's
// owner, and its nodes are not locked.
func TestNodeListLiveness(t *testing.T) {
	t.Parallel()
	now := time.Now()
	nodes := []kv.Node{
		{ID: "a", State: kv.NodeBuilding, Launcher: "alive-1", Created: now.Add(-time.Hour), StateTime: now.Add(-time.Minute)},
		{ID: "b", State: kv.NodeBuilding, Launcher: "dead-1", Created: now, StateTime: now},
		{ID: "c", State: kv.NodeInUse, Launcher: "dead-1", Holder: "zuul", Created: now, StateTime: now},
		{ID: "d", State: kv.NodeReady, Launcher: "alive-1", Created: now, StateTime: now},
	}
	alive := func(id string) bool { return id == "alive-1" }
	tb := status.NodeList(status.Pointers(nodes), alive, now)
	var b bytes.Buffer
	if err := tb.WriteJSON(&b, []string{"id", "launcher", "locked", "age", "node_age"}); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]string
	if err := json.Unmarshal(b.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{
		{"id": "a", "launcher": "alive-1", "locked": "locked", "age": "00:00:01:00", "node_age": "00:01:00:00"},
		{"id": "b", "launcher": "dead-1 (gone)", "locked": "unlocked", "age": "00:00:00:00", "node_age": "00:00:00:00"},
		{"id": "c", "launcher": "dead-1 (gone)", "locked": "locked", "age": "00:00:00:00", "node_age": "00:00:00:00"},
		{"id": "d", "launcher": "alive-1", "locked": "unlocked", "age": "00:00:00:00", "node_age": "00:00:00:00"},
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("rows\n%v\nwant\n%v", rows, want)
	}
}

// Rendering `nodepool list` of 10,000 nodes (reading them is measured by
// `nodepool bench scale`).
func BenchmarkNodeList10k(b *testing.B) {
	now := time.Now()
	nodes := make([]kv.Node, 10000)
	for i := range nodes {
		nodes[i] = kv.Node{ID: fmt.Sprintf("n%09d", i), State: kv.NodeReady, Labels: []string{"ubuntu-noble"}, Provider: "cloud",
			Pool: "main", ExternalID: fmt.Sprintf("i-%016x", i), PublicIPv4: "10.0.0.1", Launcher: "l1", Created: now, StateTime: now,
			DriverData: json.RawMessage(`{"step":"boot"}`)}
	}
	alive := func(string) bool { return true }
	var out bytes.Buffer
	for b.Loop() {
		out.Reset()
		ns := status.Pointers(nodes)
		status.SortNodes(ns)
		if err := status.NodeList(ns, alive, now).WriteText(&out, status.NodeListDefault); err != nil {
			b.Fatal(err)
		}
	}
}

func TestNodeCellsMatchColumns(t *testing.T) {
	t.Parallel()
	tb := status.NodeList([]*kv.Node{{ID: "x"}}, func(string) bool { return false }, time.Now())
	var b bytes.Buffer
	if err := tb.WriteJSON(&b, nil); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(b.Bytes(), &rows); err != nil || len(rows[0]) != len(status.NodeColumns) {
		t.Errorf("a node row has %d fields for %d columns: %v", len(rows[0]), len(status.NodeColumns), err)
	}
}

// SortNodes orders by creation, then id, and keeps every node whole.
func TestSortNodes(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	for _, n := range []int{0, 1, 2, 3, 10, 1000} {
		nodes := make([]kv.Node, n)
		for i := range nodes {
			// Creation times repeat, so the id decides among equals.
			nodes[i] = kv.Node{ID: fmt.Sprintf("n%04d", (i*7919)%max(n, 1)), Created: base.Add(time.Duration((i*31)%5) * time.Second)}
			nodes[i].Hostname = nodes[i].ID
		}
		ns := status.Pointers(nodes)
		status.SortNodes(ns)
		for i := range ns {
			if ns[i].Hostname != ns[i].ID {
				t.Fatalf("n=%d: node %d mixed up: id %s, hostname %s", n, i, ns[i].ID, ns[i].Hostname)
			}
			if i > 0 {
				p, c := ns[i-1], ns[i]
				if p.Created.After(c.Created) || (p.Created.Equal(c.Created) && p.ID >= c.ID) {
					t.Fatalf("n=%d: out of order at %d: %s %v before %s %v", n, i, p.ID, p.Created, c.ID, c.Created)
				}
			}
		}
	}
}
