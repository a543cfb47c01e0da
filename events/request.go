package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
)

// DefaultPriority is the priority of a request that names none.
const DefaultPriority = 100

// MaxLabels bounds the nodes one request may ask for.
const MaxLabels = 256

// RequestMessage is what a client publishes on nodepool.requests.new
// (public contract). Only labels is required.
type RequestMessage struct {
	ID               string          `json:"id,omitempty"`
	Labels           []string        `json:"labels"`
	Requestor        string          `json:"requestor,omitempty"`
	Priority         *int            `json:"priority,omitempty"`
	RelativePriority int             `json:"relative_priority,omitempty"`
	Reuse            *bool           `json:"reuse,omitempty"`
	Tenant           string          `json:"tenant,omitempty"`
	Provider         string          `json:"provider,omitempty"`
	EventID          string          `json:"event_id,omitempty"`
	RequestorData    json.RawMessage `json:"requestor_data,omitempty"`
	// LeaseUntil, when set, makes the requestor responsible for renewing
	// the request's lease_until (in its record) until it deleted the
	// request; a request whose lease ran out is deleted and its nodes are
	// freed. Without it, a request lives until its requestor deletes it.
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
}

// PriorityOrDefault returns the priority, or DefaultPriority if unset.
func (m *RequestMessage) PriorityOrDefault() int {
	if m.Priority == nil {
		return DefaultPriority
	}
	return *m.Priority
}

// ReuseOrDefault returns reuse, true if unset.
func (m *RequestMessage) ReuseOrDefault() bool { return m.Reuse == nil || *m.Reuse }

var (
	idRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	labelRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
)

// ValidID reports whether a client-chosen request id is acceptable: 1 to 64
// of A-Z a-z 0-9 _ . -, not starting or ending with a dot, no "..".
func ValidID(id string) bool {
	return idRE.MatchString(id) && !strings.HasPrefix(id, ".") && !strings.HasSuffix(id, ".") && !strings.Contains(id, "..")
}

// ReservedID reports whether an id is one the service gives to requests
// published without one (ten digits, their stream sequence): no client
// may choose it, so no client can take it first.
func ReservedID(id string) bool { return reservedRE.MatchString(id) }

var reservedRE = regexp.MustCompile(`^\d{10}$`)

// Anonymous is the owner of requests published on NewRequestSubject, and
// the identity of a client that has none of its own.
const Anonymous = "anonymous"

var ownerRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidOwner reports whether a requestor identity can be one token of a
// subject: 1 to 64 of A-Z a-z 0-9 _ -.
func ValidOwner(owner string) bool { return ownerRE.MatchString(owner) }

// RequestSubject is where a requestor with this identity publishes its
// requests.
func RequestSubject(owner string) string {
	if owner == "" || owner == Anonymous {
		return NewRequestSubject
	}
	return "nodepool.requests." + owner + ".new"
}

// OwnerOfRequestSubject is the owner of a request published on a subject,
// and whether the subject is one requests are published on.
func OwnerOfRequestSubject(subject string) (string, bool) {
	if subject == NewRequestSubject {
		return Anonymous, true
	}
	rest, ok := strings.CutPrefix(subject, "nodepool.requests.")
	if !ok {
		return "", false
	}
	owner, ok := strings.CutSuffix(rest, ".new")
	if !ok || !ValidOwner(owner) {
		return "", false
	}
	return owner, true
}

// RequestID is the id of a request published without one: its stream
// sequence, zero-padded to 10 digits.
func RequestID(seq uint64) string { return fmt.Sprintf("%010d", seq) }

// ParseRequest decodes and validates a request message. On error the message
// is returned as far as it could be read (its id, if valid, may be used),
// and the error says every problem found.
func ParseRequest(data []byte) (RequestMessage, error) {
	var m RequestMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		// Keep the client's id if it can be read, so that the failed
		// record is where the client looks for it.
		var idOnly struct {
			ID string `json:"id"`
		}
		m = RequestMessage{}
		if json.Unmarshal(data, &idOnly) == nil && ValidID(idOnly.ID) && !ReservedID(idOnly.ID) {
			m.ID = idOnly.ID
		}
		return m, fmt.Errorf("not a valid request: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return RequestMessage{}, errors.New("not a valid request: extra data after the JSON object")
	}
	if err := m.Validate(); err != nil {
		if !ValidID(m.ID) || ReservedID(m.ID) {
			m.ID = ""
		}
		return m, err
	}
	return m, nil
}

