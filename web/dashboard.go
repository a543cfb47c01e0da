package web

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/internal/token"
	"github.com/nodepool-nats/nodepool/kv"
)

// The dashboard is plain HTML, CSS and JavaScript, embedded in the binary:
// nothing is built or fetched at run time.
//
//go:embed dashboard
var dashboardFiles embed.FS

// dashboard serves the live page, the records it starts from
// (/dashboard/snapshot, and snapshot.js for the page itself), the
// overview (/dashboard/overview) and the event stream: every change of
// the watch caches goes to each open page over Server-Sent Events,
// coalesced into one message per interval.
type dashboard struct {
	v   *Views
	cfg func() *config.Config
	log *slog.Logger
	// interval bounds how often a page gets a message; keepAlive is how
	// often an idle stream sends the overview anyway (the last hour moves
	// on, and proxies keep the stream open).
	interval  time.Duration
	keepAlive time.Duration
}

func newDashboard(v *Views, cfg func() *config.Config, log *slog.Logger) *dashboard {
	if cfg == nil {
		cfg = func() *config.Config { return nil }
	}
	return &dashboard{v: v, cfg: cfg, log: log, interval: 250 * time.Millisecond, keepAlive: 15 * time.Second}
}

func (d *dashboard) assets() http.Handler {
	sub, err := fs.Sub(dashboardFiles, "dashboard")
	if err != nil {
		panic(err) // the embedded folder is part of the binary
	}
	return http.StripPrefix("/dashboard/", http.FileServerFS(sub))
}

// feed is one cache's records for one page, made small for the browser.
type feed interface {
	kind() string
	// all returns every record now: key to record.
	all() map[string]any
	// start subscribes to the changes; the first drain holds every
	// record.
	start()
	signal() <-chan struct{}
	// drain takes the changes since the last call: key to record, or to
	// nil when the key was deleted.
	drain() map[string]any
	close()
}

type cacheFeed[T, S any] struct {
	name  string
	cache *kv.Cache[T]
	sub   *kv.Subscription[T]
	slim  func(key string, v *T) S
}

func newFeed[T, S any](name string, c *kv.Cache[T], slim func(string, *T) S) feed {
	return &cacheFeed[T, S]{name: name, cache: c, slim: slim}
}

func (f *cacheFeed[T, S]) kind() string            { return f.name }
func (f *cacheFeed[T, S]) start()                  { f.sub = f.cache.Subscribe() }
func (f *cacheFeed[T, S]) signal() <-chan struct{} { return f.sub.C() }
func (f *cacheFeed[T, S]) close()                  { f.cache.Unsubscribe(f.sub) }
func (f *cacheFeed[T, S]) all() map[string]any {
	out := make(map[string]any, f.cache.Len())
	f.cache.Range(func(e *kv.Entry[T]) bool {
		out[e.Key] = f.slim(e.Key, &e.Value)
		return true
	})
	return out
}
func (f *cacheFeed[T, S]) drain() map[string]any {
	changes := f.sub.Drain()
	if len(changes) == 0 {
		return nil
	}
	out := make(map[string]any, len(changes))
	for _, ch := range changes {
		if ch.New == nil {
			out[ch.Key] = nil
			continue
		}
		out[ch.Key] = f.slim(ch.Key, &ch.New.Value)
	}
	return out
}

func (d *dashboard) feeds() []feed {
	out := []feed{
		newFeed("nodes", d.v.Nodes, slimNode),
		newFeed("requests", d.v.Requests, slimRequest),
		newFeed("components", d.v.Components, func(_ string, c *kv.Component) kv.Component { return *c }),
		newFeed("images", d.v.Images, func(key string, i *kv.DiskImage) kv.DiskImage {
			out := *i
			if out.Name == "" {
				out.Name = token.Decode(key)
			}
			return out
		}),
		newFeed("builds", d.v.Builds, slimBuild),
		newFeed("uploads", d.v.Uploads, func(_ string, u *kv.ImageUpload) kv.ImageUpload { return *u }),
	}
	if d.v.Providers != nil {
		out = append(out, newFeed("providers", d.v.Providers, slimProvider))
	}
	return out
}

