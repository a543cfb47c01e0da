package record

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// RequestStates lists every request state.
var RequestStates = []RequestState{RequestRequested, RequestPending, RequestFulfilled, RequestFailed}

// Valid reports whether s is a known request state.
func (s RequestState) Valid() bool { return slices.Contains(RequestStates, s) }

// Live reports whether a node in state s is, or will be, a machine that
// can be handed out or is in use: init, building, ready, in-use or hold.
func (s NodeState) Live() bool {
	switch s {
	case NodeInit, NodeBuilding, NodeReady, NodeInUse, NodeHold:
		return true
	}
	return false
}

// Problem says what makes a node record one the service cannot account
// for, or "" if nothing does: a state it does not know, no provider, no
// labels in a live state, or resources below zero or of more than one
// instance. Records written by
// the service never have one; a record that has one was written by hand,
// by a bug or by a newer version, and is failed by the cleanup.
func (n *Node) Problem() string {
	var p []string
	if !n.State.Valid() {
		p = append(p, fmt.Sprintf("unknown state %q (expected one of %s)", n.State, joinStates(NodeStates)))
	}
	if n.Provider == "" {
		p = append(p, "no provider")
	}
	if len(n.Labels) == 0 && n.State.Live() {
		p = append(p, fmt.Sprintf("no labels in state %s", n.State))
	}
	if bad := n.Resources.Problem(); bad != "" {
		p = append(p, bad)
	}
	return strings.Join(p, "; ")
}

// Accountable reports whether a node record counts against quota: one
// with a problem holds nothing the service knows of.
func (n *Node) Accountable() bool { return n.Problem() == "" }

// Problem says what makes a request record one the service cannot act on,
// or "" if nothing does: a state it does not know.
func (r *Request) Problem() string {
	if !r.State.Valid() {
		return fmt.Sprintf("unknown state %q (expected one of %s)", r.State, joinStates(RequestStates))
	}
	return ""
}

// Problem says what makes resources impossible for one node, or "".
func (r Resources) Problem() string {
	if r.Instances < 0 || r.Cores < 0 || r.RAM < 0 {
		return fmt.Sprintf("resources below zero (%d instances, %d cores, %d MB RAM)", r.Instances, r.Cores, r.RAM)
	}
	if r.Instances > 1 {
		return fmt.Sprintf("resources of %d instances (a node is one)", r.Instances)
	}
	for k, v := range r.Other {
		if v < 0 {
			return fmt.Sprintf("resource %q below zero (%d)", k, v)
		}
	}
	return ""
}

func joinStates[S ~string](states []S) string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}

// SalvageNode reads what it can of a node record that does not decode:
// the fields that say where it is and what it holds in the cloud, where
// they are strings.
func SalvageNode(key string, data []byte) *Node {
	str := salvage(data)
	return &Node{ID: key, Provider: str("provider"), Pool: str("pool"), ExternalID: str("external_id"),
		Cloud: str("cloud"), Region: str("region"), Hostname: str("hostname"), Owner: str("owner"), Requestor: str("requestor"),
		Labels: []string{}, HostKeys: []string{}}
}

// SalvageRequest reads what it can of a request record that does not
// decode: who made it.
func SalvageRequest(key string, data []byte) Request {
	str := salvage(data)
	return Request{ID: key, Requestor: str("requestor"), Owner: str("owner"), Labels: []string{}, Nodes: []string{},
		DeclinedBy: []string{}, RequestorData: json.RawMessage("{}")}
}

// salvage returns a reader of a JSON object's string fields; it reads ""
// for whatever is not one, and for everything when data is no object.
func salvage(data []byte) func(string) string {
	fields := map[string]json.RawMessage{}
	_ = json.Unmarshal(data, &fields)
	return func(k string) string {
		var s string
		_ = json.Unmarshal(fields[k], &s)
		return s
	}
}
