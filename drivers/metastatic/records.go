package metastatic

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/events"
)

// MaxSlots bounds the slots of one backing node as the driver reads them
// from records: a slot map or a backing request asking for more is not one
// this driver wrote, and is refused before anything is sized by it. A
// label's max-parallel-jobs above it counts as MaxSlots.
const MaxSlots = 10000

// Steps of a carved node's create machine.
const (
	StepWaiting   = "waiting"   // no free slot yet: waiting for a backing node
	StepAllocated = "allocated" // has its slot
)

// BackingData is what a backing node holds in user_data while it is ours.
// The backing node is shared by every label of the provider whose
// backing-label is the backing node's label.
type BackingData struct {
	Owner string `json:"owner"`
	// Pool and Label are the carved label it was first requested for
	// (informational: every label with the same backing-label uses it).
	Pool  string `json:"pool"`
	Label string `json:"label"`
	// Slots is the number of carved nodes the backing node takes
	// (max-parallel-jobs when it was taken).
	Slots int `json:"slots"`
	// Allocations has one entry per slot: the carved node's id, or "".
	Allocations []string `json:"allocations"`
	// Request is the backing request it was taken for.
	Request string    `json:"request"`
	Taken   time.Time `json:"taken"`
	// IdleSince is when its last slot was freed (or when it was taken
	// without any); grace-time runs from here.
	IdleSince *time.Time `json:"idle_since,omitempty"`
	// Failed says why a host-key check of a carved node on it failed: it
	// takes no new slots and is given back as soon as it is empty.
	Failed string `json:"failed,omitempty"`
	// Released is when it was given back.
	Released *time.Time `json:"released,omitempty"`
	// Reserved are the carved nodes its backing request listed that have
	// not taken a slot yet: while they wait, they have the first claim on
	// its free slots, and a node that came later takes one only if more
	// are free than they need (it waits for the backing node the manager
	// requests or finds for it).
	Reserved []string `json:"reserved,omitempty"`
}

// Used counts the allocated slots.
func (d *BackingData) Used() int {
	n := 0
	for _, a := range d.Allocations {
		if a != "" {
			n++
		}
	}
	return n
}

// SlotOf returns the slot of a carved node, or -1.
func (d *BackingData) SlotOf(nodeID string) int { return slices.Index(d.Allocations, nodeID) }

// allocate gives the first free slot to a carved node; -1 if none is free
// for it. The reserved nodes still waiting (waiting tells which) have the
// first claim on the free slots; those that no longer wait lose theirs.
func (d *BackingData) allocate(nodeID string, waiting func(id string) bool) int {
	if s := d.SlotOf(nodeID); s >= 0 {
		return s
	}
	d.Reserved = slices.DeleteFunc(d.Reserved, func(id string) bool { return id != nodeID && (d.SlotOf(id) >= 0 || !waiting(id)) })
	if !slices.Contains(d.Reserved, nodeID) && d.Slots-d.Used() <= len(d.Reserved) {
		return -1
	}
	s := slices.Index(d.Allocations, "")
	if s >= 0 {
		d.Allocations[s] = nodeID
		d.IdleSince = nil
		d.Reserved = slices.DeleteFunc(d.Reserved, func(id string) bool { return id == nodeID })
	}
	return s
}

// free frees a carved node's slot; when it was the last one, the backing
// node is idle from now.
func (d *BackingData) free(nodeID string, now time.Time) bool {
	s := d.SlotOf(nodeID)
	if s < 0 {
		return false
	}
	d.Allocations[s] = ""
	if d.Used() == 0 {
		d.IdleSince = &now
	}
	return true
}

// Validate checks a slot map read from a record: a slot count within
// MaxSlots, one allocation entry per slot, each a node id or "", and no
// node in two slots.
func (d *BackingData) Validate() error {
	var problems []string
	if d.Owner == "" {
		problems = append(problems, "owner is empty; expected the requestor name of the provider holding it")
	}
	if d.Slots < 1 || d.Slots > MaxSlots {
		problems = append(problems, fmt.Sprintf("slots is %d; expected 1 to %d", d.Slots, MaxSlots))
	}
	if len(d.Allocations) != d.Slots {
		problems = append(problems, fmt.Sprintf("allocations has %d entries; expected one per slot (%d)", len(d.Allocations), d.Slots))
	}
	problems = append(problems, checkNodeIDs("allocations", d.Allocations, true)...)
	if len(d.Reserved) > MaxSlots {
		problems = append(problems, fmt.Sprintf("reserved has %d entries; expected at most %d", len(d.Reserved), MaxSlots))
	} else {
		problems = append(problems, checkNodeIDs("reserved", d.Reserved, false)...)
	}
	return joinProblems(problems)
}

