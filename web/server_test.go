package web_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/status"
)

// eventually polls a path until check passes on its answer, or fails the
// test with the last answer.
func (s *site) eventually(path, accept string, check func(code int, ctype, body string) bool) (int, string, string) {
	s.t.Helper()
	var code int
	var ctype, body string
	waitfor.Until(s.t, 20*time.Second, fmt.Sprintf("GET %s (Accept %q) to answer as wanted", path, accept), func() bool {
		code, ctype, body = s.get(path, accept)
		return check(code, ctype, body)
	}, waitfor.Every(50*time.Millisecond), waitfor.Detail(func() string { return fmt.Sprintf("last answer: %d %s\n%s", code, ctype, body) }))
	return code, ctype, body
}

// seedImages writes image records as a builder would: an image with a
// ready build uploaded to cloud1, and a paused image with one build.
func seedImages(t *testing.T, s *site) {
	t.Helper()
	img := kv.NewImageStores(s.client.Buckets().Images)
	now := time.Now().UTC().Add(-90 * time.Second)
	ctx := t.Context()
	for _, d := range []kv.DiskImage{{Name: "debian", BuildSeq: 1, UploadSeq: 1}, {Name: "centos", Paused: true, PausedBy: "ops", BuildSeq: 1}} {
		if _, err := img.Images.Create(ctx, d.Name, &d); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []kv.ImageBuild{
		{Image: "debian", ID: "0000000001", State: kv.ImageReady, StateTime: now, Builder: "b1", Formats: []string{"qcow2"}, Size: 3 << 20, Created: now},
		{Image: "centos", ID: "0000000001", State: kv.ImageReady, StateTime: now, Builder: "b1", Formats: []string{"raw"}, Created: now},
	} {
		if _, err := img.Builds.Create(ctx, b.Key(), &b); err != nil {
			t.Fatal(err)
		}
	}
	u := kv.ImageUpload{Image: "debian", BuildID: "0000000001", Provider: "cloud1", ID: "0000000001", State: kv.ImageReady,
		StateTime: now, ExternalID: "img-42", ExternalName: "debian-0000000001", Format: "qcow2", Created: now}
	if _, err := img.Uploads.Create(ctx, u.Key(), &u); err != nil {
		t.Fatal(err)
	}
	// A build request waiting (no builder runs here).
	if err := events.PublishBuild(ctx, s.client.JetStream(), "debian", events.BuildMessage{Reason: events.ReasonManual}, ""); err != nil {
		t.Fatal(err)
	}
}

func jsonRows(t *testing.T, body string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("not a JSON list of objects: %v\n%s", err, body)
	}
	return rows
}

