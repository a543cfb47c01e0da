package kv

import "github.com/nodepool-nats/nodepool/record"

// The records this package stores are package record's; these names keep
// kv.Node and the like for the code that stores and watches them.
type (
	Node             = record.Node
	NodeState        = record.NodeState
	KubernetesAccess = record.KubernetesAccess
	Request          = record.Request
	RequestState     = record.RequestState
	ComponentPool    = record.ComponentPool
	CloudQuota       = record.CloudQuota
	Component        = record.Component
	LeaseRecord      = record.LeaseRecord
	Resources        = record.Resources
)

// Node states.
const (
	NodeInit     = record.NodeInit
	NodeBuilding = record.NodeBuilding
	NodeReady    = record.NodeReady
	NodeInUse    = record.NodeInUse
	NodeUsed     = record.NodeUsed
	NodeHold     = record.NodeHold
	NodeDeleting = record.NodeDeleting
	NodeFailed   = record.NodeFailed
	NodeAborted  = record.NodeAborted
)

// Request states.
const (
	RequestRequested = record.RequestRequested
	RequestPending   = record.RequestPending
	RequestFulfilled = record.RequestFulfilled
	RequestFailed    = record.RequestFailed
)

// Every state of a node, and of a request.
var (
	NodeStates    = record.NodeStates
	RequestStates = record.RequestStates
)

// PoolRef names a pool: provider/pool.
func PoolRef(provider, pool string) string { return record.PoolRef(provider, pool) }

// SalvageNode is record.SalvageNode.
func SalvageNode(key string, data []byte) *Node { return record.SalvageNode(key, data) }

// SalvageRequest is record.SalvageRequest.
func SalvageRequest(key string, data []byte) Request { return record.SalvageRequest(key, data) }
