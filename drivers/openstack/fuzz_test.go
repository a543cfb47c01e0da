package openstack

import (
	"net/http"
	"testing"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
)

// FuzzClassify feeds error answers of any shape to the error mapping: it
// never panics, and a 429 is always rate limiting, a 404 not found.
func FuzzClassify(f *testing.F) {
	f.Add(403, []byte(`{"forbidden": {"message": "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances", "code": 403}}`), "")
	f.Add(409, []byte(`{"NeutronError": {"type": "OverQuota", "message": "Quota exceeded for resources: ['floatingip'].", "detail": ""}}`), "")
	f.Add(404, []byte("<html><body><h1>404 Not Found</h1>No image found with ID x</body></html>"), "")
	f.Add(429, []byte(`{"overLimit": {"code": 429, "message": "This request was rate-limited.", "retryAfter": "1"}}`), "1")
	f.Add(413, []byte(`{"overLimit": {"code": 413}}`), "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add(500, []byte(`{"computeFault": "x"}`), "-5")
	f.Fuzz(func(t *testing.T, status int, body []byte, retry string) {
		h := http.Header{}
		h.Set("Retry-After", retry)
		err := classify(gophercloud.ErrUnexpectedResponseCode{URL: "http://cloud/compute/v2.1/servers", Method: "POST", Actual: status, Body: body, ResponseHeader: h})
		if err == nil || err.Error() == "" {
			t.Fatal("no error message")
		}
		if status == 429 && !isKind(err, drivers.ErrRateLimited) {
			t.Errorf("429 is %v", err)
		}
		if status == 404 && !isKind(err, drivers.ErrNotFound) {
			t.Errorf("404 is %v", err)
		}
		if drivers.RetryAfter(err) < 0 {
			t.Errorf("negative Retry-After from %q", retry)
		}
	})
}

func isKind(err, kind error) bool {
	ce, ok := err.(*cloudError)
	return ok && ce.kind == kind
}

// FuzzResume feeds any driver_data to the create and delete machines: a
// state that is not theirs is an error or a fresh start, never a panic.
func FuzzResume(f *testing.F) {
	f.Add([]byte(`{"step":"boot","az":"nova","server":"5c0b6ef6-1f1c-4c83-a4e2-0d5c1f0e8a4e"}`))
	f.Add([]byte(`{"step":"release","server":"x","floating_ips":["a","b"],"volumes":["c"]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"step": 5}`))
	f.Add([]byte(`[`))
	cfg, err := config.Parse("nodepool.yaml", []byte(volumeConfig))
	if err != nil {
		f.Fatal(err)
	}
	pc, _ := cfg.Provider("os")
	p := &Provider{cfg: pc}
	f.Fuzz(func(t *testing.T, state []byte) {
		if sm, err := p.Create(request("n", "bfv", 1), state); err == nil {
			_ = sm.State()
			_ = sm.ExternalID()
		}
		if sm, err := p.Delete("server", state); err == nil {
			if sm.ExternalID() != "server" {
				t.Errorf("a delete resumed from %q deletes %q", state, sm.ExternalID())
			}
		}
	})
}
