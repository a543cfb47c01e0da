package events

import (
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name     string
		data     string
		wantErr  string
		wantID   string
		priority int
		reuse    bool
	}{
		{"minimal", `{"labels":["a"]}`, "", "", DefaultPriority, true},
		{"full", `{"id":"r-1.x","labels":["a","b"],"requestor":"zuul","priority":50,"relative_priority":2,"reuse":false,"tenant":"t","provider":"p","event_id":"e","requestor_data":{"k":1}}`, "", "r-1.x", 50, false},
		{"bad json", `{"labels":`, "bad JSON", "", 0, false},
		{"trailing data", `{"labels":["a"]} {}`, "extra data", "", 0, false},
		{"no labels", `{}`, "labels: required", "", 0, false},
		{"bad label", `{"labels":["a b"]}`, `labels[0]: "a b" is not a valid label name`, "", 0, false},
		{"bad id keeps no id", `{"id":"../x","labels":["a"]}`, "is not valid", "", 0, false},
		{"good id kept on other errors", `{"id":"ok","labels":[]}`, "labels: required", "ok", 0, false},
		{"unknown field", `{"labels":["a"],"label":"a"}`, `unknown field "label"`, "", 0, false},
		{"wrong type", `{"labels":"a"}`, "labels: expected a list of strings, got a JSON string", "", 0, false},
		{"priority not int", `{"labels":["a"],"priority":"high"}`, "priority: expected an integer", "", 0, false},
		{"requestor_data not object", `{"labels":["a"],"requestor_data":[1]}`, "requestor_data: expected a JSON object", "", 0, false},
		{"id too long", `{"id":"` + strings.Repeat("x", 65) + `","labels":["a"]}`, "is not valid", "", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseRequest([]byte(c.data))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error = %v, want %q", err, c.wantErr)
				}
				if m.ID != c.wantID {
					t.Errorf("id = %q, want %q", m.ID, c.wantID)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.ID != c.wantID || m.PriorityOrDefault() != c.priority || m.ReuseOrDefault() != c.reuse {
				t.Errorf("got id %q priority %d reuse %v", m.ID, m.PriorityOrDefault(), m.ReuseOrDefault())
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	if got := RequestID(42); got != "0000000042" {
		t.Errorf("RequestID(42) = %q", got)
	}
}
