package events_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/nodepool-nats/nodepool/events"
)

// FuzzParseRequest: whatever a client publishes, ParseRequest returns (no
// panic); a message it accepts is valid, names a valid id or none, and
// reads back the same after encoding; a message it refuses says why, and
// keeps only an id that is valid.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"labels": ["ubuntu-noble"]}`,
		`{"id": "optional-client-id", "labels": ["ubuntu-noble", "ubuntu-noble"], "requestor": "zuul-tenant-a", "priority": 100, "relative_priority": 0, "reuse": true, "tenant": "tenant-a", "provider": "", "event_id": "", "requestor_data": {}, "lease_until": "2030-01-02T15:04:05Z"}`,
		`{"id": "x", "labels": []}`,
		`{"id": "..", "labels": ["a"]}`,
		`{"labels": ["a"], "requestor_data": {"slots": -1}}`,
		`{"labels": ["a"], "requestor_data": [1]}`,
		`{"labels": ["a"], "lease_until": "tomorrow"}`,
		`{"labels": ["a"], "priority": 1e400}`,
		`{"labels": "a"}`,
		`{"labels": ["a"]} {"labels": ["b"]}`,
		`{"id": "keep-me", "labels": ["a"], "colour": "red"}`,
		`{"id": "0000000027", "labels": ["a"]}`,
		`{"id": "0000000027", "labels": "a"}`,
		``, `null`, `[]`, `"labels"`, `{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := events.ParseRequest(data)
		if m.ID != "" && (!events.ValidID(m.ID) || events.ReservedID(m.ID)) {
			t.Fatalf("id %q is not valid or is reserved, yet returned (err %v)", m.ID, err)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error that says nothing")
			}
			return
		}
		if verr := m.Validate(); verr != nil {
			t.Fatalf("accepted a message that is not valid: %v", verr)
		}
		if len(m.Labels) == 0 || len(m.Labels) > events.MaxLabels {
			t.Fatalf("accepted %d labels", len(m.Labels))
		}
		if len(m.RequestorData) > 0 && string(m.RequestorData) != "null" && !json.Valid(m.RequestorData) {
			t.Fatalf("accepted requestor_data that is not JSON: %q", m.RequestorData)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("accepted a message that does not encode: %v", err)
		}
		m2, err := events.ParseRequest(again)
		if err != nil {
			t.Fatalf("an accepted message, encoded again, is refused: %v\n%s", err, again)
		}
		if m2.ID != m.ID || strings.Join(m2.Labels, ",") != strings.Join(m.Labels, ",") || m2.PriorityOrDefault() != m.PriorityOrDefault() ||
			(m.LeaseUntil == nil) != (m2.LeaseUntil == nil) || (m.LeaseUntil != nil && !m.LeaseUntil.Equal(*m2.LeaseUntil)) {
			t.Fatalf("read back differently:\n%+v\n%+v", m, m2)
		}
	})
}

// FuzzParseTrigger: whatever lands on a build or upload subject, the
// subject and body parsers return (no panic), and what they accept is a
// valid name and a known reason.
func FuzzParseTrigger(f *testing.F) {
	for _, seed := range []struct{ subject, body string }{
		{"nodepool.builds.ubuntu-noble", ``},
		{"nodepool.builds.ubuntu-noble", `{"reason": "manual", "detail": "x", "requested_by": "me"}`},
		{"nodepool.builds.a=b", `{"reason": "scheduled"}`},
		{"nodepool.uploads.ubuntu-noble.cloud1", `{"reason": "manual"}`},
		{"nodepool.uploads.ubuntu-noble", `{}`},
		{"nodepool.builds.", `{"reason": "later"}`},
		{"nodepool.builds.x.y", `[]`},
	} {
		f.Add(seed.subject, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		if image, err := events.ParseBuildSubject(subject); err == nil {
			if !events.ValidImageName(image) || events.BuildSubject(image) != subject {
				t.Fatalf("build subject %q read as image %q", subject, image)
			}
		}
		if image, provider, err := events.ParseUploadSubject(subject); err == nil {
			if !events.ValidImageName(image) || !events.ValidImageName(provider) || events.UploadSubject(image, provider) != subject {
				t.Fatalf("upload subject %q read as %q, %q", subject, image, provider)
			}
		}
		if m, err := events.ParseBuildMessage(body); err == nil && m.Reason != events.ReasonManual && m.Reason != events.ReasonScheduled {
			t.Fatalf("build trigger with reason %q accepted", m.Reason)
		}
		_, _ = events.ParseUploadMessage(body)
	})
}

// FuzzParseAPICall: whatever a requestor sends to an endpoint, the call
// parser returns (no panic); a call it accepts has the ids its verb needs,
// valid, and nothing its verb does not take.
func FuzzParseAPICall(f *testing.F) {
	for _, seed := range []string{
		`{"node": "n1", "request": "r1", "holder": "me", "lease_until": "2030-01-02T15:04:05Z"}`,
		`{"node": "n1", "reason": "why", "expire": "2h"}`,
		`{"node": "n1", "expire": 3600}`,
		`{"request": "zk=200-0000000001"}`,
		`{"request": "r", "lease_until": "tomorrow"}`,
		`{"node": "a b"}`, `{"node": "n", "expire": -1}`, `{}`, ``, `null`, `[]`, `{"node": 1}`,
	} {
		for _, verb := range events.APIVerbs {
			f.Add(verb, []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, verb string, data []byte) {
		c, err := events.ParseAPICall(verb, data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error that says nothing")
			}
			return
		}
		switch verb {
		case events.APITake:
			if c.Node == "" || c.Request == "" {
				t.Fatalf("take accepted without node and request: %+v", c)
			}
		case events.APIDeleteRequest, events.APIRenewRequest:
			if c.Request == "" || c.Node != "" {
				t.Fatalf("%s accepted %+v", verb, c)
			}
		default:
			if c.Node == "" || c.Request != "" {
				t.Fatalf("%s accepted %+v", verb, c)
			}
		}
		if len(c.Holder) > events.MaxHolder || (c.Expire != nil && *c.Expire < 0) {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// FuzzParseWork: whatever arrives on the work stream, ParseWork returns
// (no panic); what it accepts names a kind of work and a node whose
// subject is the message's, at a positive revision; what it refuses says
// why.
func FuzzParseWork(f *testing.F) {
	f.Add("nodepool.work.c.launch.abc", "abc", "7")
	f.Add("nodepool.work.c.launch.abc", "abd", "7")
	f.Add("nodepool.work.c.launch.a=b", "a.b", "1")
	f.Add("nodepool.work.c.launch.abc", "", "7")
	f.Add("nodepool.work.c.launch.abc", "abc", "0")
	f.Add("nodepool.work.c.launch.abc", "abc", "-1")
	f.Add("nodepool.work.c.launch.abc", "abc", "18446744073709551616")
	f.Add("nodepool.work.c.launch.a b", "a b", "3")
	f.Add("nodepool.work.c.launch.", ".", "3")
	f.Add("nodepool.work.c.delete.abc", "abc", "9")
	f.Add("nodepool.work.c.reboot.abc", "abc", "9")
	f.Add("nodepool.work.c.d.launch.abc", "abc", "9")
	f.Fuzz(func(t *testing.T, subject, node, rev string) {
		h := nats.Header{}
		h.Set(events.HeaderNode, node)
		h.Set(events.HeaderRevision, rev)
		w, err := events.ParseWork(subject, h)
		if err != nil {
			if !strings.Contains(err.Error(), subject) {
				t.Fatalf("error %q does not name the subject %q", err, subject)
			}
			return
		}
		if w.Node != node || w.Revision == 0 || !strings.HasSuffix(subject, "."+w.Kind+"."+strings.ReplaceAll(node, ".", "=")) {
			t.Fatalf("accepted %q %q %q as %+v", subject, node, rev, w)
		}
		m := events.WorkMsg(w.Kind, "c", w.Node, w.Revision)
		if back, err := events.ParseWork(m.Subject, m.Header); err != nil || back != w {
			t.Fatalf("LaunchMsg(%+v) reads back as %+v, %v", w, back, err)
		}
	})
}
