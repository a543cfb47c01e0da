package openstack

import (
	"crypto/md5"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	diskFormats      = []string{"ami", "ari", "aki", "vhd", "vhdx", "vmdk", "raw", "qcow2", "vdi", "iso", "ploop"}
	containerFormats = []string{"ami", "ari", "aki", "bare", "ovf", "ova", "docker", "compressed"}
	visibilities     = []string{"public", "private", "shared", "community"}
)

func (c *Cloud) imageRoutes() {
	m := c.mux
	m.HandleFunc("GET /image", c.imageVersions(http.StatusMultipleChoices))
	m.HandleFunc("GET /image/{$}", c.imageVersions(http.StatusMultipleChoices))
	m.HandleFunc("GET /image/versions", c.imageVersions(http.StatusOK))
	m.HandleFunc("GET /image/v2/images", c.locked(c.listImages))
	m.HandleFunc("POST /image/v2/images", c.locked(c.createImage))
	m.HandleFunc("GET /image/v2/images/{id}", c.locked(c.withImage(c.showImage)))
	m.HandleFunc("PATCH /image/v2/images/{id}", c.locked(c.withImage(c.patchImage)))
	m.HandleFunc("DELETE /image/v2/images/{id}", c.locked(c.withImage(c.deleteImage)))
	m.HandleFunc("PUT /image/v2/images/{id}/file", c.uploadImage)
	m.HandleFunc("GET /image/v2/images/{id}/file", c.locked(c.withImage(func(w http.ResponseWriter, _ *http.Request, _ time.Time, _ *image) {
		w.WriteHeader(http.StatusNoContent) // the dev cloud keeps no image data
	})))
	m.HandleFunc("PUT /image/v2/images/{id}/tags/{tag}", c.locked(c.withImage(c.imageTag)))
	m.HandleFunc("DELETE /image/v2/images/{id}/tags/{tag}", c.locked(c.withImage(c.imageTag)))
}

func (c *Cloud) imageVersions(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var vs []any
		for i, id := range []string{"v2.16", "v2.15", "v2.9", "v2.7", "v2.6", "v2.5", "v2.4", "v2.3", "v2.2", "v2.1", "v2.0"} {
			st := "SUPPORTED"
			if i == 0 {
				st = "CURRENT"
			}
			vs = append(vs, map[string]any{"id": id, "status": st, "links": []any{map[string]any{"rel": "self", "href": base(r) + "/image/v2/"}}})
		}
		writeJSON(w, status, map[string]any{"versions": vs})
	}
}

func (c *Cloud) withImage(h func(w http.ResponseWriter, r *http.Request, now time.Time, img *image)) func(http.ResponseWriter, *http.Request, time.Time) {
	return withID(func(id string) (*image, bool) { img, ok := c.st.images[id]; return img, ok },
		func(w http.ResponseWriter, id string) {
			glanceError(w, http.StatusNotFound, "No image found with ID "+id)
		}, h)
}

// reservedImageKeys are the image attributes that are not free properties.
var reservedImageKeys = []string{"id", "name", "status", "visibility", "protected", "os_hidden", "checksum", "os_hash_algo",
	"os_hash_value", "size", "virtual_size", "min_disk", "min_ram", "disk_format", "container_format", "owner", "tags",
	"created_at", "updated_at", "self", "file", "schema", "direct_url", "locations"}

func imageJSON(img *image) map[string]any {
	out := map[string]any{}
	for k, v := range img.props {
		out[k] = v
	}
	null := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var size any
	if img.status == "active" {
		size = img.size
	}
	var hashAlgo any
	if img.hashValue != "" {
		hashAlgo = "sha512"
	}
	for k, v := range map[string]any{
		"id": img.id, "name": null(img.name), "status": img.status, "visibility": img.visibility,
		"protected": img.protected, "os_hidden": false, "checksum": null(img.checksum),
		"os_hash_algo": hashAlgo, "os_hash_value": null(img.hashValue), "size": size, "virtual_size": nil,
		"min_disk": img.minDisk, "min_ram": img.minRAM, "disk_format": null(img.diskFormat),
		"container_format": null(img.containerFormat), "owner": img.owner, "tags": img.tags,
		"created_at": stamp(img.created), "updated_at": stamp(img.updated),
		"self": "/v2/images/" + img.id, "file": "/v2/images/" + img.id + "/file", "schema": "/v2/schemas/image",
	} {
		out[k] = v
	}
	return out
}

