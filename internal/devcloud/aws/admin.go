package aws

import (
	"encoding/json"
	"io"
	"net/http"
)

// serveAdmin is the dev cloud's own API (not AWS's), for operators and
// scripts driving a cloud started by `nodepool-devcloud aws`:
//
//	GET  /_devcloud/knobs               the knobs as JSON
//	PUT  /_devcloud/knobs               change knobs (fields given replace theirs)
//	POST /_devcloud/interrupt           {"instance_id": "i-...", "kind": "notice|terminate|rebalance"}
//	GET  /_devcloud/calls               calls received per action
//	GET  /_devcloud/instances           the instances not terminated, oldest first, with their times
func (c *Cloud) serveAdmin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fail := func(status int, msg string) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
	}
	body := func(v any) bool {
		data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil {
			err = json.Unmarshal(data, v)
		}
		if err != nil {
			fail(http.StatusBadRequest, "expected a JSON body: "+err.Error())
			return false
		}
		return true
	}
	switch {
	case r.URL.Path == "/_devcloud/knobs" && r.Method == http.MethodGet:
		_ = json.NewEncoder(w).Encode(c.Knobs())
	case r.URL.Path == "/_devcloud/knobs" && r.Method == http.MethodPut:
		k := c.Knobs()
		if !body(&k) {
			return
		}
		if k.RateLimit < 0 || k.PageSize < 0 {
			fail(http.StatusBadRequest, "rate_limit and page_size must be 0 or more")
			return
		}
		c.SetKnobs(func(cur *Knobs) { *cur = k })
		_ = json.NewEncoder(w).Encode(c.Knobs())
	case r.URL.Path == "/_devcloud/interrupt" && r.Method == http.MethodPost:
		var in struct {
			InstanceID string `json:"instance_id"`
			Kind       string `json:"kind"`
		}
		if !body(&in) {
			return
		}
		if in.Kind == "" {
			in.Kind = InterruptNotice
		}
		if err := c.Interrupt(in.InstanceID, in.Kind); err != nil {
			fail(http.StatusBadRequest, err.Error())
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"instance_id": in.InstanceID, "kind": in.Kind})
	case r.URL.Path == "/_devcloud/calls" && r.Method == http.MethodGet:
		_ = json.NewEncoder(w).Encode(c.Calls())
	case r.URL.Path == "/_devcloud/instances" && r.Method == http.MethodGet:
		_ = json.NewEncoder(w).Encode(c.Instances())
	default:
		fail(http.StatusNotFound, "no such dev cloud endpoint: "+r.Method+" "+r.URL.Path)
	}
}
