package openstack

import (
	"encoding/json"
	"net/http"
	"time"
)

// serveAdmin is the dev cloud's own API (not OpenStack's), for scripts and
// benchmarks driving a cloud started by `nodepool-devcloud openstack`; it
// needs no token and is not counted in Stats:
//
//	GET /_devcloud/stats    calls served per service, refused for the rate limit, servers created
//	GET /_devcloud/servers  the servers that are not deleted, oldest first, with their times
func (c *Cloud) serveAdmin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/_devcloud/stats" && r.Method == http.MethodGet:
		st := c.Stats()
		_ = json.NewEncoder(w).Encode(map[string]any{"calls": st.Calls, "rate_limited": st.RateLimited, "servers_created": st.ServersCreated})
	case r.URL.Path == "/_devcloud/servers" && r.Method == http.MethodGet:
		type server struct {
			ID       string     `json:"id"`
			Name     string     `json:"name"`
			Status   string     `json:"status"`
			Deleting bool       `json:"deleting,omitempty"`
			Created  time.Time  `json:"created"`
			Launched *time.Time `json:"launched,omitempty"`
		}
		out := []server{}
		for _, s := range c.Servers() {
			sv := server{ID: s.ID, Name: s.Name, Status: s.Status, Deleting: s.Deleting, Created: s.Created}
			if !s.Launched.IsZero() {
				sv.Launched = &s.Launched
			}
			out = append(out, sv)
		}
		_ = json.NewEncoder(w).Encode(out)
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "no such dev cloud endpoint: " + r.Method + " " + r.URL.Path})
	}
}
