package openstack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// The server watch lists the project's servers for every state machine of
// the provider at once, as Nodepool's adapter does, instead of one GET per
// server per poll: one listing of what changed since the last one (Nova's
// changes-since) serves every booting and deleting server and the
// launcher's instance listings. A listing starts at most every
// pollInterval, or every two listing durations when listings grow long
// (so that listing takes at most half of the time), or every five paced
// calls when the provider has a rate (so that listings take at most a
// fifth of it); a full listing now and then repairs anything a delta
// listing could miss.
const (
	pollInterval  = 250 * time.Millisecond
	fullListEvery = time.Minute
	// changesMargin is taken off the cloud's clock (the Date of the last
	// listing, to the second, less the listing's own duration) for the
	// next changes-since: Nova's times are to the second.
	changesMargin = time.Second
)

type serverWatch struct {
	p *Provider

	mu        sync.Mutex
	servers   map[string]server
	synced    bool
	listedAt  time.Time // when the last good listing started (local clock)
	cloudAt   time.Time // the cloud's Date of the last good listing
	fullAt    time.Time
	lastStart time.Time
	lastTook  time.Duration
	running   *refresh
}

// refresh is one listing in flight; done closes when it ends.
type refresh struct {
	done chan struct{}
	err  error
}

func newServerWatch(p *Provider) *serverWatch {
	return &serverWatch{p: p, servers: map[string]server{}}
}

// await waits until a listing that started at or after since has been
// applied, starting one if none runs, and calls read with the lock held.
func (w *serverWatch) await(ctx context.Context, since time.Time, read func()) error {
	for {
		w.mu.Lock()
		if w.synced && !w.listedAt.Before(since) {
			read()
			w.mu.Unlock()
			return nil
		}
		r := w.running
		if r == nil {
			r = &refresh{done: make(chan struct{})}
			w.running = r
			w.p.wg.Go(func() { w.run(r) })
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.done:
		}
		if r.err != nil {
			return r.err
		}
	}
}

// get returns a server as a listing that started at or after since shows
// it; ok is false when that listing does not show it (it is gone).
func (w *serverWatch) get(ctx context.Context, id string, since time.Time) (s server, ok bool, err error) {
	err = w.await(ctx, since, func() { s, ok = w.servers[id] })
	return s, ok, err
}

// snapshot lists every server, as of a listing at most maxAge old.
func (w *serverWatch) snapshot(ctx context.Context, maxAge time.Duration) ([]server, error) {
	var out []server
	err := w.await(ctx, time.Now().Add(-maxAge), func() {
		out = make([]server, 0, len(w.servers))
		for _, s := range w.servers {
			out = append(out, s)
		}
	})
	return out, err
}

// run makes one listing (spaced from the previous one by pollInterval)
// and applies it.
func (w *serverWatch) run(r *refresh) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop := context.AfterFunc(w.bgDone(), cancel)
	defer stop()
	w.mu.Lock()
	interval := max(pollInterval, 2*w.lastTook)
	if r := w.p.pacer.callsPerSecond(); r > 0 {
		interval = max(interval, time.Duration(5*float64(time.Second)/r))
	}
	next := w.lastStart.Add(interval)
	full := !w.synced || time.Since(w.fullAt) > fullListEvery
	since := w.cloudAt.Add(-changesMargin - w.lastTook)
	w.mu.Unlock()
	wait.Sleep(ctx, time.Until(next))
	start := time.Now()
	ctx, paced := drivers.WithPacedWaitMeter(ctx)
	got, date, err := w.list(ctx, full, since)
	w.mu.Lock()
	defer w.mu.Unlock()
	// What the listing cost the cloud: its time less its turns at the
	// rate, which the rate's own spacing already accounts for.
	w.lastStart, w.lastTook = start, time.Since(start)-paced()
	w.running = nil
	r.err = err
	defer close(r.done)
	if err != nil {
		return
	}
	if full {
		w.servers = map[string]server{}
		w.fullAt = start
	}
	for _, s := range got {
		if s.Status == "DELETED" {
			delete(w.servers, s.ID)
			continue
		}
		w.servers[s.ID] = s
	}
	w.synced, w.listedAt = true, start
	if date.IsZero() {
		date = start
	}
	w.cloudAt = date
}

// bgDone is closed when the provider closes.
func (w *serverWatch) bgDone() context.Context { return w.p.bg }

// server is what the driver reads of a Nova server: the fields of a
// listing it uses, decoded once (a listing of hundreds of servers is
// decoded every poll).
type server struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Status    string            `json:"status"`
	TaskState string            `json:"OS-EXT-STS:task_state"`
	AZ        string            `json:"OS-EXT-AZ:availability_zone"`
	Metadata  map[string]string `json:"metadata"`
	Addresses map[string][]struct {
		Addr string `json:"addr"`
		Type string `json:"OS-EXT-IPS:type"`
	} `json:"addresses"`
	// Flavor holds vcpus and ram from microversion 2.47, an id before.
	Flavor struct {
		ID    string `json:"id"`
		VCPUs int    `json:"vcpus"`
		RAM   int    `json:"ram"`
	} `json:"flavor"`
	// Image is {"id": ...}, or "" for a server booted from a volume.
	Image json.RawMessage `json:"image"`
	Fault struct {
		Message string `json:"message"`
	} `json:"fault"`
}

// imageID is the id of the image the server booted from ("" from a
// volume).
func (s *server) imageID() string {
	var img struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(s.Image, &img) != nil {
		return ""
	}
	return img.ID
}

// list lists the servers (those changed since since, unless full), page
// by page as Nova links them, and the cloud's Date of the first answer.
func (w *serverWatch) list(ctx context.Context, full bool, since time.Time) ([]server, time.Time, error) {
	cl, err := w.p.client(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	q := url.Values{}
	if !full {
		q.Set("changes-since", since.UTC().Format(time.RFC3339))
	}
	next := cl.compute.ServiceURL("servers", "detail")
	if len(q) > 0 {
		next += "?" + q.Encode()
	}
	var out []server
	var date time.Time
	for pages := 0; next != ""; pages++ {
		if pages > 10000 {
			return nil, time.Time{}, fmt.Errorf("listing servers: more than 10000 pages")
		}
		var page struct {
			Servers []server `json:"servers"`
			Links   []struct {
				Rel  string `json:"rel"`
				Href string `json:"href"`
			} `json:"servers_links"`
		}
		resp, err := cl.compute.Get(ctx, next, &page, &gophercloud.RequestOpts{
			OkCodes: []int{200}, MoreHeaders: map[string]string{"X-OpenStack-Nova-API-Version": cl.compute.Microversion},
		})
		if err != nil {
			return nil, time.Time{}, wrapf(err, "listing servers")
		}
		if date.IsZero() && resp != nil {
			if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
				date = d
			}
		}
		out = append(out, page.Servers...)
		next = ""
		for _, l := range page.Links {
			if l.Rel == "next" && len(page.Servers) > 0 {
				next = l.Href
			}
		}
	}
	return out, date, nil
}

var _ drivers.Owner = (*Provider)(nil)

// Owns reports whether the server was made for the node by this provider
// (its metadata), as a listing started now shows it.
func (p *Provider) Owns(ctx context.Context, externalID, nodeID string) (bool, error) {
	s, ok, err := p.watch.get(ctx, externalID, time.Now())
	if err != nil {
		return false, err
	}
	if !ok {
		return false, fmt.Errorf("server %s: %w", externalID, drivers.ErrNotFound)
	}
	return drivers.OwnedBy(s.Metadata, p.cfg.Name, nodeID), nil
}