func (c *Cloud) listImages(w http.ResponseWriter, r *http.Request, _ time.Time) {
	q := r.URL.Query()
	limit, err := c.limitParam(r)
	if err != nil {
		glanceError(w, http.StatusBadRequest, "limit param must be an integer")
		return
	}
	control := map[string]bool{"limit": true, "marker": true, "sort": true, "sort_key": true, "sort_dir": true, "member_status": true}
	var list []*image
	for _, img := range c.st.images {
		if img.status == "deleted" {
			continue
		}
		match := true
		for k, vs := range q {
			if control[k] || len(vs) == 0 {
				continue
			}
			v := vs[0]
			switch k {
			case "id":
				if ids, ok := strings.CutPrefix(v, "in:"); ok {
					match = match && slices.Contains(strings.Split(ids, ","), img.id)
				} else {
					match = match && v == img.id
				}
			case "name":
				if names, ok := strings.CutPrefix(v, "in:"); ok {
					match = match && slices.Contains(strings.Split(names, ","), img.name)
				} else {
					match = match && v == img.name
				}
			case "status":
				match = match && v == img.status
			case "visibility":
				match = match && (v == "all" || v == img.visibility)
			case "owner":
				match = match && v == img.owner
			case "tag":
				match = match && slices.Contains(img.tags, v)
			case "disk_format":
				match = match && v == img.diskFormat
			case "container_format":
				match = match && v == img.containerFormat
			case "protected":
				match = match && v == strconv.FormatBool(img.protected)
			case "os_hidden":
				match = match && v == "false"
			default:
				match = match && img.props[k] == v
			}
		}
		if q.Get("visibility") == "" && img.visibility == "community" {
			match = false
		}
		if match {
			list = append(list, img)
		}
	}
	asc := q.Get("sort_dir") == "asc" || strings.HasSuffix(q.Get("sort"), ":asc")
	key := q.Get("sort_key")
	if s := q.Get("sort"); s != "" {
		key, _, _ = strings.Cut(s, ":")
	}
	slices.SortFunc(list, func(a, b *image) int {
		var x int
		switch key {
		case "name":
			x = strings.Compare(a.name, b.name)
		case "updated_at":
			x = a.updated.Compare(b.updated)
		default:
			x = a.created.Compare(b.created)
		}
		if x == 0 {
			x = strings.Compare(a.id, b.id)
		}
		if !asc {
			x = -x
		}
		return x
	})
	pg, more, ok := page(list, func(i *image) string { return i.id }, q.Get("marker"), limit)
	if !ok {
		glanceError(w, http.StatusBadRequest, "marker not found")
		return
	}
	out := []any{}
	for _, img := range pg {
		out = append(out, imageJSON(img))
	}
	body := map[string]any{"images": out, "first": "/v2/images", "schema": "/v2/schemas/images"}
	if more {
		q.Set("marker", pg[len(pg)-1].id)
		body["next"] = "/v2/images?" + q.Encode()
	}
	writeJSON(w, http.StatusOK, body)
}

// applyImageAttr sets one attribute of an image from a create body or a
// patch; it returns a message when the value is not valid.
func applyImageAttr(img *image, key string, raw any) string {
	str := func() (string, bool) { s, ok := raw.(string); return s, ok }
	switch key {
	case "name":
		s, ok := str()
		if !ok && raw != nil {
			return "Provided object does not match schema 'image': " + fmt.Sprint(raw) + " is not of type 'null', 'string'"
		}
		img.name = s
	case "visibility":
		s, _ := str()
		if !slices.Contains(visibilities, s) {
			return fmt.Sprintf("Invalid visibility value: %v", raw)
		}
		img.visibility = s
	case "disk_format":
		s, _ := str()
		if !slices.Contains(diskFormats, s) {
			return fmt.Sprintf("Provided object does not match schema 'image': '%v' is not one of %s", raw, strings.Join(diskFormats, ", "))
		}
		img.diskFormat = s
	case "container_format":
		s, _ := str()
		if !slices.Contains(containerFormats, s) {
			return fmt.Sprintf("Provided object does not match schema 'image': '%v' is not one of %s", raw, strings.Join(containerFormats, ", "))
		}
		img.containerFormat = s
	case "min_disk", "min_ram":
		f, ok := raw.(float64)
		if !ok || f < 0 {
			return fmt.Sprintf("Provided object does not match schema 'image': %v is not of type 'integer'", raw)
		}
		if key == "min_disk" {
			img.minDisk = int(f)
		} else {
			img.minRAM = int(f)
		}
	case "protected":
		b, ok := raw.(bool)
		if !ok {
			return fmt.Sprintf("Provided object does not match schema 'image': %v is not of type 'boolean'", raw)
		}
		img.protected = b
	case "tags":
		list, ok := raw.([]any)
		if !ok {
			return "Provided object does not match schema 'image': tags is not of type 'array'"
		}
		img.tags = []string{}
		for _, t := range list {
			s, _ := t.(string)
			img.tags = append(img.tags, s)
		}
	case "os_hidden", "id":
	default:
		if slices.Contains(reservedImageKeys, key) {
			return fmt.Sprintf("Attribute '%s' is read-only.", key)
		}
		s, ok := str()
		if !ok {
			return fmt.Sprintf("Provided object does not match schema 'image': %v is not of type 'string'", raw)
		}
		if len(key) > 255 || len(s) > 65535 {
			return "Provided object does not match schema 'image': property too long"
		}
		img.props[key] = s
	}
	return ""
}

