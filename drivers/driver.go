// Package drivers defines what a provider driver does (create and delete
// instances through resumable state machines, list instances, report quota)
// and the kinds of failure a driver reports. Each driver lives in a package
// of its own and is constructed explicitly from the configuration.
package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nodepool-nats/nodepool/record"
)

// Failure kinds. Drivers wrap them (fmt.Errorf("%w: ...", ErrQuotaExceeded))
// so the launcher decides between waiting, retrying and failing with
// errors.Is, without matching strings.
var (
	// ErrQuotaExceeded: the cloud refused for lack of quota. Not a failed
	// launch attempt: the launch waits for capacity.
	ErrQuotaExceeded = errors.New("quota exceeded")
	// ErrCapacity: the cloud has no room for this size right now.
	ErrCapacity = errors.New("insufficient capacity")
	// ErrNotFound: the instance or image does not exist.
	ErrNotFound = errors.New("not found")
	// ErrRateLimited: the cloud asks to slow down; retry later.
	ErrRateLimited = errors.New("rate limited")
	// ErrFatal: the launch cannot succeed by trying again (the backing
	// node a metastatic node waits for failed, say); the node fails at
	// once, whatever launch-retries allows.
	ErrFatal = errors.New("launch cannot succeed")
	// ErrUncertain: a call failed on its way (a timeout, the connection
	// lost) and may or may not have taken effect. Only a step that is
	// safe to make again returns it (a create carrying its attempt's
	// idempotency token): the launcher makes the step again, for as long
	// as the attempt's boot-timeout allows, instead of counting a failed
	// attempt, whose next attempt would leave the instance this one may
	// have made without a node for the whole launch.
	ErrUncertain = errors.New("outcome of the cloud call unknown")
)

// Tags that every driver puts on the instances it creates, so that leaked
// instances can be found and matched to node records.
const (
	TagProvider = "nodepool_provider_name"
	TagPool     = "nodepool_pool_name"
	TagNode     = "nodepool_node_id"
	TagLabel    = "nodepool_label"
)

// Resources is what an instance counts against quota.
type Resources = record.Resources

// Names of resources besides cores, RAM and instances (record.Resources'
// Other) that drivers count, as Nodepool names them: the volumes of nodes
// booted from volumes (OpenStack) and their total size in GB.
const (
	ResourceVolumes  = "volumes"
	ResourceVolumeGB = "volume-gb"
)

// Unlimited is a quota limit that is never reached.
const Unlimited = int(^uint(0) >> 2)

// Instance is a machine as a driver sees it.
//
// Username, ConnectionType, ConnectionPort, PythonPath and ShellType are
// how a consumer reaches and uses the machine, when the driver knows it
// (the cloud image's settings, a static host's, a backing node's); the
// launcher copies each one that is set into the node record over what the
// label's diskimage (or the defaults) gave, as Nodepool layers them.
// Attributes are the node's defaults of `attributes` (a backing node's);
// the pool's node-attributes override them key by key.
type Instance struct {
	ExternalID     string
	Name           string
	Tags           map[string]string
	Region         string
	AZ             string
	InterfaceIP    string
	PublicIPv4     string
	PrivateIPv4    string
	PublicIPv6     string
	Username       string
	ConnectionType string
	ConnectionPort int
	PythonPath     string
	ShellType      string
	HostKeys       []string
	Attributes     map[string]string
	ImageID        string
	Resources      Resources
	// Run is whether the instance runs, as the listing (or the create
	// machine's last look) shows it, and Status is the cloud's own word
	// for its state (ACTIVE, SHUTOFF, running, stopped), which reasons
	// and logs quote.
	Run    RunState
	Status string
	// Cloud, when set, is what the node records as its cloud instead of
	// the provider's `cloud` (a kubernetes provider's context).
	Cloud string
	// Kubernetes is a kubernetes node's namespace and credentials, which
	// the node record carries.
	Kubernetes *record.KubernetesAccess
}

// RunState is whether an instance runs, as a listing shows it.
type RunState uint8

