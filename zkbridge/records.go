package zkbridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// The records Zuul and Nodepool keep in ZooKeeper are JSON objects written
// with Python's json.dumps. Whoever writes one back writes every key it
// read, so that the other side's keys survive (Zuul keeps requestor_data,
// user_data and keys this bridge does not know). A record is therefore
// held as its raw keys, with the ones the bridge reads decoded beside.

// Paths of the shared tree (under the chroot).
const (
	RequestsPath     = "/nodepool/requests"
	RequestLocksPath = "/nodepool/requests-lock"
	NodesPath        = "/nodepool/nodes"
	PoolsPath        = "/nodepool/components/pool"
)

// MaxRecord bounds the size of a record read from ZooKeeper (its own limit
// is 1 MiB by default).
const MaxRecord = 1 << 20

// requestIDRE is a request's id: Zuul's priority prefix of three digits,
// a dash and the ZooKeeper sequence.
var requestIDRE = regexp.MustCompile(`^(\d{3})-(\d{10})$`)

// nodeIDRE is a node's id: the bare ZooKeeper sequence.
var nodeIDRE = regexp.MustCompile(`^\d{10}$`)

// ValidRequestID reports whether a child of /nodepool/requests is named
// as Zuul and Nodepool name requests.
func ValidRequestID(id string) bool { return requestIDRE.MatchString(id) }

// NATSRequestID is the id of the NATS request a ZooKeeper request is
// served by. It holds a "=", which a request message's id cannot: no
// requestor can take it first.
func NATSRequestID(zkID string) string { return natsPrefix + zkID }

const natsPrefix = "zk="

// ZKRequestID is the ZooKeeper id of a NATS request made by the bridge,
// and whether it is one.
func ZKRequestID(natsID string) (string, bool) {
	id, ok := strings.CutPrefix(natsID, natsPrefix)
	return id, ok && ValidRequestID(id)
}

// Request is a node request as Zuul writes it (NodeRequest in Zuul's and
// Nodepool's models).
type Request struct {
	raw map[string]json.RawMessage

	State            string
	StateTime        float64
	DeclinedBy       []string
	NodeTypes        []string
	Nodes            []string
	Reuse            bool
	Requestor        string
	Provider         string
	RelativePriority int
	EventID          string
	TenantName       string
	CreatedTime      float64
	RequestorData    json.RawMessage
}

// ParseRequest decodes a request znode. Anything the bridge cannot use
// safely is an error that says what is wrong, and the request is left
// alone.
func ParseRequest(data []byte) (*Request, error) {
	raw, err := object(data)
	if err != nil {
		return nil, err
	}
	r := &Request{raw: raw, Reuse: true}
	var problems []string
	field := func(key string, into any, required bool) {
		v, ok := raw[key]
		if !ok || isNull(v) {
			if required {
				problems = append(problems, key+": missing")
			}
			return
		}
		if err := json.Unmarshal(v, into); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", key, jsonTypeError(err)))
		}
	}
	field("state", &r.State, true)
	field("state_time", &r.StateTime, false)
	field("declined_by", &r.DeclinedBy, false)
	field("node_types", &r.NodeTypes, true)
	field("nodes", &r.Nodes, false)
	field("reuse", &r.Reuse, false)
	field("requestor", &r.Requestor, false)
	field("provider", &r.Provider, false)
	field("relative_priority", &r.RelativePriority, false)
	field("event_id", &r.EventID, false)
	field("tenant_name", &r.TenantName, false)
	field("created_time", &r.CreatedTime, false)
	if v, ok := raw["requestor_data"]; ok && !isNull(v) {
		r.RequestorData = v
	}
	switch r.State {
	case "requested", "pending", "fulfilled", "failed", "":
	default:
		problems = append(problems, fmt.Sprintf("state: %q is not a request state (requested, pending, fulfilled, failed)", r.State))
	}
	if len(r.NodeTypes) > maxLabels {
		problems = append(problems, fmt.Sprintf("node_types: %d labels; at most %d", len(r.NodeTypes), maxLabels))
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return r, nil
}

// maxLabels bounds the nodes of one request (as a NATS request's).
const maxLabels = 256

