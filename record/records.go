package record

import (
	"encoding/json"
	"maps"
	"slices"
	"time"
)

// NodeState is the state of a node, as in Nodepool.
type NodeState string

// Node states.
const (
	NodeInit     NodeState = "init"
	NodeBuilding NodeState = "building"
	NodeReady    NodeState = "ready"
	NodeInUse    NodeState = "in-use"
	NodeUsed     NodeState = "used"
	NodeHold     NodeState = "hold"
	NodeDeleting NodeState = "deleting"
	NodeFailed   NodeState = "failed"
	NodeAborted  NodeState = "aborted"
)

// NodeStates lists every node state.
var NodeStates = []NodeState{NodeInit, NodeBuilding, NodeReady, NodeInUse, NodeUsed, NodeHold, NodeDeleting, NodeFailed, NodeAborted}

// Valid reports whether s is a known node state.
func (s NodeState) Valid() bool { return slices.Contains(NodeStates, s) }

// Node is a record of the nodepool-nodes bucket, keyed by id. The field names
// are the public contract (see the README).
type Node struct {
	ID             string            `json:"id"`
	State          NodeState         `json:"state"`
	Labels         []string          `json:"labels"`
	Provider       string            `json:"provider"`
	Pool           string            `json:"pool"`
	Cloud          string            `json:"cloud"`
	Region         string            `json:"region"`
	AZ             string            `json:"az"`
	ExternalID     string            `json:"external_id"`
	Hostname       string            `json:"hostname"`
	InterfaceIP    string            `json:"interface_ip"`
	PublicIPv4     string            `json:"public_ipv4"`
	PrivateIPv4    string            `json:"private_ipv4"`
	PublicIPv6     string            `json:"public_ipv6"`
	ConnectionType string            `json:"connection_type"`
	ConnectionPort int               `json:"connection_port"`
	Username       string            `json:"username"`
	PythonPath     string            `json:"python_path"`
	ShellType      string            `json:"shell_type"`
	HostKeys       []string          `json:"host_keys"`
	ImageID        string            `json:"image_id"`
	AllocatedTo    string            `json:"allocated_to"`
	Holder         string            `json:"holder"`
	LeaseUntil     *time.Time        `json:"lease_until"`
	Launcher       string            `json:"launcher"`
	HoldJob        string            `json:"hold_job"`
	HoldExpiration *time.Time        `json:"hold_expiration"`
	Comment        string            `json:"comment"`
	Resources      Resources         `json:"resources"`
	Attributes     map[string]string `json:"attributes"`
	DriverData     json.RawMessage   `json:"driver_data"`
	UserData       json.RawMessage   `json:"user_data"`
	Tenant         string            `json:"tenant"`
	Requestor      string            `json:"requestor"`
	Created        time.Time         `json:"created"`
	StateTime      time.Time         `json:"state_time"`

	// Reason says why a node failed (extension of Nodepool's record).
	Reason string `json:"reason,omitempty"`
	// InstanceDown, on a node in use or held, says that the cleanup found
	// its instance gone or not running, and how ("instance gone from the
	// cloud", "instance is SHUTOFF"); it is cleared if the instance runs
	// again (extension). A ready node whose instance is so is failed
	// instead, with that as its reason.
	InstanceDown string `json:"instance_down,omitempty"`
	// Attempt counts launch attempts so far (extension).
	Attempt int `json:"attempt,omitempty"`
	// Owner is the identity of the requestor that took the node (the
	// owner of its request); only it may give it back, hold it or renew
	// its lease through the requestor's endpoints (extension).
	Owner string `json:"owner,omitempty"`
	// ZooKeeperID is the id of the node's znode under /nodepool/nodes
	// while the node is handed to Zuul through ZooKeeper (extension,
	// written by the zookeeper role).
	ZooKeeperID string `json:"zookeeper_id,omitempty"`
	// Kubernetes is how a node of the kubernetes driver is reached: its
	// namespace, the API server and a service account's credentials there
	// (extension: Nodepool keeps this in connection_port, which is a port
	// number here; the zookeeper role writes it there for Zuul).
	Kubernetes *KubernetesAccess `json:"kubernetes,omitempty"`
}

// KubernetesAccess is a kubernetes node's namespace and the credentials of
// its service account, with the keys of Nodepool's: what a kubeconfig for
// the node needs (Zuul writes one from it).
type KubernetesAccess struct {
	// Name and Namespace are the node's namespace.
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Host is the API server's URL, as the launcher reaches it.
	Host string `json:"host"`
	// SkipTLS: the launcher does not verify the API server's certificate,
	// and neither should a consumer (CACert is then empty).
	SkipTLS bool `json:"skiptls"`
	// Token is the service account's bearer token, User its name.
	Token string `json:"token"`
	User  string `json:"user"`
	// CACert is the cluster's CA certificate, PEM in base64, as a
	// kubeconfig's certificate-authority-data takes it.
	CACert string `json:"ca_crt,omitempty"`
	// Pod is the pod of a pod label, in Namespace ("" for a namespace
	// label).
	Pod string `json:"pod,omitempty"`
}