const (
	// RunUnknown: the driver does not say (a status it does not know);
	// nothing is judged by it.
	RunUnknown RunState = iota
	// Running: the instance runs (OpenStack ACTIVE, EC2 running).
	Running
	// Changing: the instance is on its way to running, or back to it
	// (booting, rebooting, resizing, migrating, starting); nothing is
	// judged by it.
	Changing
	// Down: the instance does not run and will not by itself: shut off,
	// stopped, in error, paused, suspended, shelved, being deleted or
	// terminated.
	Down
)

// String is the state's name, for logs.
func (s RunState) String() string {
	switch s {
	case Running:
		return "running"
	case Changing:
		return "changing"
	case Down:
		return "down"
	}
	return "unknown"
}

// NodeID is the node id tagged on the instance, if it is one of ours.
func (i *Instance) NodeID() string { return i.Tags[TagNode] }

// CreateRequest is what the launcher asks a driver to create.
type CreateRequest struct {
	NodeID   string
	Hostname string
	Provider string
	Pool     string
	Label    string
	// Attempt counts from 1; a driver makes each attempt's instance distinct
	// (an idempotency token, a name) so that a resumed attempt never creates
	// a second instance.
	Attempt int
	Tags    map[string]string
	// ImageID is the provider's id of the uploaded diskimage to boot from,
	// for labels with a diskimage ("" otherwise).
	ImageID string
	// AZ is the availability zone the node record asks for ("": the
	// driver chooses).
	AZ string
	// Request is the request the node was launched for, when it is known.
	Request *RequestInfo
}

// RequestInfo is what a driver may know of the request a node is launched
// for (OpenStack's dynamic-instance-properties use it).
type RequestInfo struct {
	ID               string
	Labels           []string
	Requestor        string
	RequestorData    map[string]string
	RelativePriority int
	EventID          string
	Created          time.Time
	Tenant           string
}

// Step is the outcome of one Advance of a state machine.
type Step struct {
	// Done: the machine finished; for a create machine Instance is set.
	Done bool
	// Wait: how long to wait before the next Advance (a hint).
	Wait time.Duration
	// Instance is the created instance once Done.
	Instance *Instance
}

// StateMachine creates or deletes one instance, one step per Advance. Its
// progress (State) is stored in the node record after every step, so another
// process can resume it: Provider.Create and Provider.Delete take that
// state back and return a machine that carries on from it.
type StateMachine interface {
	Advance(ctx context.Context) (Step, error)
	// State is the machine's progress, to store in the node's driver_data.
	State() json.RawMessage
	// ExternalID is the instance's id once known ("" before).
	ExternalID() string
}

// Idempotent is implemented by providers whose create machines may be
// started afresh at any point of an attempt without making a second
// instance (each attempt's create call carries an idempotency token made
// from CreateRequest's node id and attempt). The launcher then records a
// launch's progress only when the attempt ends, saving a write per step.
type Idempotent interface {
	IdempotentCreate()
}

// Provider is one configured provider of a driver.
type Provider interface {
	// Create returns a machine that creates an instance for req; state is
	// what State() returned before (nil to start afresh).
	Create(req CreateRequest, state json.RawMessage) (StateMachine, error)
	// Delete returns a machine that deletes an instance; state as above.
	Delete(externalID string, state json.RawMessage) (StateMachine, error)
	// ListInstances lists every instance the provider sees, ours (tagged)
	// and others, for leak detection and quota.
	ListInstances(ctx context.Context) ([]Instance, error)
	// QuotaLimits is the provider's total quota (Unlimited where none).
	QuotaLimits(ctx context.Context) (Resources, error)
	// QuotaForLabel is what one node of a label costs in a pool.
	QuotaForLabel(pool, label string) (Resources, error)
	// Close releases what the provider holds.
	Close()
}

// Diagnoser is implemented by drivers that can say more about a launch
// attempt that failed (the console log of an instance that did not come
// up); the launcher adds what Diagnose returns to the node's reason before
// the instance is deleted. It returns "" when it has nothing to add.
type Diagnoser interface {
	Diagnose(ctx context.Context, req CreateRequest, externalID string) string
}

