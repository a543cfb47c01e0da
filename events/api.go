package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// The requestor's endpoints (public contract): a requestor acts on its
// own requests and the nodes they got through NATS requests on
// nodepool.api.<owner>.<verb>, which the launchers answer after checking
// that the request or node is the owner's. nats.conf lets each requestor
// user use its own <owner> token only, so the identity is the server's
// word, not the requestor's; requestors write no record themselves.

// API verbs.
const (
	APITake          = "take"
	APIRenew         = "renew"
	APIReturn        = "return"
	APIHold          = "hold"
	APIDeleteRequest = "delete-request"
	APIRenewRequest  = "renew-request"
)

// APIVerbs lists the verbs.
var APIVerbs = []string{APITake, APIRenew, APIReturn, APIHold, APIDeleteRequest, APIRenewRequest}

// APISubject is the subject of a verb for a requestor's identity.
func APISubject(owner, verb string) string {
	if owner == "" {
		owner = Anonymous
	}
	return "nodepool.api." + owner + "." + verb
}

// ParseAPISubject splits an endpoint's subject into the owner and verb.
func ParseAPISubject(subject string) (owner, verb string, ok bool) {
	rest, found := strings.CutPrefix(subject, "nodepool.api.")
	if !found {
		return "", "", false
	}
	owner, verb, found = strings.Cut(rest, ".")
	if !found || !ValidOwner(owner) || strings.Contains(verb, ".") {
		return "", "", false
	}
	for _, v := range APIVerbs {
		if v == verb {
			return owner, verb, true
		}
	}
	return owner, verb, false
}

// APICall is the body of a call: the fields its verb takes.
//
//	take            node, request, holder (default: the owner), lease_until
//	renew           node, lease_until
//	return          node
//	hold            node, reason, expire ("2h", or seconds; none: no expiry of its own)
//	delete-request  request
//	renew-request   request, lease_until
type APICall struct {
	Node       string     `json:"node,omitempty"`
	Request    string     `json:"request,omitempty"`
	Holder     string     `json:"holder,omitempty"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Expire     *Duration  `json:"expire,omitempty"`
}

// Duration is a duration written as Go writes one ("2h", "90s") or as a
// number of seconds.
type Duration time.Duration

// UnmarshalJSON reads "2h" or 7200.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 {
			return fmt.Errorf("expected a duration such as \"2h\", got %q", s)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil || secs < 0 || secs > 1e9 {
		return fmt.Errorf("expected a duration such as \"2h\" or a number of seconds, got %s", b)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as Go writes one.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// apiFields says what each verb takes.
var apiFields = map[string]string{
	APITake: "node, request, holder, lease_until", APIRenew: "node, lease_until", APIReturn: "node",
	APIHold: "node, reason, expire", APIDeleteRequest: "request", APIRenewRequest: "request, lease_until",
}

// MaxHolder bounds the holder a requestor names.
const MaxHolder = 256

// ParseAPICall decodes and checks a call's body for its verb; the error
// says what is wrong and what is expected.
func ParseAPICall(verb string, data []byte) (APICall, error) {
	var c APICall
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return c, fmt.Errorf("%s: the body is empty; expected a JSON object", verb)
		}
		why := describeJSONError(err)
		if strings.HasPrefix(err.Error(), "json: unknown field") {
			why = strings.TrimPrefix(err.Error(), "json: ") + "; " + verb + " takes " + apiFields[verb]
		}
		return c, fmt.Errorf("%s: not a valid call: %s", verb, why)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%s: extra data after the JSON object", verb)
	}
	var problems []string
	need := func(field, value string, valid func(string) bool) {
		switch {
		case value == "":
			problems = append(problems, field+": required")
		case !valid(value):
			problems = append(problems, fmt.Sprintf("%s: %q is not a valid id", field, value))
		}
	}
	none := func(field string, set bool) {
		if set {
			problems = append(problems, field+": not taken by "+verb)
		}
	}
	nodeID := func(s string) bool { return len(s) <= 128 && keyRE.MatchString(s) }
	switch verb {
	case APITake:
		need("node", c.Node, nodeID)
		need("request", c.Request, nodeID)
		none("reason", c.Reason != "")
		none("expire", c.Expire != nil)
	case APIRenew:
		need("node", c.Node, nodeID)
		if c.LeaseUntil == nil {
			problems = append(problems, "lease_until: required")
		}
		none("request", c.Request != "")
		none("holder", c.Holder != "")
		none("reason", c.Reason != "")
		none("expire", c.Expire != nil)
	case APIReturn:
		need("node", c.Node, nodeID)
		none("request", c.Request != "")
		none("holder", c.Holder != "")
		none("lease_until", c.LeaseUntil != nil)
		none("reason", c.Reason != "")
		none("expire", c.Expire != nil)
	case APIHold:
		need("node", c.Node, nodeID)
		none("request", c.Request != "")
		none("holder", c.Holder != "")
		none("lease_until", c.LeaseUntil != nil)
	case APIDeleteRequest:
		need("request", c.Request, nodeID)
		none("node", c.Node != "")
		none("holder", c.Holder != "")
		none("lease_until", c.LeaseUntil != nil)
		none("reason", c.Reason != "")
		none("expire", c.Expire != nil)
	case APIRenewRequest:
		need("request", c.Request, nodeID)
		if c.LeaseUntil == nil {
			problems = append(problems, "lease_until: required")
		}
		none("node", c.Node != "")
		none("holder", c.Holder != "")
		none("reason", c.Reason != "")
		none("expire", c.Expire != nil)
	default:
		return c, fmt.Errorf("unknown verb %q; expected one of: %s", verb, strings.Join(APIVerbs, ", "))
	}
	if len(c.Holder) > MaxHolder {
		problems = append(problems, fmt.Sprintf("holder: %d characters; at most %d", len(c.Holder), MaxHolder))
	}
	if len(c.Reason) > 1024 {
		problems = append(problems, fmt.Sprintf("reason: %d characters; at most 1024", len(c.Reason)))
	}
	if len(problems) > 0 {
		return c, fmt.Errorf("%s: %s", verb, strings.Join(problems, "; "))
	}
	return c, nil
}

// keyRE is what a record's key may hold (NATS KV's keys).
var keyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

// APIReply is an endpoint's answer: the record it acted on, or an error
// with its kind.
type APIReply struct {
	Node    json.RawMessage `json:"node,omitempty"`
	Request json.RawMessage `json:"request,omitempty"`
	Gone    bool            `json:"gone,omitempty"`
	Error   string          `json:"error,omitempty"`
	// Code is the kind of error: bad-call, not-found, not-yours, state,
	// unavailable (try again), internal.
	Code string `json:"code,omitempty"`
}

// Kinds of API errors.
const (
	APIBadCall  = "bad-call"
	APINotFound = "not-found"
	APINotYours = "not-yours"
	APIState    = "state"
	APIInternal = "internal"
	// APIUnavailable: NATS could not do it now (a cluster electing a
	// leader); the same call may pass if made again.
	APIUnavailable = "unavailable"
)
