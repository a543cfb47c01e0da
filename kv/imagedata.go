package kv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Image data files, as `nodepool export-image-data` writes them.
const (
	ImageDataFormat  = "nodepool-image-data"
	ImageDataVersion = 1
)

// ImageData is every record of the nodepool-images bucket: the images
// (pause, id counters), their builds and their uploads. Exported and
// imported again, it lets a rebuilt cluster keep its builds and the
// providers' image ids (the image files themselves are not in it).
type ImageData struct {
	Format   string        `json:"format"`
	Version  int           `json:"version"`
	Exported time.Time     `json:"exported"`
	Images   []DiskImage   `json:"images"`
	Builds   []ImageBuild  `json:"builds"`
	Uploads  []ImageUpload `json:"uploads"`
}

var (
	imageDataNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
	imageDataIDRE   = regexp.MustCompile(`^[0-9]{1,20}$`)
)

// imageDataStates are the states a build or an upload may have.
var imageDataStates = []ImageState{ImageBuilding, ImageUploading, ImageReady, ImageFailed, ImageDeleting, ImageDeleted}

// ParseImageData reads an image data file and checks every record: its
// names and ids must be ones the bucket's keys can hold, its states known,
// and no key may appear twice. The error names the record and what was
// expected.
func ParseImageData(data []byte) (*ImageData, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d ImageData
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("not an image data file (JSON as nodepool export-image-data writes it): %w", err)
	}
	if dec.More() {
		return nil, errors.New("not an image data file: more than one JSON document")
	}
	if d.Format != ImageDataFormat || d.Version != ImageDataVersion {
		return nil, fmt.Errorf("format %q version %d; expected %q version %d", d.Format, d.Version, ImageDataFormat, ImageDataVersion)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	name := func(what, s string) bool {
		if len(s) > 64 || !imageDataNameRE.MatchString(s) {
			bad("%s %q: expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots", what, s)
			return false
		}
		return true
	}
	id := func(what, s string) bool {
		if !imageDataIDRE.MatchString(s) {
			bad("%s %q: expected a numeric id such as 0000000001", what, s)
			return false
		}
		return true
	}
	state := func(what string, s ImageState) {
		if !slices.Contains(imageDataStates, s) {
			bad("%s: state %q; expected one of building, uploading, ready, failed, deleting, deleted", what, s)
		}
	}
	seen := map[string]bool{}
	dup := func(key string) {
		if seen[key] {
			bad("record %s appears twice", key)
		}
		seen[key] = true
	}
	for i, img := range d.Images {
		if name(fmt.Sprintf("images[%d]: name", i), img.Name) {
			dup(DiskImageKey(img.Name))
		}
	}
	for i, b := range d.Builds {
		what := fmt.Sprintf("builds[%d]", i)
		okName, okID := name(what+": image", b.Image), id(what+": id", b.ID)
		state(what, b.State)
		if okName && okID {
			dup(b.Key())
		}
	}
	for i, u := range d.Uploads {
		what := fmt.Sprintf("uploads[%d]", i)
		ok := name(what+": image", u.Image)
		ok = id(what+": build_id", u.BuildID) && ok
		ok = name(what+": provider", u.Provider) && ok
		ok = id(what+": id", u.ID) && ok
		state(what, u.State)
		if ok {
			dup(u.Key())
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("image data file is not valid:\n  %s", strings.Join(problems, "\n  "))
	}
	return &d, nil
}