// dashProvider is what the page shows of a remembered provider (not its
// section).
type dashProvider struct {
	Name          string     `json:"name"`
	Driver        string     `json:"driver"`
	Recorded      time.Time  `json:"recorded"`
	DrainingSince *time.Time `json:"draining_since,omitempty"`
	Problem       string     `json:"problem,omitempty"`
	ProblemSince  *time.Time `json:"problem_since,omitempty"`
}

func slimProvider(key string, p *kv.ProviderRecord) dashProvider {
	name := p.Name
	if name == "" {
		name = token.Decode(key)
	}
	return dashProvider{Name: name, Driver: p.Driver, Recorded: p.Recorded, DrainingSince: p.DrainingSince,
		Problem: p.Problem, ProblemSince: p.ProblemSince}
}

// overviewKinds are the records the overview is made of: a change of one
// of them sends it again.
var overviewKinds = []string{"nodes", "requests", "components"}

// snapshot is every record and the overview, as the event stream's first
// message has them.
func (d *dashboard) snapshot() map[string]any {
	msg := map[string]any{"reset": true}
	for _, f := range d.feeds() {
		msg[f.kind()] = f.all()
	}
	msg["overview"] = d.v.overview(d.cfg())
	msg["server_time"] = time.Now().UTC()
	return msg
}

// serveSnapshot answers /dashboard/snapshot: every record and the
// overview, as JSON.
func (d *dashboard) serveSnapshot(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, d.snapshot())
}

