package events

import (
	"strings"
	"testing"
)

func TestParseTriggers(t *testing.T) {
	builds := []struct {
		body, wantErr, reason string
	}{
		{"", "", ReasonManual},
		{"  ", "", ReasonManual},
		{`{}`, "", ReasonManual},
		{`{"reason":"scheduled","detail":"older than rebuild-age"}`, "", ReasonScheduled},
		{`{"reason":"whim"}`, `reason "whim"; expected manual or scheduled`, ""},
		{`{"image":"x"}`, `unknown field "image"; expected only reason, detail, requested_by`, ""},
		{`[1]`, "expected a JSON object, got a JSON array", ""},
		{`{"reason":`, "bad JSON", ""},
		{`{} {}`, "extra data", ""},
	}
	for _, c := range builds {
		m, err := ParseBuildMessage([]byte(c.body))
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("build body %q: %v", c.body, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("build body %q: error %v, want %q", c.body, err, c.wantErr)
		case c.wantErr == "" && m.Reason != c.reason:
			t.Errorf("build body %q: reason %q, want %q", c.body, m.Reason, c.reason)
		}
	}
	if _, err := ParseUploadMessage([]byte(`{"build":"1"}`)); err == nil || !strings.Contains(err.Error(), `unknown field "build"`) {
		t.Errorf("upload body with an unknown field: %v", err)
	}
	if _, err := ParseUploadMessage(nil); err != nil {
		t.Errorf("empty upload body: %v", err)
	}

	subjects := []struct {
		subject, image, provider string
		ok                       bool
	}{
		{"nodepool.builds.debian", "debian", "", true},
		{"nodepool.builds.debian.x", "", "", false},
		{"nodepool.builds.", "", "", false},
		{"nodepool.uploads.debian.cloud1", "debian", "cloud1", true},
		{"nodepool.uploads.debian", "", "", false},
		{"nodepool.uploads.debian.cloud.1", "", "", false},
	}
	for _, c := range subjects {
		var (
			image, provider string
			err             error
		)
		if strings.HasPrefix(c.subject, "nodepool.builds.") {
			image, err = ParseBuildSubject(c.subject)
		} else {
			image, provider, err = ParseUploadSubject(c.subject)
		}
		if (err == nil) != c.ok || image != c.image || provider != c.provider {
			t.Errorf("%s: %q %q %v", c.subject, image, provider, err)
		}
	}
}