// Encode writes the request back with every key it was read with, the
// bridge's changes, and every key Zuul's parser requires (as Nodepool's
// toDict writes them all).
func (r *Request) Encode() []byte {
	out := make(map[string]any, len(r.raw)+4)
	for k, v := range r.raw {
		out[k] = v
	}
	out["state"] = r.State
	out["state_time"] = r.StateTime
	out["declined_by"] = nonNil(r.DeclinedBy)
	out["nodes"] = nonNil(r.Nodes)
	for key, def := range map[string]any{
		"node_types": nonNil(r.NodeTypes), "reuse": r.Reuse, "requestor": nil, "requestor_data": nil,
		"provider": nil, "relative_priority": 0, "event_id": nil, "created_time": nil, "tenant_name": nil,
	} {
		if _, ok := out[key]; !ok {
			out[key] = def
		}
	}
	return encode(out)
}

// Node is a node as Zuul and Nodepool keep it in ZooKeeper.
type Node struct {
	raw map[string]json.RawMessage

	State          string
	StateTime      float64
	Provider       string
	AllocatedTo    string
	HoldJob        string
	Comment        string
	HoldExpiration *float64
	UserData       json.RawMessage
	// NATSID is the id of the node's NATS record, as the bridge wrote it
	// (Zuul's writes may leave it out).
	NATSID string
}

// ParseNode decodes a node znode.
func ParseNode(data []byte) (*Node, error) {
	raw, err := object(data)
	if err != nil {
		return nil, err
	}
	n := &Node{raw: raw}
	var problems []string
	field := func(key string, into any) {
		v, ok := raw[key]
		if !ok || isNull(v) {
			return
		}
		if err := json.Unmarshal(v, into); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", key, jsonTypeError(err)))
		}
	}
	field("state", &n.State)
	field("state_time", &n.StateTime)
	field("provider", &n.Provider)
	field("allocated_to", &n.AllocatedTo)
	field("hold_job", &n.HoldJob)
	field("comment", &n.Comment)
	field("nats_id", &n.NATSID)
	if v, ok := raw["hold_expiration"]; ok && !isNull(v) {
		var f float64
		if err := json.Unmarshal(v, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			problems = append(problems, "hold_expiration: expected a number of seconds")
		} else {
			n.HoldExpiration = &f
		}
	}
	if v, ok := raw["user_data"]; ok && !isNull(v) {
		n.UserData = v
	}
	if n.State == "" {
		problems = append(problems, "state: missing")
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return n, nil
}

// Encode writes the node back with every key it was read with and the
// bridge's changes (state).
func (n *Node) Encode() []byte {
	out := make(map[string]any, len(n.raw))
	for k, v := range n.raw {
		out[k] = v
	}
	out["state"] = n.State
	out["state_time"] = n.StateTime
	return encode(out)
}

// NodeRecord is the znode of a NATS node handed to a ZooKeeper request:
// every key Nodepool writes (Zuul reads them for its inventory), the node
// ready and allocated to the request, and nats_id naming its record.
//
// A kubernetes node's connection_port is its namespace and credentials (its
// record's kubernetes), as Nodepool's kubernetes driver writes it and
// Zuul's executor reads it to write the job's kubeconfig.
func NodeRecord(n *kv.Node, zkRequest, launcher string, now time.Time) []byte {
	var port any = n.ConnectionPort
	switch {
	case n.Kubernetes != nil:
		port = n.Kubernetes
	case n.ConnectionPort == 0:
		port = 22
	}
	username := n.Username
	if username == "" {
		username = "zuul"
	}
	attrs := map[string]string{}
	for k, v := range n.Attributes {
		attrs[k] = v
	}
	rec := map[string]any{
		"state":           "ready",
		"state_time":      epoch(now),
		"created_time":    epoch(n.Created),
		"cloud":           n.Cloud,
		"provider":        n.Provider,
		"pool":            n.Pool,
		"az":              n.AZ,
		"region":          n.Region,
		"type":            nonNil(n.Labels),
		"allocated_to":    zkRequest,
		"public_ipv4":     nullIfEmpty(n.PublicIPv4),
		"private_ipv4":    nullIfEmpty(n.PrivateIPv4),
		"public_ipv6":     nullIfEmpty(n.PublicIPv6),
		"host_id":         nil,
		"interface_ip":    nullIfEmpty(n.InterfaceIP),
		"connection_port": port,
		"ssh_port":        port,
		"connection_type": nullIfEmpty(n.ConnectionType),
		"image_id":        nullIfEmpty(n.ImageID),
		"launcher":        launcher,
		"external_id":     nullIfEmpty(n.ExternalID),
		"hostname":        nullIfEmpty(n.Hostname),
		"comment":         nil,
		"user_data":       nil,
		"hold_job":        nil,
		"hold_expiration": nil,
		"host_keys":       nonNil(n.HostKeys),
		"username":        username,
		"python_path":     orDefault(n.PythonPath, "auto"),
		"shell_type":      nullIfEmpty(n.ShellType),
		"resources":       n.Resources,
		"slot":            slot(n),
		"attributes":      attrs,
		"tenant_name":     nullIfEmpty(n.Tenant),
		"driver_data":     nil,
		"requestor":       nullIfEmpty(n.Requestor),
		"nats_id":         n.ID,
	}
	return encode(rec)
}

