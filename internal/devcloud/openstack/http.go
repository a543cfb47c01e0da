package openstack

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Services and the path each is served under.
var services = []struct{ name, prefix string }{
	{"identity", "/identity"},
	{"compute", "/compute"},
	{"image", "/image"},
	{"network", "/network"},
	{"volume", "/volume"},
}

// serviceOf names the service a path belongs to; the root and /v3 are
// Keystone's too, as on a cloud whose auth_url is host:5000/v3.
func serviceOf(path string) string {
	for _, s := range services {
		if path == s.prefix || strings.HasPrefix(path, s.prefix+"/") {
			return s.name
		}
	}
	return "identity"
}

// base is the address clients reached the cloud at, for links and the
// catalog.
func base(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// serve runs every call: latency, the cloud's rate limit, token checks,
// then the service's handler.
func (c *Cloud) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_devcloud/") {
		c.serveAdmin(w, r)
		return
	}
	svc := serviceOf(r.URL.Path)
	c.mu.Lock()
	c.stats.Calls[svc]++
	latency := c.latency
	limited := c.overRate(time.Now())
	if limited {
		c.stats.RateLimited++
	}
	c.mu.Unlock()
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	if limited {
		w.Header().Set("Retry-After", "1")
		c.writeError(w, svc, http.StatusTooManyRequests, "OverLimit", "This request was rate-limited.")
		return
	}
	if svc == "identity" {
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/identity")
		if r2.URL.Path == "" {
			r2.URL.Path = "/"
		}
		r = r2
	}
	if !c.public(svc, r) && !c.authorized(r) {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf("Keystone uri=%q", base(r)+"/identity"))
		if svc == "identity" {
			keystoneError(w, http.StatusUnauthorized, "Unauthorized", "The request you have made requires authentication.")
			return
		}
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]any{
			"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}})
		return
	}
	c.mux.ServeHTTP(w, r)
}

// public reports whether a call needs no token: version documents and
// Keystone's token creation.
func (c *Cloud) public(svc string, r *http.Request) bool {
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch svc {
	case "identity":
		return p == "" || p == "/v3" || (p == "/v3/auth/tokens" && r.Method == http.MethodPost)
	case "compute":
		return p == "/compute" || p == "/compute/v2.1"
	case "image":
		return p == "/image" || p == "/image/versions"
	case "network":
		return p == "/network"
	case "volume":
		return p == "/volume" || p == "/volume/v3"
	}
	return false
}

// authorized checks the call's token.
func (c *Cloud) authorized(r *http.Request) bool {
	id := r.Header.Get("X-Auth-Token")
	if id == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.st.tokens[id]
	return ok && time.Now().Before(t.expires)
}

// overRate counts a call against the per-second limit.
func (c *Cloud) overRate(now time.Time) bool {
	if c.rateLimit <= 0 {
		return false
	}
	sec := now.Unix()
	if sec != c.window {
		c.window, c.windowCalls = sec, 0
	}
	if float64(c.windowCalls) >= c.rateLimit {
		return true
	}
	c.windowCalls++
	return false
}

// locked runs a handler with the state locked and brought up to now.
func (c *Cloud) locked(h func(w http.ResponseWriter, r *http.Request, now time.Time)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		now := time.Now().UTC()
		c.advance(now)
		h(w, r, now)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// readJSON decodes a request body (at most 1 MiB).
func readJSON(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("malformed request body: %w", err)
	}
	return nil
}

// writeError answers with the error body the service writes.
func (c *Cloud) writeError(w http.ResponseWriter, svc string, status int, kind, message string) {
	switch svc {
	case "identity":
		keystoneError(w, status, http.StatusText(status), message)
	case "image":
		glanceError(w, status, message)
	case "network":
		neutronError(w, status, kind, message)
	default:
		novaError(w, status, message)
	}
}

// faultKeys name the body of an error of Nova and Cinder by status.
var faultKeys = map[int]string{
	400: "badRequest", 401: "unauthorized", 403: "forbidden", 404: "itemNotFound",
	405: "badMethod", 406: "notAcceptable", 409: "conflictingRequest", 413: "overLimit",
	415: "badMediaType", 429: "overLimit", 501: "notImplemented", 503: "serviceUnavailable",
}

// novaError writes a fault as Nova and Cinder do:
// {"itemNotFound": {"code": 404, "message": "..."}}.
func novaError(w http.ResponseWriter, status int, message string) {
	key, ok := faultKeys[status]
	if !ok {
		key = "computeFault"
	}
	body := map[string]any{"code": status, "message": message}
	if status == 413 || status == 429 {
		retry := w.Header().Get("Retry-After")
		if retry == "" {
			retry = "0"
		}
		body["retryAfter"] = retry
	}
	writeJSON(w, status, map[string]any{key: body})
}

// neutronError writes {"NeutronError": {"type": ..., "message": ..., "detail": ""}}.
func neutronError(w http.ResponseWriter, status int, kind, message string) {
	writeJSON(w, status, map[string]any{"NeutronError": map[string]any{"type": kind, "message": message, "detail": ""}})
}

// keystoneError writes {"error": {"code": ..., "title": ..., "message": ...}}.
func keystoneError(w http.ResponseWriter, status int, title, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "title": title, "message": message}})
}

// glanceError writes the HTML page Glance's web framework answers errors
// with.
func glanceError(w http.ResponseWriter, status int, message string) {
	title := fmt.Sprintf("%d %s", status, http.StatusText(status))
	body := fmt.Sprintf("<html>\n <head>\n  <title>%s</title>\n </head>\n <body>\n  <h1>%s</h1>\n  %s<br /><br />\n\n\n\n </body>\n</html>",
		title, title, html.EscapeString(message))
	w.Header().Set("Content-Type", "text/html; charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// stamp formats a time as OpenStack's APIs do: 2024-05-01T12:00:00Z.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

// stampMicro formats a time with microseconds and no zone, as Nova's
// launched_at and Cinder's times are.
func stampMicro(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000") }

// page cuts a sorted listing at marker and limit. It returns the items of
// the page and whether a next page link is due (the page is full), or
// ok=false if the marker is not in the listing.
func page[T any](items []T, idOf func(T) string, marker string, limit int) (out []T, more bool, ok bool) {
	start := 0
	if marker != "" {
		start = -1
		for i, it := range items {
			if idOf(it) == marker {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return nil, false, false
		}
	}
	items = items[start:]
	if len(items) > limit {
		return items[:limit], true, true
	}
	return items, len(items) == limit && limit > 0, true
}

// limitParam reads ?limit= (bounded by the page size).
func (c *Cloud) limitParam(r *http.Request) (int, error) {
	limit := c.pageSize
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("limit must be an integer 0 or greater")
		}
		limit = min(n, c.pageSize)
	}
	return limit, nil
}

// nextLink is the address of the page after marker, keeping the query.
func nextLink(r *http.Request, prefix, marker string) string {
	q := r.URL.Query()
	q.Set("marker", marker)
	return base(r) + prefix + r.URL.Path + "?" + q.Encode()
}

// withID runs h on the item a request's {id} names: find looks it up (ok
// false: there is none), notFound answers in the service's own way when
// there is none.
func withID[T any](find func(id string) (*T, bool), notFound func(w http.ResponseWriter, id string),
	h func(http.ResponseWriter, *http.Request, time.Time, *T)) func(http.ResponseWriter, *http.Request, time.Time) {
	return func(w http.ResponseWriter, r *http.Request, now time.Time) {
		id := r.PathValue("id")
		item, ok := find(id)
		if !ok {
			notFound(w, id)
			return
		}
		h(w, r, now, item)
	}
}