func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var pe *time.ParseError
	switch {
	case errors.As(err, &pe) || strings.Contains(err.Error(), "Time.UnmarshalJSON"):
		return "lease_until: expected a time in RFC 3339, such as 2030-01-02T15:04:05Z"
	case errors.As(err, &se):
		return fmt.Sprintf("bad JSON at byte %d: %s", se.Offset, se.Error())
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return fmt.Sprintf("expected a JSON object, got a JSON %s", te.Value)
		}
		return fmt.Sprintf("%s: expected %s, got a JSON %s", field, jsonTypeName(te.Type.String()), te.Value)
	case errors.Is(err, io.EOF):
		return "the message is empty; expected a JSON object with labels"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "bad JSON: the message ends in the middle of a value"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ") + "; expected only id, labels, requestor, priority, relative_priority, reuse, tenant, provider, event_id, requestor_data, lease_until"
	}
	return err.Error()
}

func jsonTypeName(goType string) string {
	switch goType {
	case "string":
		return "a string"
	case "[]string":
		return "a list of strings"
	case "int", "*int":
		return "an integer"
	case "*bool", "bool":
		return "true or false"
	}
	return goType
}

// Validate checks a decoded message and names every problem.
func (m *RequestMessage) Validate() error {
	var problems []string
	if m.ID != "" && !ValidID(m.ID) {
		problems = append(problems, fmt.Sprintf("id %q is not valid: expected 1 to 64 of A-Z a-z 0-9 _ . - (no leading, trailing or double dot)", m.ID))
	} else if ReservedID(m.ID) {
		problems = append(problems, fmt.Sprintf("id %q is reserved: ids of ten digits are given to requests published without an id; choose another", m.ID))
	}
	if len(m.Labels) == 0 {
		problems = append(problems, "labels: required; expected a list with one label per node wanted")
	}
	if len(m.Labels) > MaxLabels {
		problems = append(problems, fmt.Sprintf("labels: %d labels; at most %d nodes per request", len(m.Labels), MaxLabels))
	}
	for i, l := range m.Labels {
		if !labelRE.MatchString(l) || len(l) > 128 {
			problems = append(problems, fmt.Sprintf("labels[%d]: %q is not a valid label name", i, l))
		}
	}
	if len(m.RequestorData) > 0 {
		trimmed := bytes.TrimSpace(m.RequestorData)
		if !bytes.Equal(trimmed, []byte("null")) && (len(trimmed) == 0 || trimmed[0] != '{') {
			problems = append(problems, "requestor_data: expected a JSON object")
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// PublishRequest validates and publishes a request and returns its id. The
// message carries a Nats-Msg-Id (the request's id, or a unique one when it
// has none), so the publish is tried again, through a leader election or a
// lost acknowledgement, until the stream acknowledges it or ctx ends: a
// resubmission within the stream's duplicate window is a no-op, and the
// stream answers it with the sequence of the first.
func PublishRequest(ctx context.Context, js jetstream.JetStream, m RequestMessage) (string, error) {
	return PublishOwnedRequest(ctx, js, Anonymous, m)
}

// PublishOwnedRequest is PublishRequest under a requestor's identity (on
// its subject, RequestSubject).
func PublishOwnedRequest(ctx context.Context, js jetstream.JetStream, owner string, m RequestMessage) (string, error) {
	if owner != Anonymous && !ValidOwner(owner) {
		return "", fmt.Errorf("invalid requestor identity %q: expected 1 to 64 of A-Z a-z 0-9 _ -", owner)
	}
	if err := m.Validate(); err != nil {
		return "", fmt.Errorf("invalid request: %w", err)
	}
	data, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encoding request: %w", err)
	}
	msgID := m.ID
	if msgID == "" {
		msgID = nuid.Next()
	}
	ack, err := natsretry.Do(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		msg := &nats.Msg{Subject: RequestSubject(owner), Data: data, Header: nats.Header{}}
		return js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
	})
	if err != nil {
		return "", fmt.Errorf("publishing request: %w", err)
	}
	if m.ID != "" {
		return m.ID, nil
	}
	return RequestID(ack.Sequence), nil
}