// keysInOrder returns the keys of the first object of a JSON array, in
// the order they were written.
func keysInOrder(t *testing.T, body string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	for range 2 { // [ and {
		if _, err := dec.Token(); err != nil {
			t.Fatalf("reading %s: %v", body, err)
		}
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("reading %s: %v", body, err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func columnKeys(cols []status.Column) []string {
	keys := make([]string, len(cols))
	for i, c := range cols {
		keys[i] = c.Key
	}
	return keys
}

// Every endpoint of Nodepool's web API, as text and as JSON, with fields
// and node_id.
func TestNodepoolEndpoints(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	node := s.readyNode("small")
	seedImages(t, s)
	if _, err := s.client.Submit(t.Context(), events.RequestMessage{ID: "bad-1", Labels: []string{"nope"}, Requestor: "tester"}); err != nil {
		t.Fatal(err)
	}
	s.waitFor(20*time.Second, "request bad-1 failed", func() bool {
		e, ok := s.reqs.Get("bad-1")
		return ok && e.Value.State == kv.RequestFailed
	})

	const js = "application/json"
	cases := []struct {
		name, path, accept string
		// text: substrings of the table; json: checked on the rows
		text []string
		rows func(t *testing.T, rows []map[string]any)
		keys []string // the keys of each JSON object, in order
	}{
		{name: "node-list text", path: "/node-list",
			text: []string{"| ID ", "| Provider ", "| State Age ", "| Node Age ", "| Locked ", node.ID, "| ready ", "| unlocked ", "| cloud1 "}},
		{name: "node-list json", path: "/node-list", accept: js, keys: columnKeys(status.NodeColumns),
			rows: func(t *testing.T, rows []map[string]any) {
				r := findRow(t, rows, "id", node.ID)
				if r["state"] != "ready" || r["locked"] != "unlocked" || r["label"] != "small" || r["launcher"] != "web-test" || r["server_id"] != node.ExternalID {
					t.Errorf("node row = %v", r)
				}
				if age, _ := r["age"].(string); len(age) != len("00:00:00:00") {
					t.Errorf("age %q is not dd:hh:mm:ss", r["age"])
				}
			}},
		{name: "node-list fields", path: "/node-list?fields=state,id", accept: js, keys: []string{"state", "id"}},
		{name: "node-list fields text", path: "/node-list?fields=id,state",
			text: []string{"| ID ", "| State |"}},
		{name: "node-list node_id", path: "/node-list?node_id=" + node.ID, accept: js,
			rows: func(t *testing.T, rows []map[string]any) {
				if len(rows) != 1 || rows[0]["id"] != node.ID {
					t.Errorf("rows = %v, want only %s", rows, node.ID)
				}
			}},
		{name: "node-list node_id unknown", path: "/node-list?node_id=nosuch", accept: js,
			rows: func(t *testing.T, rows []map[string]any) {
				if len(rows) != 0 {
					t.Errorf("rows = %v, want none", rows)
				}
			}},
		{name: "request-list text", path: "/request-list",
			text: []string{"| Request ID ", "| Priority ", "| Node Types ", "| Declined By ", "| Event ID ", "bad-1", "| failed ", "nope", "tester"}},
		{name: "request-list json", path: "/request-list?fields=id,state,node_types,reason", accept: js,
			keys: []string{"id", "state", "node_types", "reason"},
			rows: func(t *testing.T, rows []map[string]any) {
				r := findRow(t, rows, "id", "bad-1")
				if r["state"] != "failed" || !strings.Contains(r["reason"].(string), "nope") {
					t.Errorf("request row = %v", r)
				}
				if types, _ := r["node_types"].([]any); len(types) != 1 || types[0] != "nope" {
					t.Errorf("node_types = %v", r["node_types"])
				}
			}},
		{name: "label-list text", path: "/label-list", text: []string{"| Label ", "| big ", "| small ", "cloud1/main"}},
		{name: "label-list json", path: "/label-list?fields=label", accept: js, keys: []string{"label"},
			rows: func(t *testing.T, rows []map[string]any) {
				if len(rows) != 3 || rows[0]["label"] != "big" || rows[1]["label"] != "slow" || rows[2]["label"] != "small" {
					t.Errorf("rows = %v", rows)
				}
			}},
		{name: "image-list text", path: "/image-list",
			text: []string{"| Build ID ", "| Upload ID ", "| Provider Image Name ", "| Provider Image ID ", "img-42", "debian-0000000001", "| 00:00:01:3"}},
		{name: "image-list json", path: "/image-list", accept: js,
			rows: func(t *testing.T, rows []map[string]any) {
				r := findRow(t, rows, "external_id", "img-42")
				if r["id"] != "0000000001" || r["upload_id"] != "0000000001" || r["provider"] != "cloud1" || r["state"] != "ready" {
					t.Errorf("upload row = %v", r)
				}
				// As Nodepool's: the age in JSON is a Unix time.
				if ts, ok := r["age"].(float64); !ok || time.Since(time.Unix(int64(ts), 0)) < 80*time.Second {
					t.Errorf("age = %v, want the Unix time of the state", r["age"])
				}
			}},
		{name: "dib-image-list text", path: "/dib-image-list",
			text: []string{"| ID ", "| Image ", "| Builder ", "| Formats ", "debian-0000000001", "| ready ", "centos-0000000001", "| paused "}},
		{name: "dib-image-list json", path: "/dib-image-list?fields=id,state", accept: js, keys: []string{"id", "state"},
			rows: func(t *testing.T, rows []map[string]any) {
				if r := findRow(t, rows, "id", "centos-0000000001"); r["state"] != "paused" {
					t.Errorf("paused image's build = %v", r)
				}
				if r := findRow(t, rows, "id", "debian-0000000001"); r["state"] != "ready" {
					t.Errorf("build = %v", r)
				}
			}},
		{name: "image-status text", path: "/image-status", text: []string{"| Image ", "| Paused ", "| Build Request ", "| debian ", "| False ", "| centos ", "| True "}},
		{name: "image-status json", path: "/image-status", accept: js,
			rows: func(t *testing.T, rows []map[string]any) {
				if r := findRow(t, rows, "image", "debian"); r["paused"] != false || r["build_request"] != 1.0 || r["build_id"] != "0000000001" {
					t.Errorf("debian = %v", r)
				}
				if r := findRow(t, rows, "image", "centos"); r["paused"] != true || r["build_request"] != 0.0 {
					t.Errorf("centos = %v", r)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, ctype, body := s.eventually(c.path, c.accept, func(code int, _, body string) bool {
				if code != http.StatusOK {
					return false
				}
				for _, want := range c.text {
					if !strings.Contains(body, want) {
						return false
					}
				}
				return true
			})
			if c.accept == js {
				if ctype != "application/json" {
					t.Errorf("Content-Type %q, want application/json", ctype)
				}
				rows := jsonRows(t, body)
				if c.keys != nil && len(rows) > 0 {
					if got := keysInOrder(t, body); !slices.Equal(got, c.keys) {
						t.Errorf("keys %v, want %v", got, c.keys)
					}
				}
				if c.rows != nil {
					c.rows(t, rows)
				}
				return
			}
			if !strings.HasPrefix(ctype, "text/plain") {
				t.Errorf("Content-Type %q, want text/plain", ctype)
			}
			lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
			if !strings.HasPrefix(lines[0], "+-") || !strings.HasPrefix(lines[1], "| ") || lines[len(lines)-1] != lines[0] {
				t.Errorf("not a bordered table:\n%s", body)
			}
			if code != http.StatusOK {
				t.Errorf("status %d", code)
			}
		})
	}
}

func findRow(t *testing.T, rows []map[string]any, key, value string) map[string]any {
	t.Helper()
	for _, r := range rows {
		if r[key] == value {
			return r
		}
	}
	t.Fatalf("no row with %s=%s in %v", key, value, rows)
	return nil
}

// /ready is 503 until the roles run and while NATS is away; /healthz
// stays 200 while the connection can come back.
func TestReadiness(t *testing.T) {
	t.Parallel()
	s := startSite(t, false)
	code, _, body := s.get("/ready", "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "launcher is not running") {
		t.Errorf("/ready before the roles run: %d %q", code, body)
	}
	if code, _, _ := s.get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}

	s = startSite(t, true)
	if code, _, body := s.get("/ready", ""); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/ready once running: %d %q", code, body)
	}
	port := s.srv.Addr().(*net.TCPAddr).Port
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.eventually("/ready", "", func(code int, _, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not connected to NATS")
	})
	if code, _, body := s.get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz while NATS is away: %d %q", code, body)
	}
	code, _, body = s.get("/api/status", "")
	var st map[string]any
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK || st["ready"] != false || st["nats_connected"] != false {
		t.Errorf("/api/status: %d %v %s", code, err, body)
	}
	// The server comes back on the same store: ready again.
	natstest.StartAt(t, s.srv.StoreDir, port)
	t.Cleanup(s.stop) // before the server stops
	s.eventually("/ready", "", func(code int, _, _ string) bool { return code == http.StatusOK })
}

// Bad parameters get a 400 that names them; other paths of the port.
func TestEndpointErrorsAndPaths(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	for _, c := range []struct {
		path, accept string
		code         int
		ctype, want  string
	}{
		{"/node-list?fields=id,colour", "", http.StatusBadRequest, "text/plain", `unknown field "colour"; expected some of: id, provider`},
		{"/request-list?fields=age,,id", "application/json", http.StatusOK, "application/json", `"age":`},
		{"/label-list", "text/plain, application/json", http.StatusOK, "text/plain", "| Label "},
		{"/label-list", "application/json;q=0.5, text/*", http.StatusOK, "text/plain", "| Label "},
		{"/label-list", "*/*", http.StatusOK, "text/plain", "| Label "},
		{"/label-list", "application/json, */*", http.StatusOK, "application/json", `"label":`},
		{"/nosuch-list", "", http.StatusNotFound, "text/plain", "404"},
		{"/", "", http.StatusFound, "", ""},
		{"/dashboard/", "", http.StatusOK, "text/html", "<title>nodepool</title>"},
		{"/dashboard/app.js", "", http.StatusOK, "javascript", "EventSource"},
		{"/debug/pprof/", "", http.StatusNotFound, "text/plain", "404"},
	} {
		code, ctype, body := s.eventually(c.path, c.accept, func(code int, _, body string) bool {
			return code == c.code && strings.Contains(body, c.want)
		})
		if !strings.Contains(ctype, c.ctype) {
			t.Errorf("GET %s (Accept %q): %d, Content-Type %q, want %q\n%s", c.path, c.accept, code, ctype, c.ctype, body)
		}
	}
}