// Clone returns a deep copy.
func (n *Node) Clone() Node {
	c := *n
	c.Labels = slices.Clone(n.Labels)
	c.HostKeys = slices.Clone(n.HostKeys)
	c.Attributes = maps.Clone(n.Attributes)
	c.DriverData = slices.Clone(n.DriverData)
	c.UserData = slices.Clone(n.UserData)
	c.Resources = n.Resources.Clone()
	if n.Kubernetes != nil {
		k := *n.Kubernetes
		c.Kubernetes = &k
	}
	if n.LeaseUntil != nil {
		t := *n.LeaseUntil
		c.LeaseUntil = &t
	}
	if n.HoldExpiration != nil {
		t := *n.HoldExpiration
		c.HoldExpiration = &t
	}
	return c
}

// HasLabel reports whether the node carries a label.
func (n *Node) HasLabel(label string) bool { return slices.Contains(n.Labels, label) }

// SetState changes the state and its timestamp.
func (n *Node) SetState(s NodeState, now time.Time) {
	if n.State != s {
		n.State = s
		n.StateTime = now
	}
}

// RequestState is the state of a node request.
type RequestState string

// Request states.
const (
	RequestRequested RequestState = "requested"
	RequestPending   RequestState = "pending"
	RequestFulfilled RequestState = "fulfilled"
	RequestFailed    RequestState = "failed"
)

// Request is a record of the nodepool-requests bucket, keyed by id.
type Request struct {
	ID               string          `json:"id"`
	State            RequestState    `json:"state"`
	Labels           []string        `json:"labels"`
	Nodes            []string        `json:"nodes"`
	DeclinedBy       []string        `json:"declined_by"`
	Provider         string          `json:"provider"`
	Pool             string          `json:"pool"`
	Requestor        string          `json:"requestor"`
	Priority         int             `json:"priority"`
	RelativePriority int             `json:"relative_priority"`
	Reuse            bool            `json:"reuse"`
	Tenant           string          `json:"tenant"`
	EventID          string          `json:"event_id"`
	RequestorData    json.RawMessage `json:"requestor_data"`
	Reason           string          `json:"reason"`
	Created          time.Time       `json:"created"`
	StateTime        time.Time       `json:"state_time"`
	// LeaseUntil, when set, is renewed by the requestor; a request whose
	// lease ran out is treated as deleted and its nodes are freed.
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	// Owner is the identity of the requestor that published the request
	// (from the subject it was published on, which nats.conf ties to a
	// user); only it may take its nodes, delete it or renew its lease
	// through the requestor's endpoints (extension).
	Owner string `json:"owner,omitempty"`
}

// SetState changes the state and its timestamp.
func (r *Request) SetState(s RequestState, now time.Time) {
	if r.State != s {
		r.State = s
		r.StateTime = now
	}
}

// Clone returns a deep copy.
func (r *Request) Clone() Request {
	c := *r
	c.Labels = slices.Clone(r.Labels)
	c.Nodes = slices.Clone(r.Nodes)
	c.DeclinedBy = slices.Clone(r.DeclinedBy)
	c.RequestorData = slices.Clone(r.RequestorData)
	if r.LeaseUntil != nil {
		t := *r.LeaseUntil
		c.LeaseUntil = &t
	}
	return c
}

// Done reports whether the request reached a final state.
func (r *Request) Done() bool { return r.State == RequestFulfilled || r.State == RequestFailed }

// PoolRef names a provider pool as "provider/pool".
func PoolRef(provider, pool string) string { return provider + "/" + pool }

// ComponentPool is a pool a launcher serves, as it announces it.
type ComponentPool struct {
	Provider string   `json:"provider"`
	Pool     string   `json:"pool"`
	Priority int      `json:"priority"`
	Labels   []string `json:"labels"`
	// Paused: the pool waits for quota (its leader found a request that
	// does not fit); pools of lower priority take what it cannot.
	Paused bool `json:"paused"`
	// CloudQuota is the provider's quota as the cloud last told the
	// pool's leader (extension; absent where the leader has not read it,
	// or the pool ignores the provider's quota).
	CloudQuota *CloudQuota `json:"cloud_quota,omitempty"`
}

// CloudQuota is a provider's quota as its cloud reports it: the limits
// (instances, cores, ram and the cloud's other resources; a resource
// without a limit is absent) and what instances that are not this
// provider's hold of them.
type CloudQuota struct {
	Limits map[string]int `json:"limits"`
	Others map[string]int `json:"others,omitempty"`
	Read   time.Time      `json:"read"`
}

// Component is a record of the nodepool-components bucket: a live launcher or
// builder. It disappears when its heartbeat stops.
type Component struct {
	ID        string          `json:"id"`
	Roles     []string        `json:"roles"`
	Hostname  string          `json:"hostname"`
	PID       int             `json:"pid"`
	Version   string          `json:"version"`
	Started   time.Time       `json:"started"`
	Heartbeat time.Time       `json:"heartbeat"`
	Pools     []ComponentPool `json:"pools"`
	// Providers are the providers in the process's configuration, pools
	// or not (extension): a provider that no live launcher names is
	// drained (and its uploads too once no live builder names it). A
	// record without the key (an older process) names the providers of
	// its pools.
	Providers []string `json:"providers,omitempty"`
}

// Serves reports whether the component serves a pool.
func (c *Component) Serves(provider, pool string) bool {
	for _, p := range c.Pools {
		if p.Provider == provider && p.Pool == pool {
			return true
		}
	}
	return false
}

// LeaseRecord is a record of the nodepool-locks bucket.
type LeaseRecord struct {
	Holder   string    `json:"holder"`
	Acquired time.Time `json:"acquired"`
	Renewed  time.Time `json:"renewed"`
}