// CarvedData is a carved node's driver_data (its create machine's state).
type CarvedData struct {
	Step        string `json:"step"`
	BackingNode string `json:"backing_node,omitempty"`
	Slot        int    `json:"slot"`
}

// Validate checks a carved node's driver_data: a known step, a slot within
// MaxSlots and, once allocated (only then), a backing node id.
func (d *CarvedData) Validate() error {
	var problems []string
	switch d.Step {
	case StepWaiting:
		if d.BackingNode != "" {
			problems = append(problems, fmt.Sprintf("backing_node is %q while waiting; expected none", truncate(d.BackingNode)))
		}
	case StepAllocated:
		if !events.ValidID(d.BackingNode) {
			problems = append(problems, fmt.Sprintf("backing_node is %q; expected a node id", truncate(d.BackingNode)))
		}
	default:
		problems = append(problems, fmt.Sprintf("step is %q; expected %q or %q", truncate(d.Step), StepWaiting, StepAllocated))
	}
	if d.Slot < 0 || d.Slot >= MaxSlots {
		problems = append(problems, fmt.Sprintf("slot is %d; expected 0 to %d", d.Slot, MaxSlots-1))
	}
	return joinProblems(problems)
}

// RequestData is a backing request's requestor_data. The backing label is
// the request's label.
type RequestData struct {
	Provider string `json:"provider"`
	// Pool and Label are the carved label of the nodes that first waited
	// for it (informational: nodes of every label with the same
	// backing-label join it).
	Pool  string `json:"pool"`
	Label string `json:"label"`
	Slots int    `json:"slots"`
	// Nodes are the carved nodes waiting for this backing node; they get
	// its first slots when it is taken.
	Nodes []string `json:"nodes"`
}

// Validate checks a backing request's requestor_data: a provider name, a
// slot count within MaxSlots, and no more waiting nodes than slots, each a
// node id, none twice.
func (d *RequestData) Validate() error {
	var problems []string
	if d.Provider == "" {
		problems = append(problems, "provider is empty; expected the metastatic provider's name")
	}
	if d.Slots < 1 || d.Slots > MaxSlots {
		problems = append(problems, fmt.Sprintf("slots is %d; expected 1 to %d", d.Slots, MaxSlots))
	}
	if len(d.Nodes) > max(d.Slots, 0) {
		problems = append(problems, fmt.Sprintf("nodes lists %d nodes; expected at most one per slot (%d)", len(d.Nodes), d.Slots))
	}
	problems = append(problems, checkNodeIDs("nodes", d.Nodes, false)...)
	return joinProblems(problems)
}

// checkNodeIDs checks a list of node ids: each valid ("" allowed where
// empty is), none twice. It names at most a few problems.
func checkNodeIDs(field string, ids []string, empty bool) []string {
	var problems []string
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		if len(problems) >= 3 {
			problems = append(problems, "...")
			break
		}
		switch {
		case id == "" && empty:
			continue
		case !events.ValidID(id):
			problems = append(problems, fmt.Sprintf("%s[%d] is %q; expected a node id", field, i, truncate(id)))
		case seen[id] > 0:
			problems = append(problems, fmt.Sprintf("%s[%d]: node %s is listed twice (also at %d)", field, i, id, seen[id]-1))
		default:
			seen[id] = i + 1
		}
	}
	return problems
}

func truncate(s string) string {
	if len(s) > 70 {
		return s[:64] + "..."
	}
	return s
}

func joinProblems(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

// validator is a record's data that checks itself.
type validator[T any] interface {
	*T
	Validate() error
}

// decode reads and validates driver data from a record; the error says
// what is wrong with it.
func decode[T any, PT validator[T]](raw json.RawMessage) (T, error) {
	var v T
	if len(raw) == 0 || string(raw) == "null" {
		return v, errors.New("it is empty")
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("not valid JSON for it: %w", err)
	}
	if err := PT(&v).Validate(); err != nil {
		return v, err
	}
	return v, nil
}

func decodeBacking(raw json.RawMessage) (BackingData, error) {
	return decode[BackingData](raw)
}

func decodeCarved(raw json.RawMessage) (CarvedData, error) { return decode[CarvedData](raw) }

func decodeRequest(raw json.RawMessage) (RequestData, error) { return decode[RequestData](raw) }

func encodeJSON(v any) json.RawMessage {
	data, _ := json.Marshal(v)
	return data
}
