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
	var c imageDataCheck
	c.images(d.Images)
	c.builds(d.Builds)
	c.uploads(d.Uploads)
	if len(c.problems) > 0 {
		return nil, fmt.Errorf("image data file is not valid:\n  %s", strings.Join(c.problems, "\n  "))
	}
	return &d, nil
}

// imageDataCheck gathers what is wrong with the records of an image data
// file.
type imageDataCheck struct {
	problems []string
	seen     map[string]bool // keys of the records checked so far
}

func (c *imageDataCheck) bad(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *imageDataCheck) name(what, s string) bool {
	if len(s) > 64 || !imageDataNameRE.MatchString(s) {
		c.bad("%s %q: expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots", what, s)
		return false
	}
	return true
}

func (c *imageDataCheck) id(what, s string) bool {
	if !imageDataIDRE.MatchString(s) {
		c.bad("%s %q: expected a numeric id such as 0000000001", what, s)
		return false
	}
	return true
}

func (c *imageDataCheck) state(what string, s ImageState) {
	if !slices.Contains(imageDataStates, s) {
		c.bad("%s: state %q; expected one of building, uploading, ready, failed, deleting, deleted", what, s)
	}
}

func (c *imageDataCheck) dup(key string) {
	if c.seen == nil {
		c.seen = map[string]bool{}
	}
	if c.seen[key] {
		c.bad("record %s appears twice", key)
	}
	c.seen[key] = true
}

func (c *imageDataCheck) images(images []DiskImage) {
	for i, img := range images {
		if c.name(fmt.Sprintf("images[%d]: name", i), img.Name) {
			c.dup(DiskImageKey(img.Name))
		}
	}
}

func (c *imageDataCheck) builds(builds []ImageBuild) {
	for i, b := range builds {
		what := fmt.Sprintf("builds[%d]", i)
		okName, okID := c.name(what+": image", b.Image), c.id(what+": id", b.ID)
		c.state(what, b.State)
		if okName && okID {
			c.dup(b.Key())
		}
	}
}

func (c *imageDataCheck) uploads(uploads []ImageUpload) {
	for i, u := range uploads {
		what := fmt.Sprintf("uploads[%d]", i)
		ok := c.name(what+": image", u.Image)
		ok = c.id(what+": build_id", u.BuildID) && ok
		ok = c.name(what+": provider", u.Provider) && ok
		ok = c.id(what+": id", u.ID) && ok
		c.state(what, u.State)
		if ok {
			c.dup(u.Key())
		}
	}
}