// Sweeper is implemented by drivers whose instances leave other things
// behind in the cloud (floating IPs, ports, volumes). The cleanup leader
// calls Sweep every sweep; known reports whether a node record exists, so
// that what is tagged with a node that has none can be deleted.
type Sweeper interface {
	Sweep(ctx context.Context, known func(nodeID string) bool) error
}

// RetryAfter is how long a failure asks to wait before trying again (a
// rate-limited cloud's Retry-After), or 0 if it does not say.
func RetryAfter(err error) time.Duration {
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		return ra.RetryAfter()
	}
	return 0
}

// Liveness is implemented by providers whose ListInstances lists the
// instance of every node of theirs, with its run state (Instance.Run):
// a node's instance that a listing lacks is gone, one it shows Down is
// dead. The cleanup leader judges every listing it makes so: a ready node
// whose instance is gone or dead is failed (and so replaced; a request it
// was allocated to and that is still pending gets another node), and a
// node in use or held gets what was seen in its instance_down, for its
// holder. Providers whose nodes are not instances they list (static
// hosts) do not implement it.
type Liveness interface {
	// ListingAge bounds how long before a ListInstances call the listing
	// it answers from may have started (0: it starts during the call, or
	// reflects every change made before it): a node ready since later is
	// not judged by that listing.
	ListingAge() time.Duration
}

// Interrupter is implemented by drivers whose cloud takes instances back
// (AWS spot instances: an interruption notice, the interruption itself, a
// rebalance recommendation). The cleanup leader calls Interruptions every
// sweep and acts on each one whose node records the instance: a ready
// node nobody took yet is deleted (and replaced, for a request that is
// still pending), a node in use or held gets the reason in its `reason`,
// where its holder can watch for it.
type Interrupter interface {
	Interruptions(ctx context.Context) ([]Interruption, error)
}

// Interruption is an instance the cloud is taking back, or took.
type Interruption struct {
	ExternalID string
	NodeID     string
	// Reason says what happened, for the node's reason.
	Reason string
}

// Registrar is implemented by drivers whose nodes are existing machines that
// the driver registers itself (static) instead of launching one per request.
// The scheduler never creates nodes in their pools: a request waits for a
// registered node to be free. A used node is not deleted: the node
// lifecycle calls Reregister, inside a revision-checked update of the
// record, to put it back in line for service.
type Registrar interface {
	// Reregister turns a used node back into a registered one (for the
	// static driver: state init, allocation cleared, host key to check).
	Reregister(n *record.Node, now time.Time)
}

// Manager is implemented by drivers that keep records of their own in step
// (static: the configured hosts' node records; metastatic: backing nodes).
// The launcher runs Manage in one process at a time, the holder of the
// lease "provider.<name>"; ctx ends when the lease may be lost or the
// process stops. interval is the period of the reconciling sweeps.
// Everything Manage decides is written to records with revision-checked
// updates, so a new holder carries on from them.
type Manager interface {
	Manage(ctx context.Context, interval time.Duration)
}

// Drainer is implemented by drivers that hold records of their own
// (metastatic: backing requests and nodes). While a provider removed from
// the configuration is drained, the cleanup leader calls Drain every
// sweep: the driver lets go of what it holds as soon as nothing of the
// provider needs it, and returns how many records it still holds; the
// provider is drained once that is zero (and nothing else of it is left).
type Drainer interface {
	Drain(ctx context.Context) (held int, err error)
}

// Owner is implemented by drivers that can tell whether an instance is
// the one they made for a node, by the tags every create puts on it
// (TagNode and TagProvider). A node record is written by requestors too,
// so before it deletes the instance a node's external_id names, the
// launcher asks: an instance made for another node, or for no node of
// this provider, is left alone. Owns returns an error that is ErrNotFound
// when the instance does not exist.
type Owner interface {
	Owns(ctx context.Context, externalID, nodeID string) (bool, error)
}

// OwnedBy reports whether an instance's tags say it was made for the
// node by the provider.
func OwnedBy(tags map[string]string, provider, nodeID string) bool {
	return tags[TagNode] == nodeID && tags[TagProvider] == provider
}
