package status

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/token"
	"github.com/nodepool-nats/nodepool/kv"
)

// Source gives the records the tables are made of: the CLI reads them from
// the buckets (Buckets), the web API from the watch caches of its process.
type Source interface {
	// Nodes are the node records, to be read, not changed.
	Nodes(ctx context.Context) ([]*kv.Node, error)
	Requests(ctx context.Context) ([]kv.Request, error)
	Components(ctx context.Context) ([]kv.Component, error)
	DiskImages(ctx context.Context) ([]kv.DiskImage, error)
	Builds(ctx context.Context) ([]kv.ImageBuild, error)
	Uploads(ctx context.Context) ([]kv.ImageUpload, error)
	// BuildRequests counts the build triggers waiting, per image.
	BuildRequests(ctx context.Context) (map[string]int, error)
}

// Tables names every table, as the web API's paths and the CLI's commands
// do.
var Tables = []string{"node-list", "request-list", "label-list", "image-list", "dib-image-list", "image-status"}

// Options narrow or complete a table.
type Options struct {
	// NodeID restricts node-list to one node (empty: every node).
	NodeID string
	// Config, if set, adds its images and their pause to image-status
	// and dib-image-list.
	Config *config.Config
	Now    time.Time
}

// Load builds a table by name from a source.
func Load(ctx context.Context, src Source, name string, o Options) (*Table, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	switch name {
	case "node-list":
		nodes, err := src.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		if o.NodeID != "" {
			nodes = slices.DeleteFunc(nodes, func(n *kv.Node) bool { return n.ID != o.NodeID })
		}
		alive, err := liveness(ctx, src)
		if err != nil {
			return nil, err
		}
		SortNodes(nodes)
		return NodeList(nodes, alive, o.Now), nil
	case "request-list":
		reqs, err := src.Requests(ctx)
		if err != nil {
			return nil, err
		}
		SortRequests(reqs)
		return RequestList(reqs, o.Now), nil
	case "label-list":
		comps, err := src.Components(ctx)
		if err != nil {
			return nil, err
		}
		return LabelList(comps), nil
	case "image-list":
		uploads, err := src.Uploads(ctx)
		if err != nil {
			return nil, err
		}
		return ImageList(uploads, o.Now), nil
	case "dib-image-list":
		builds, err := src.Builds(ctx)
		if err != nil {
			return nil, err
		}
		_, paused, err := imageNames(ctx, src, o.Config)
		if err != nil {
			return nil, err
		}
		return DibImageList(builds, paused, o.Now), nil
	case "image-status":
		names, paused, err := imageNames(ctx, src, o.Config)
		if err != nil {
			return nil, err
		}
		builds, err := src.Builds(ctx)
		if err != nil {
			return nil, err
		}
		pending, err := src.BuildRequests(ctx)
		if err != nil {
			return nil, err
		}
		return ImageStatus(ImageStatusInput{Names: names, Paused: paused, BuildRequests: pending, Builds: builds}, o.Now), nil
	}
	return nil, &unknownTableError{name}
}

// unknownTableError names a table there is not.
type unknownTableError struct{ name string }

func (e *unknownTableError) Error() string {
	return fmt.Sprintf("no table %q; expected one of: %s", e.name, strings.Join(Tables, ", "))
}

// liveness reads the live components once.
func liveness(ctx context.Context, src Source) (Liveness, error) {
	comps, err := src.Components(ctx)
	if err != nil {
		return nil, err
	}
	live := make(map[string]bool, len(comps))
	for _, c := range comps {
		live[c.ID] = true
	}
	return func(id string) bool { return live[id] }, nil
}

// imageNames lists the images the configuration builds and those with a
// record, and which of them are paused (by image-pause or the
// configuration).
func imageNames(ctx context.Context, src Source, cfg *config.Config) ([]string, map[string]bool, error) {
	var names []string
	paused := map[string]bool{}
	if cfg != nil {
		for _, di := range cfg.Diskimages {
			if !di.Abstract {
				names = append(names, di.Name)
				paused[di.Name] = di.Pause
			}
		}
	}
	imgs, err := src.DiskImages(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range imgs {
		names = append(names, d.Name)
		paused[d.Name] = paused[d.Name] || d.Paused
	}
	slices.Sort(names)
	return slices.Compact(names), paused, nil
}

// BuildRequests counts the build triggers waiting in the builds stream,
// per image.
func BuildRequests(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	st, err := js.Stream(ctx, events.BuildsStream)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", events.BuildsStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.BuildsSubject))
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", events.BuildsStream, err)
	}
	out := map[string]int{}
	for subject, n := range info.State.Subjects {
		if image, err := events.ParseBuildSubject(subject); err == nil {
			out[image] = int(n)
		}
	}
	return out, nil
}

// Buckets reads the records from the buckets on every call (the CLI's
// source).
type Buckets struct {
	JS      jetstream.JetStream
	Buckets *kv.Buckets
}

// Nodes lists the node records.
func (b Buckets) Nodes(ctx context.Context) ([]*kv.Node, error) {
	nodes, err := b.Buckets.Nodes.Values(ctx)
	return Pointers(nodes), err
}

// Requests lists the request records.
func (b Buckets) Requests(ctx context.Context) ([]kv.Request, error) {
	return b.Buckets.Requests.Values(ctx)
}

// Components lists the live components.
func (b Buckets) Components(ctx context.Context) ([]kv.Component, error) {
	return b.Buckets.Components.Values(ctx)
}

// DiskImages lists the image records.
func (b Buckets) DiskImages(ctx context.Context) ([]kv.DiskImage, error) {
	es, err := kv.NewImageStores(b.Buckets.Images).Images.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]kv.DiskImage, len(es))
	for i, e := range es {
		out[i] = e.Value
		if out[i].Name == "" {
			out[i].Name = token.Decode(e.Key)
		}
	}
	return out, nil
}

// Builds lists the build records.
func (b Buckets) Builds(ctx context.Context) ([]kv.ImageBuild, error) {
	return kv.NewImageStores(b.Buckets.Images).Builds.Values(ctx)
}

// Uploads lists the upload records.
func (b Buckets) Uploads(ctx context.Context) ([]kv.ImageUpload, error) {
	return kv.NewImageStores(b.Buckets.Images).Uploads.Values(ctx)
}

// BuildRequests counts the waiting build triggers.
func (b Buckets) BuildRequests(ctx context.Context) (map[string]int, error) {
	return BuildRequests(ctx, b.JS)
}