// serveSnapshotScript answers /dashboard/snapshot.js: the snapshot, as a
// script that hands it to the page. The page loads it as a script, not a
// fetch, so that its load event waits for the first data: a browser (or
// `chromium --headless --screenshot`) that waits for the page to load
// sees the records, not a page still loading.
func (d *dashboard) serveSnapshotScript(w http.ResponseWriter, _ *http.Request) {
	data, err := json.Marshal(d.snapshot())
	if err != nil {
		d.log.Error("dashboard: encoding the snapshot", "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// JSON is a JavaScript expression (json.Marshal escapes <, > and &,
	// and U+2028 and U+2029).
	_, _ = w.Write(append(append([]byte("nodepoolSnapshot("), data...), ");\n"...))
}

// serveOverview answers /dashboard/overview: the pools' capacity, the
// providers' quota and failures, and the last hour, as JSON.
func (d *dashboard) serveOverview(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, d.v.overview(d.cfg()))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// serveEvents streams the records: a first message with everything
// ("reset": true), then the changes. The overview comes with the first
// message, with every change of the records it is made of, and every
// keepAlive.
func (d *dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported by this connection", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	ctx, cancel := context.WithCancel(r.Context())
	feeds := d.feeds()
	for _, f := range feeds {
		f.start()
	}
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, f := range feeds {
			f.close()
		}
		wg.Wait()
	}()
	for _, f := range feeds {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-f.signal():
					select {
					case wake <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	keepAlive := time.NewTicker(d.keepAlive)
	defer keepAlive.Stop()
	first, refresh := true, false
	for {
		msg := map[string]any{}
		for _, f := range feeds {
			if changes := f.drain(); changes != nil {
				msg[f.kind()] = changes
			}
		}
		if first || len(msg) > 0 || refresh {
			for _, k := range overviewKinds {
				if msg[k] != nil {
					refresh = true
				}
			}
			if first || refresh {
				msg["overview"] = d.v.overview(d.cfg())
			}
			msg["reset"] = first
			msg["server_time"] = time.Now().UTC()
			data, err := json.Marshal(msg)
			if err != nil {
				d.log.Error("dashboard: encoding an update", "err", err)
				return
			}
			if _, err := w.Write(append(append([]byte("data: "), data...), '\n', '\n')); err != nil {
				return
			}
			flusher.Flush()
			first, refresh = false, false
		}
		select {
		case <-ctx.Done():
			return
		case <-keepAlive.C:
			refresh = true
			continue
		case <-wake:
		}
		// Let changes gather, so a burst is one message.
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.interval):
		}
	}
}

// dashNode is what the page shows of a node (no driver or user data).
type dashNode struct {
	ID             string       `json:"id"`
	State          kv.NodeState `json:"state"`
	Labels         []string     `json:"labels"`
	Provider       string       `json:"provider"`
	Pool           string       `json:"pool"`
	ExternalID     string       `json:"external_id,omitempty"`
	InterfaceIP    string       `json:"interface_ip,omitempty"`
	AllocatedTo    string       `json:"allocated_to,omitempty"`
	Holder         string       `json:"holder,omitempty"`
	Launcher       string       `json:"launcher,omitempty"`
	HoldJob        string       `json:"hold_job,omitempty"`
	HoldExpiration *time.Time   `json:"hold_expiration,omitempty"`
	Comment        string       `json:"comment,omitempty"`
	Reason         string       `json:"reason,omitempty"`
	Attempt        int          `json:"attempt,omitempty"`
	Created        time.Time    `json:"created"`
	StateTime      time.Time    `json:"state_time"`
}

func slimNode(_ string, n *kv.Node) dashNode {
	return dashNode{ID: n.ID, State: n.State, Labels: n.Labels, Provider: n.Provider, Pool: n.Pool,
		ExternalID: n.ExternalID, InterfaceIP: n.InterfaceIP, AllocatedTo: n.AllocatedTo, Holder: n.Holder,
		Launcher: n.Launcher, HoldJob: n.HoldJob, HoldExpiration: n.HoldExpiration, Comment: n.Comment,
		Reason: n.Reason, Attempt: n.Attempt, Created: n.Created, StateTime: n.StateTime}
}

// dashRequest is what the page shows of a request (no requestor data).
type dashRequest struct {
	ID               string          `json:"id"`
	State            kv.RequestState `json:"state"`
	Labels           []string        `json:"labels"`
	Nodes            []string        `json:"nodes"`
	DeclinedBy       []string        `json:"declined_by,omitempty"`
	Provider         string          `json:"provider,omitempty"`
	Pool             string          `json:"pool,omitempty"`
	Requestor        string          `json:"requestor,omitempty"`
	Priority         int             `json:"priority"`
	RelativePriority int             `json:"relative_priority"`
	Reason           string          `json:"reason,omitempty"`
	Created          time.Time       `json:"created"`
	StateTime        time.Time       `json:"state_time"`
}

func slimRequest(_ string, r *kv.Request) dashRequest {
	return dashRequest{ID: r.ID, State: r.State, Labels: r.Labels, Nodes: r.Nodes, DeclinedBy: r.DeclinedBy,
		Provider: r.Provider, Pool: r.Pool, Requestor: r.Requestor, Priority: r.Priority,
		RelativePriority: r.RelativePriority, Reason: r.Reason, Created: r.Created, StateTime: r.StateTime}
}

// dashBuild is what the page shows of a build (no file list).
type dashBuild struct {
	Image     string        `json:"image"`
	ID        string        `json:"id"`
	State     kv.ImageState `json:"state"`
	StateTime time.Time     `json:"state_time"`
	Builder   string        `json:"builder,omitempty"`
	Formats   []string      `json:"formats"`
	Size      int64         `json:"size"`
	Reason    string        `json:"reason,omitempty"`
}

func slimBuild(_ string, b *kv.ImageBuild) dashBuild {
	return dashBuild{Image: b.Image, ID: b.ID, State: b.State, StateTime: b.StateTime, Builder: b.Builder,
		Formats: b.Formats, Size: b.Size, Reason: b.Reason}
}
