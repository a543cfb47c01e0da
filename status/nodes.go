package status

import (
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// NodeColumns are node-list's fields: Nodepool's 21, in its order, then
// this project's own.
var NodeColumns = []Column{
	{"id", "ID"}, {"provider", "Provider"}, {"label", "Label"}, {"server_id", "Server ID"},
	{"public_ipv4", "Public IPv4"}, {"ipv6", "IPv6"}, {"state", "State"},
	// Nodepool's "Age" is the age of the state; the header says so, as
	// node_age is shown beside it.
	{"age", "State Age"}, {"locked", "Locked"},
	{"pool", "Pool"}, {"hostname", "Hostname"}, {"private_ipv4", "Private IPv4"}, {"AZ", "AZ"},
	{"username", "Username"}, {"connection_port", "Port"}, {"launcher", "Launcher"},
	{"allocated_to", "Allocated To"}, {"hold_job", "Hold Job"}, {"comment", "Comment"},
	{"user_data", "User Data"}, {"driver_data", "Driver Data"},
	// Extensions.
	{"node_age", "Node Age"}, {"holder", "Holder"}, {"hold_expiration", "Hold Expiration"},
	{"interface_ip", "Interface IP"}, {"image_id", "Image ID"}, {"requestor", "Requestor"},
	// The node's id in Zuul's ZooKeeper, while it is handed to Zuul.
	{"zookeeper_id", "ZooKeeper ID"},
}

// NodeListDefault are the fields `nodepool list` shows: Nodepool's nine,
// the node's age beside its state's, who holds it and why it is held or
// failed.
var NodeListDefault = []string{"id", "provider", "label", "server_id", "public_ipv4", "ipv6", "state", "age", "node_age",
	"locked", "holder", "comment"}

// Liveness tells whether a process (a launcher's id) has a live component
// record.
type Liveness func(id string) bool

// Locked says whether someone owns a node now, as Nodepool's lock column
// did: a requestor that took it (in-use), or a live launcher that is
// launching or deleting it.
func Locked(n *kv.Node, alive Liveness) bool {
	switch n.State {
	case kv.NodeInUse:
		return true
	case kv.NodeInit, kv.NodeBuilding, kv.NodeDeleting:
		return n.Launcher != "" && alive(n.Launcher)
	}
	return false
}

// LauncherName is how a node's launcher is shown: a launcher whose
// component record is gone is not presented as the node's owner.
func LauncherName(id string, alive Liveness) string {
	if id == "" || alive(id) {
		return id
	}
	return id + " (gone)"
}

// SortNodes orders nodes by creation, then id.
func SortNodes(nodes []*kv.Node) {
	slices.SortFunc(nodes, func(x, y *kv.Node) int {
		if c := x.Created.Compare(y.Created); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
}

// Pointers points at each node of a slice, in order.
func Pointers(nodes []kv.Node) []*kv.Node {
	out := make([]*kv.Node, len(nodes))
	for i := range nodes {
		out[i] = &nodes[i]
	}
	return out
}

// nodeCells gives each column's cell of a node, in NodeColumns' order.
var nodeCells = []func(n *kv.Node, alive Liveness, now time.Time) Cell{
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.ID) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Provider) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(strings.Join(n.Labels, ",")) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.ExternalID) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.PublicIPv4) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.PublicIPv6) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(string(n.State)) },
	func(n *kv.Node, _ Liveness, now time.Time) Cell { return age(n.StateTime, now) },
	func(n *kv.Node, alive Liveness, _ time.Time) Cell {
		if Locked(n, alive) {
			return text("locked")
		}
		return text("unlocked")
	},
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Pool) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Hostname) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.PrivateIPv4) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.AZ) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Username) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return number(n.ConnectionPort) },
	func(n *kv.Node, alive Liveness, _ time.Time) Cell { return text(LauncherName(n.Launcher, alive)) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.AllocatedTo) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.HoldJob) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell {
		if n.Comment == "" {
			return text(n.Reason)
		}
		return text(n.Comment)
	},
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return raw(n.UserData) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return raw(n.DriverData) },
	func(n *kv.Node, _ Liveness, now time.Time) Cell { return age(n.Created, now) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Holder) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return timeOf(n.HoldExpiration) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.InterfaceIP) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.ImageID) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.Requestor) },
	func(n *kv.Node, _ Liveness, _ time.Time) Cell { return text(n.ZooKeeperID) },
}

// NodeList is node-list of the given nodes (in their order), which it
// reads without changing (a cache's records). Its cells are made only for
// the columns shown.
func NodeList(nodes []*kv.Node, alive Liveness, now time.Time) *Table {
	return &Table{Columns: NodeColumns, Default: NodeListDefault, N: len(nodes),
		At: func(row, col int) Cell { return nodeCells[col](nodes[row], alive, now) }}
}