// slot is the slot of a metastatic node on its backing node (Zuul puts
// it in the inventory as nodepool.slot), nil for other nodes.
func slot(n *kv.Node) any {
	var d struct {
		BackingNode string `json:"backing_node"`
		Slot        *int   `json:"slot"`
	}
	if len(n.DriverData) == 0 || json.Unmarshal(n.DriverData, &d) != nil || d.BackingNode == "" || d.Slot == nil || *d.Slot < 0 {
		return nil
	}
	return *d.Slot
}

// epoch is a time as Python's time.time(): float seconds.
func epoch(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// fromEpoch is the time of float seconds.
func fromEpoch(f float64) time.Time {
	if f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) || f > 1e11 {
		return time.Time{}
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// PoolComponent is a pool's registration under /nodepool/components/pool,
// as a Nodepool launcher's PoolWorker writes it.
type PoolComponent struct {
	Hostname        string   `json:"hostname"`
	Kind            string   `json:"kind"`
	State           string   `json:"state"`
	Version         string   `json:"version"`
	ModelAPI        int      `json:"model_api"`
	ID              string   `json:"id"`
	Name            string   `json:"name"`
	ProviderName    string   `json:"provider_name"`
	SupportedLabels []string `json:"supported_labels"`
	Priority        int      `json:"priority"`
	Paused          bool     `json:"paused"`
}

// ParsePoolComponent reads a registered pool (another launcher's too).
func ParsePoolComponent(data []byte) (*PoolComponent, error) {
	if len(data) > MaxRecord {
		return nil, fmt.Errorf("%d bytes; at most %d", len(data), MaxRecord)
	}
	var pc PoolComponent
	if err := json.Unmarshal(data, &pc); err != nil {
		return nil, fmt.Errorf("not a pool component: %s", jsonTypeError(err))
	}
	if pc.ID == "" {
		return nil, errors.New("not a pool component: no id")
	}
	return &pc, nil
}

// Encode writes a component as Nodepool does (sorted keys).
func (pc *PoolComponent) Encode() []byte {
	b, _ := json.Marshal(pc)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	return encode(m) // encoding/json sorts map keys
}

// object decodes a JSON object, bounded in size and depth.
func object(data []byte) (map[string]json.RawMessage, error) {
	if len(data) > MaxRecord {
		return nil, fmt.Errorf("%d bytes; at most %d", len(data), MaxRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %s", jsonTypeError(err))
	}
	if raw == nil {
		return nil, errors.New("not a JSON object: null")
	}
	return raw, nil
}

func jsonTypeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("expected %s, got a JSON %s", te.Type, te.Value)
	}
	return err.Error()
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// encode writes JSON as Python's json.dumps does by default (", " and
// ": " separators are not needed by any reader; compact is fine), without
// HTML escaping.
func encode(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Every value here is a string, number, list or raw JSON read
		// from ZooKeeper (valid); nothing else can fail.
		panic(fmt.Sprintf("encoding a ZooKeeper record: %v", err))
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// priority is a request id's priority prefix as a number.
func priority(zkID string) int {
	m := requestIDRE.FindStringSubmatch(zkID)
	if m == nil {
		return 0
	}
	p, _ := strconv.Atoi(m[1])
	return p
}
