package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/token"
)

// The work stream (docs/work-queue.md): the launch or the delete a node
// needs is a message here, taken by one launcher that has the node's
// provider: a launch when it has a free launch slot, so that launches
// beyond max-concurrency wait in the stream, delivered to nobody. The
// stream keeps at most one message per node and kind: work asked for
// again while its message waits is refused, not queued twice.
const (
	WorkStream  = "NODEPOOL_WORK"
	WorkSubject = "nodepool.work.>"

	// HeaderNode and HeaderRevision name the node a work message is for
	// and the revision of its record that asked for the work.
	HeaderNode     = "Nodepool-Node"
	HeaderRevision = "Nodepool-Revision"
)

// Kinds of work.
const (
	KindLaunch = "launch"
	KindDelete = "delete"
)

// WorkSubjects are the subjects of a kind of work of a provider's nodes
// (of every provider's when provider is "").
func WorkSubjects(kind, provider string) string {
	p := "*"
	if provider != "" {
		p = token.Encode(provider)
	}
	return "nodepool.work." + p + "." + kind + ".*"
}

// WorkSubjectOf is the subject of a kind of work of a node:
// nodepool.work.<provider>.<kind>.<node>.
func WorkSubjectOf(kind, provider, node string) string {
	return "nodepool.work." + token.Encode(provider) + "." + kind + "." + token.Encode(node)
}

// LaunchConsumer names the durable consumer of a provider's launches,
// shared by every launcher that has the provider.
func LaunchConsumer(provider string) string { return "launch-" + token.Encode(provider) }

// DeleteConsumer names the durable consumer of every provider's deletes,
// shared by every launcher.
const DeleteConsumer = "deletes"

func workStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 WorkStream,
		Description:          "launches and deletes of nodes, each waiting for a launcher",
		Subjects:             []string{WorkSubject},
		Retention:            jetstream.WorkQueuePolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    1,
		Duplicates:           DuplicateWindow,
		Storage:              jetstream.FileStorage,
		Replicas:             replicas,
	}
}

// Work is the work of a node asked for: its kind, the node and the
// revision of its record that asked for it.
type Work struct {
	Kind     string
	Node     string
	Revision uint64
}

// WorkMsg is the message asking for a kind of work of a node at a
// revision of its record. Its Nats-Msg-Id is the node, kind and revision,
// so that launchers asking for the same work make one message.
func WorkMsg(kind, provider, node string, rev uint64) *nats.Msg {
	m := nats.NewMsg(WorkSubjectOf(kind, provider, node))
	r := strconv.FormatUint(rev, 10)
	m.Header.Set(jetstream.MsgIDHeader, node+"."+kind+"."+r)
	m.Header.Set(HeaderNode, node)
	m.Header.Set(HeaderRevision, r)
	return m
}

// ParseWork reads a work message's kind, node and revision, checking that
// its subject is that node's.
func ParseWork(subject string, h nats.Header) (Work, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 5 || parts[0] != "nodepool" || parts[1] != "work" || (parts[3] != KindLaunch && parts[3] != KindDelete) {
		return Work{}, fmt.Errorf("work message on %s: expected nodepool.work.<provider>.%s|%s.<node>", subject, KindLaunch, KindDelete)
	}
	node := h.Get(HeaderNode)
	if node == "" {
		return Work{}, fmt.Errorf("work message on %s: no %s header; expected the node's id", subject, HeaderNode)
	}
	if !validNode(node) {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q; expected a node id (1 to 255 of A-Z a-z 0-9 - _ = / and inner dots)", subject, HeaderNode, node)
	}
	if parts[4] != token.Encode(node) {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q, which is not the node of the subject", subject, HeaderNode, node)
	}
	rev, err := strconv.ParseUint(h.Get(HeaderRevision), 10, 64)
	if err != nil || rev == 0 {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q; expected the record's revision, a positive integer", subject, HeaderRevision, h.Get(HeaderRevision))
	}
	return Work{Kind: parts[3], Node: node, Revision: rev}, nil
}

// validNode tells whether a node id is a key of the nodes bucket.
func validNode(id string) bool {
	if id == "" || len(id) > 255 || id[0] == '.' || id[len(id)-1] == '.' || strings.Contains(id, "..") {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_=/.", c)) {
			return false
		}
	}
	return true
}

// errCodeDuplicateInProcess is nats-server's JSStreamDuplicateMessageConflict:
// a message with the same Nats-Msg-Id is being stored.
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158

// Queued reports whether a publish was refused because a message of that
// node and kind waits in the stream already, or because another process
// is storing the same message (its Nats-Msg-Id) at this moment.
func Queued(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == errCodeDuplicateInProcess ||
		strings.Contains(apiErr.Description, "maximum messages per subject exceeded") ||
		strings.Contains(apiErr.Description, "duplicate message id is in process")
}

// QueuedWork returns the work waiting in the work stream, by kind and
// node.
func QueuedWork(ctx context.Context, js jetstream.JetStream) (map[Work]bool, error) {
	st, err := js.Stream(ctx, WorkStream)
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", WorkStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(WorkSubject))
	if err != nil {
		return nil, fmt.Errorf("listing the work queued in stream %s: %w", WorkStream, err)
	}
	queued := make(map[Work]bool, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if parts := strings.Split(subj, "."); len(parts) == 5 {
			queued[Work{Kind: parts[3], Node: token.Decode(parts[4])}] = true
		}
	}
	return queued, nil
}
