package status

import (
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// RequestColumns are request-list's fields: Nodepool's eight, in its
// order, then this project's own.
var RequestColumns = []Column{
	{"id", "Request ID"}, {"relative_priority", "Priority"}, {"state", "State"}, {"requestor", "Requestor"},
	{"node_types", "Node Types"}, {"nodes", "Nodes"}, {"declined_by", "Declined By"}, {"event_id", "Event ID"},
	// Extensions.
	{"pool", "Pool"}, {"age", "Age"}, {"reason", "Reason"}, {"priority", "Base Priority"},
	{"tenant", "Tenant"}, {"provider", "Provider"},
}

// RequestListDefault are the fields `nodepool request-list` shows.
var RequestListDefault = []string{"id", "relative_priority", "state", "requestor", "node_types", "nodes", "declined_by",
	"event_id", "pool", "age", "reason"}

// SortRequests orders requests by creation, then id.
func SortRequests(reqs []kv.Request) {
	slices.SortFunc(reqs, func(x, y kv.Request) int {
		if c := x.Created.Compare(y.Created); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
}

// RequestList is request-list of the given requests (in their order).
func RequestList(reqs []kv.Request, now time.Time) *Table {
	t := &Table{Columns: RequestColumns, Default: RequestListDefault}
	for i := range reqs {
		r := &reqs[i]
		pool := ""
		if r.Provider != "" && r.Pool != "" {
			pool = kv.PoolRef(r.Provider, r.Pool)
		}
		t.Rows = append(t.Rows, []Cell{
			text(r.ID), number(r.RelativePriority), text(string(r.State)), text(r.Requestor),
			list(r.Labels), list(r.Nodes), list(r.DeclinedBy), text(r.EventID),
			text(pool), age(r.Created, now), text(r.Reason), number(r.Priority),
			text(r.Tenant), text(r.Provider),
		})
	}
	return t
}

// LabelColumns are label-list's fields: Nodepool's label, then the pools
// that serve it.
var LabelColumns = []Column{{"label", "Label"}, {"pools", "Pools"}}

// LabelList lists the labels the live launchers serve, with the pools
// that serve each (as the launchers announce them).
func LabelList(components []kv.Component) *Table {
	pools := map[string][]string{}
	for _, c := range components {
		for _, p := range c.Pools {
			for _, l := range p.Labels {
				ref := kv.PoolRef(p.Provider, p.Pool)
				if !slices.Contains(pools[l], ref) {
					pools[l] = append(pools[l], ref)
				}
			}
		}
	}
	labels := make([]string, 0, len(pools))
	for l := range pools {
		labels = append(labels, l)
	}
	slices.Sort(labels)
	t := &Table{Columns: LabelColumns}
	for _, l := range labels {
		refs := pools[l]
		slices.Sort(refs)
		t.Rows = append(t.Rows, []Cell{text(l), list(refs)})
	}
	return t
}
