package openstack

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzRequests sends any body to the calls that decode one: the cloud
// answers (an error status for what it cannot take) and never panics.
func FuzzRequests(f *testing.F) {
	for _, s := range []string{
		`{"server": {"name": "a", "flavorRef": "1", "imageRef": "x", "networks": "auto"}}`,
		`{"server": {"name": "a", "flavorRef": "1", "networks": [{"port": 5}], "block_device_mapping_v2": [{"source_type": "image"}]}}`,
		`{"auth": {"identity": {"methods": ["password"], "password": {"user": {"name": "demo", "password": "secret"}}}}}`,
		`{"volume": {"size": -1}}`, `{"floatingip": {}}`, `[{"op": "remove", "path": "/x"}]`, `{"os-getConsoleOutput": {"length": -1}}`,
		`{"keypair": {"name": "k", "public_key": "nope"}}`, `null`, `{`,
	} {
		f.Add(s)
	}
	c := New(Options{})
	now := time.Now()
	c.mu.Lock()
	c.st.tokens["t"] = &token{id: "t", expires: now.Add(time.Hour)}
	s := &server{id: "s1", name: "s", status: "ACTIVE", metadata: map[string]string{}, created: now, updated: now, readyAt: now}
	c.st.servers[s.id] = s
	c.mu.Unlock()
	img := c.Images()[0].ID
	targets := []struct{ method, path string }{
		{"POST", "/compute/v2.1/servers"}, {"POST", "/identity/v3/auth/tokens"}, {"POST", "/compute/v2.1/servers/s1/action"},
		{"POST", "/compute/v2.1/servers/s1/metadata"}, {"PUT", "/compute/v2.1/servers/s1/metadata/k"}, {"POST", "/compute/v2.1/os-keypairs"},
		{"POST", "/image/v2/images"}, {"PATCH", "/image/v2/images/" + img}, {"POST", "/network/v2.0/ports"},
		{"POST", "/network/v2.0/floatingips"}, {"POST", "/volume/v3/" + c.st.projectID + "/volumes"},
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, tg := range targets {
			req := httptest.NewRequest(tg.method, tg.path, bytes.NewReader([]byte(body)))
			req.Header.Set("X-Auth-Token", "t")
			req.Header.Set("Content-Type", "application/openstack-images-v2.1-json-patch")
			rec := httptest.NewRecorder()
			c.Handler().ServeHTTP(rec, req)
			if rec.Code == 0 || rec.Code >= http.StatusInternalServerError {
				t.Errorf("%s %s with %q: %d %s", tg.method, tg.path, body, rec.Code, rec.Body)
			}
		}
	})
}
