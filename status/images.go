package status

import (
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// DibImageColumns are dib-image-list's fields: Nodepool's six, then this
// project's own.
var DibImageColumns = []Column{
	{"id", "ID"}, {"image", "Image"}, {"builder", "Builder"}, {"formats", "Formats"}, {"state", "State"}, {"age", "Age"},
	// Extensions.
	{"size", "Size"}, {"reason", "Reason"},
}

// DibImageList lists builds by key. A build of a paused image shows the
// state paused, as in Nodepool.
func DibImageList(builds []kv.ImageBuild, paused map[string]bool, now time.Time) *Table {
	builds = slices.Clone(builds)
	slices.SortFunc(builds, func(x, y kv.ImageBuild) int { return strings.Compare(x.Key(), y.Key()) })
	t := &Table{Columns: DibImageColumns}
	for _, b := range builds {
		state := string(b.State)
		if paused[b.Image] {
			state = "paused"
		}
		t.Rows = append(t.Rows, []Cell{
			text(b.Image + "-" + b.ID), text(b.Image), text(b.Builder), list(b.Formats), text(state), stamp(b.StateTime, now),
			size(b.Size), text(b.Reason),
		})
	}
	return t
}

// ImageColumns are image-list's fields: Nodepool's eight, then this
// project's own.
var ImageColumns = []Column{
	{"id", "Build ID"}, {"upload_id", "Upload ID"}, {"provider", "Provider"}, {"image", "Image"},
	{"external_name", "Provider Image Name"}, {"external_id", "Provider Image ID"}, {"state", "State"}, {"age", "Age"},
	// Extensions.
	{"format", "Format"}, {"reason", "Reason"},
}

// ImageList lists uploads by key.
func ImageList(uploads []kv.ImageUpload, now time.Time) *Table {
	uploads = slices.Clone(uploads)
	slices.SortFunc(uploads, func(x, y kv.ImageUpload) int { return strings.Compare(x.Key(), y.Key()) })
	t := &Table{Columns: ImageColumns}
	for _, u := range uploads {
		t.Rows = append(t.Rows, []Cell{
			text(u.BuildID), text(u.ID), text(u.Provider), text(u.Image),
			text(u.ExternalName), text(u.ExternalID), text(string(u.State)), stamp(u.StateTime, now),
			text(u.Format), text(u.Reason),
		})
	}
	return t
}

// ImageStatusColumns are image-status's fields.
var ImageStatusColumns = []Column{
	{"image", "Image"}, {"paused", "Paused"}, {"build_request", "Build Request"},
	{"build_id", "Build ID"}, {"state", "State"}, {"age", "Age"},
}

// ImageStatusInput is what image-status reports on.
type ImageStatusInput struct {
	// Names are the images to report: configured ones and those with
	// records.
	Names []string
	// Paused images (by image-pause or the configuration).
	Paused map[string]bool
	// BuildRequests counts the build triggers waiting per image.
	BuildRequests map[string]int
	Builds        []kv.ImageBuild
}

// ImageStatus shows per image whether it is paused, how many build
// requests wait, and its newest build.
func ImageStatus(in ImageStatusInput, now time.Time) *Table {
	names := slices.Clone(in.Names)
	newest := map[string]kv.ImageBuild{}
	for _, b := range in.Builds {
		if !slices.Contains(names, b.Image) {
			names = append(names, b.Image)
		}
		if n, ok := newest[b.Image]; !ok || b.ID > n.ID {
			newest[b.Image] = b
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	t := &Table{Columns: ImageStatusColumns}
	for _, name := range names {
		row := []Cell{text(name), boolean(in.Paused[name]), number(in.BuildRequests[name])}
		if b, ok := newest[name]; ok {
			row = append(row, text(b.ID), text(string(b.State)), stamp(b.StateTime, now))
		} else {
			row = append(row, text(""), text(""), stamp(time.Time{}, now))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}
