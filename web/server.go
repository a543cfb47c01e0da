// Package web serves a process's status port: Nodepool's web API
// (/node-list, /request-list, /label-list, /image-list, /dib-image-list,
// /image-status), readiness (/ready) and liveness (/healthz), Prometheus
// metrics, a summary as JSON (/api/status) and the live dashboard. It
// answers from the watch caches of the process, never from NATS per
// request. Profiles are served apart (Pprof), on an address of their own.
package web

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/status"
)

// Options configure the status port's handler.
type Options struct {
	Views *Views
	// Config returns the process's nodepool.yaml in force (a reload may
	// change it): its images and their pause complete image-status and
	// dib-image-list. nil: none.
	Config func() *config.Config
	// Ready returns nil once the process serves (NATS connected, its roles
	// started), or why not; /ready answers 503 with that reason.
	Ready func() error
	// Alive returns nil unless the process cannot recover by itself (its
	// NATS connection is closed for good); /healthz answers 503 then.
	Alive func() error
	// Metrics serves /metrics (nil: no metrics).
	Metrics http.Handler
	// ID and Roles describe the process in /api/status, and Connected
	// tells whether its NATS connection is up.
	ID        string
	Roles     []string
	Connected func() bool
	Log       *slog.Logger
}

// Handler serves the status port.
func Handler(o Options) http.Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	mux := http.NewServeMux()
	for _, name := range status.Tables {
		mux.HandleFunc("GET /"+name, func(w http.ResponseWriter, r *http.Request) { serveTable(w, r, o, name) })
	}
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) { probe(w, o.Ready) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { probe(w, o.Alive) })
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) { serveSummary(w, o) })
	d := newDashboard(o.Views, o.Config, o.Log)
	mux.Handle("GET /dashboard/", d.assets())
	mux.HandleFunc("GET /dashboard/events", d.serveEvents)
	mux.HandleFunc("GET /dashboard/snapshot", d.serveSnapshot)
	mux.HandleFunc("GET /dashboard/snapshot.js", d.serveSnapshotScript)
	mux.HandleFunc("GET /dashboard/overview", d.serveOverview)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/dashboard/", http.StatusFound)
	})
	return mux
}

// probe answers 200 "ok" when check passes, 503 with its reason otherwise.
func probe(w http.ResponseWriter, check func() error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if check != nil {
		if err := check(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
	}
	fmt.Fprintln(w, "ok")
}

// wantsJSON reads the Accept header as Nodepool did: JSON when
// application/json is preferred to plain text, a table otherwise (no
// header, */*, text/plain).
func wantsJSON(r *http.Request) bool {
	var qJSON, qText float64
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if s, ok := params["q"]; ok {
			if v, err := strconv.ParseFloat(s, 64); err == nil {
				q = v
			}
		}
		switch mt {
		case "application/json", "application/*":
			qJSON = max(qJSON, q)
		case "text/plain", "text/*":
			qText = max(qText, q)
		}
	}
	return qJSON > qText
}

// serveTable answers one of Nodepool's list endpoints: ?fields= picks and
// orders the columns, ?node_id= narrows node-list to one node.
func serveTable(w http.ResponseWriter, r *http.Request, o Options, name string) {
	q := r.URL.Query()
	var opts status.Options
	if o.Config != nil {
		opts.Config = o.Config()
	}
	if name == "node-list" {
		opts.NodeID = q.Get("node_id")
	}
	t, err := status.Load(r.Context(), o.Views.Source(), name, opts)
	if err != nil {
		o.Log.Warn("status API", "path", r.URL.Path, "err", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fields := status.ParseFields(q.Get("fields"))
	if _, err := t.Select(fields); err != nil {
		http.Error(w, "fields: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Header().Set("Vary", "Accept")
	if wantsJSON(r) {
		w.Header().Set("Content-Type", "application/json")
		_ = t.WriteJSON(w, fields)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	_ = t.WriteText(w, fields)
}

// serveSummary answers /api/status: counts of the records by state.
func serveSummary(w http.ResponseWriter, o Options) {
	v := o.Views
	nodes := map[kv.NodeState]int{}
	v.Nodes.Range(func(e *kv.Entry[kv.Node]) bool { nodes[e.Value.State]++; return true })
	requests := map[kv.RequestState]int{}
	v.Requests.Range(func(e *kv.Entry[kv.Request]) bool { requests[e.Value.State]++; return true })
	builds := map[kv.ImageState]int{}
	v.Builds.Range(func(e *kv.Entry[kv.ImageBuild]) bool { builds[e.Value.State]++; return true })
	uploads := map[kv.ImageState]int{}
	v.Uploads.Range(func(e *kv.Entry[kv.ImageUpload]) bool { uploads[e.Value.State]++; return true })
	ready := ""
	if o.Ready != nil {
		if err := o.Ready(); err != nil {
			ready = err.Error()
		}
	}
	st := map[string]any{
		"id": o.ID, "roles": o.Roles, "nats_connected": o.Connected != nil && o.Connected(),
		"ready": ready == "", "not_ready_because": ready,
		"nodes": nodes, "requests": v.Requests.Len(), "requests_by_state": requests,
		"image_builds": builds, "image_uploads": uploads, "components": v.Components.Len(),
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}