func (c *Cloud) createImage(w http.ResponseWriter, r *http.Request, now time.Time) {
	var body map[string]any
	if err := readJSON(r, &body); err != nil {
		glanceError(w, http.StatusBadRequest, "Body expected in request.")
		return
	}
	img := &image{id: newID(), status: "queued", visibility: "shared", props: map[string]string{}, tags: []string{},
		created: now, updated: now, owner: c.st.projectID}
	if id, ok := body["id"].(string); ok && id != "" {
		if _, dup := c.st.images[id]; dup {
			glanceError(w, http.StatusConflict, "Image with identifier "+id+" already exists!")
			return
		}
		img.id = id
	}
	keys := make([]string, 0, len(body))
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if msg := applyImageAttr(img, k, body[k]); msg != "" {
			status := http.StatusBadRequest
			if strings.Contains(msg, "read-only") {
				status = http.StatusForbidden
			}
			glanceError(w, status, msg)
			return
		}
	}
	c.st.images[img.id] = img
	w.Header().Set("Location", base(r)+"/image/v2/images/"+img.id)
	writeJSON(w, http.StatusCreated, imageJSON(img))
}

func (c *Cloud) showImage(w http.ResponseWriter, _ *http.Request, _ time.Time, img *image) {
	writeJSON(w, http.StatusOK, imageJSON(img))
}

func (c *Cloud) patchImage(w http.ResponseWriter, r *http.Request, now time.Time, img *image) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openstack-images-v2.1-json-patch") && !strings.HasPrefix(ct, "application/openstack-images-v2.0-json-patch") {
		glanceError(w, http.StatusUnsupportedMediaType, "Unsupported Content-Type")
		return
	}
	var ops []struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	if err := readJSON(r, &ops); err != nil {
		glanceError(w, http.StatusBadRequest, "Body expected in request.")
		return
	}
	next := *img
	next.props = map[string]string{}
	for k, v := range img.props {
		next.props[k] = v
	}
	for _, op := range ops {
		key := strings.TrimPrefix(op.Path, "/")
		switch op.Op {
		case "add", "replace":
			if msg := applyImageAttr(&next, key, op.Value); msg != "" {
				glanceError(w, http.StatusBadRequest, msg)
				return
			}
		case "remove":
			if _, ok := next.props[key]; !ok {
				glanceError(w, http.StatusConflict, "Property "+key+" does not exist.")
				return
			}
			delete(next.props, key)
		default:
			glanceError(w, http.StatusBadRequest, "Unable to find '"+op.Op+"' operation")
			return
		}
	}
	next.updated = now
	*img = next
	writeJSON(w, http.StatusOK, imageJSON(img))
}

func (c *Cloud) deleteImage(w http.ResponseWriter, _ *http.Request, _ time.Time, img *image) {
	if img.protected {
		glanceError(w, http.StatusForbidden, "Image "+img.id+" is protected and cannot be deleted.")
		return
	}
	delete(c.st.images, img.id)
	w.WriteHeader(http.StatusNoContent)
}

func (c *Cloud) imageTag(w http.ResponseWriter, r *http.Request, now time.Time, img *image) {
	tag := r.PathValue("tag")
	if r.Method == http.MethodPut {
		if !slices.Contains(img.tags, tag) {
			img.tags = append(img.tags, tag)
		}
	} else {
		i := slices.Index(img.tags, tag)
		if i < 0 {
			glanceError(w, http.StatusNotFound, "Tag "+tag+" not found")
			return
		}
		img.tags = slices.Delete(img.tags, i, i+1)
	}
	img.updated = now
	w.WriteHeader(http.StatusNoContent)
}

// uploadImage takes an image's data: the image goes to saving while the
// data streams in (outside the cloud's lock), then to active with its
// size and checksums.
func (c *Cloud) uploadImage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c.mu.Lock()
	img, ok := c.st.images[id]
	switch {
	case !ok:
		c.mu.Unlock()
		glanceError(w, http.StatusNotFound, "No image found with ID "+id)
		return
	case img.status != "queued":
		c.mu.Unlock()
		glanceError(w, http.StatusConflict, fmt.Sprintf("Image status transition from %s to saving is not allowed", img.status))
		return
	case img.diskFormat == "" || img.containerFormat == "":
		c.mu.Unlock()
		glanceError(w, http.StatusBadRequest, "Properties disk_format, container_format must be set prior to saving data.")
		return
	}
	img.status, img.updated = "saving", time.Now().UTC()
	c.mu.Unlock()

	md := md5.New()
	sh := sha512.New()
	n, err := io.Copy(io.MultiWriter(md, sh), r.Body)

	c.mu.Lock()
	defer c.mu.Unlock()
	img, ok = c.st.images[id]
	if !ok {
		glanceError(w, http.StatusGone, "Image "+id+" could not be found after upload. The image may have been deleted during the upload.")
		return
	}
	now := time.Now().UTC()
	if err != nil {
		img.status, img.updated = "queued", now
		glanceError(w, http.StatusBadRequest, "Error in store configuration. Adding images to store is disabled.")
		return
	}
	img.status, img.size, img.updated = "active", n, now
	img.checksum, img.hashValue = hex.EncodeToString(md.Sum(nil)), hex.EncodeToString(sh.Sum(nil))
	w.WriteHeader(http.StatusNoContent)
}
