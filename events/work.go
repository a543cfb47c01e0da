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

// The work stream (docs/work-queue.md): a launch a pool's node needs is a
// message here, taken by one launcher of the node's provider when it has
// a free launch slot, so that launches beyond max-concurrency wait in the
// stream, delivered to nobody. The stream keeps at most one message per
// node and kind: a launch asked for again while one waits is refused, not
// queued twice.
const (
	WorkStream  = "NODEPOOL_WORK"
	WorkSubject = "nodepool.work.>"

	// HeaderNode and HeaderRevision name the node a work message is for
	// and the revision of its record that asked for the work.
	HeaderNode     = "Nodepool-Node"
	HeaderRevision = "Nodepool-Revision"
)

// LaunchSubjects are the launches of a provider's nodes.
func LaunchSubjects(provider string) string {
	return "nodepool.work." + token.Encode(provider) + ".launch.*"
}

// AllLaunchSubjects are the launches of every provider's nodes.
const AllLaunchSubjects = "nodepool.work.*.launch.*"

// LaunchSubject is the subject of a node's launch.
func LaunchSubject(provider, node string) string {
	return "nodepool.work." + token.Encode(provider) + ".launch." + token.Encode(node)
}

// LaunchConsumer names the durable consumer of a provider's launches,
// shared by every launcher that has the provider.
func LaunchConsumer(provider string) string { return "launch-" + token.Encode(provider) }

func workStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 WorkStream,
		Description:          "launches waiting for a launcher's free slot",
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

// Work is a launch asked for: the node and the revision of its record.
type Work struct {
	Node     string
	Revision uint64
}

// LaunchMsg is the message asking for a node's launch at a revision of its
// record. Its Nats-Msg-Id is the node and revision, so that launchers
// asking for the same launch make one message.
func LaunchMsg(provider, node string, rev uint64) *nats.Msg {
	m := nats.NewMsg(LaunchSubject(provider, node))
	r := strconv.FormatUint(rev, 10)
	m.Header.Set(jetstream.MsgIDHeader, node+".launch."+r)
	m.Header.Set(HeaderNode, node)
	m.Header.Set(HeaderRevision, r)
	return m
}

// ParseWork reads a work message's node and revision, checking that its
// subject is that node's.
func ParseWork(subject string, h nats.Header) (Work, error) {
	node := h.Get(HeaderNode)
	if node == "" {
		return Work{}, fmt.Errorf("work message on %s: no %s header; expected the node's id", subject, HeaderNode)
	}
	if !validNode(node) {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q; expected a node id (1 to 255 of A-Z a-z 0-9 - _ = / and inner dots)", subject, HeaderNode, node)
	}
	if !strings.HasSuffix(subject, "."+token.Encode(node)) {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q, which is not the node of the subject", subject, HeaderNode, node)
	}
	rev, err := strconv.ParseUint(h.Get(HeaderRevision), 10, 64)
	if err != nil || rev == 0 {
		return Work{}, fmt.Errorf("work message on %s: header %s is %q; expected the record's revision, a positive integer", subject, HeaderRevision, h.Get(HeaderRevision))
	}
	return Work{Node: node, Revision: rev}, nil
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

// Queued reports whether a publish was refused because a message of that
// node and kind waits in the stream already.
func Queued(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "maximum messages per subject exceeded")
}

// QueuedLaunches returns the nodes whose launch waits in the work stream,
// by their subjects' node tokens.
func QueuedLaunches(ctx context.Context, js jetstream.JetStream) (map[string]bool, error) {
	st, err := js.Stream(ctx, WorkStream)
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", WorkStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(AllLaunchSubjects))
	if err != nil {
		return nil, fmt.Errorf("listing the launches queued in stream %s: %w", WorkStream, err)
	}
	queued := make(map[string]bool, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		queued[token.Decode(subj[strings.LastIndexByte(subj, '.')+1:])] = true
	}
	return queued, nil
}
