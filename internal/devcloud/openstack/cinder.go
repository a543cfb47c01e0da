package openstack

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

func (c *Cloud) volumeRoutes() {
	m := c.mux
	m.HandleFunc("GET /volume", c.volumeVersions)
	m.HandleFunc("GET /volume/{$}", c.volumeVersions)
	m.HandleFunc("GET /volume/v3", c.volumeVersion)
	m.HandleFunc("GET /volume/v3/{$}", c.volumeVersion)
	h := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) {
		m.HandleFunc(pattern, c.locked(func(w http.ResponseWriter, r *http.Request, now time.Time) {
			if r.PathValue("project") != c.st.projectID {
				novaError(w, http.StatusForbidden, "Policy doesn't allow volume_extension:quotas:show to be performed.")
				return
			}
			w.Header().Set("OpenStack-API-Version", "volume 3.0")
			fn(w, r, now)
		}))
	}
	h("GET /volume/v3/{project}/volumes", c.listVolumes(false))
	h("GET /volume/v3/{project}/volumes/detail", c.listVolumes(true))
	h("POST /volume/v3/{project}/volumes", c.createVolume)
	h("GET /volume/v3/{project}/volumes/{id}", c.withVolume(c.showVolume))
	h("DELETE /volume/v3/{project}/volumes/{id}", c.withVolume(c.deleteVolume))
	h("GET /volume/v3/{project}/limits", c.volumeLimits)
}

func (c *Cloud) volumeVersionJSON(r *http.Request) map[string]any {
	return map[string]any{"id": "v3.0", "status": "CURRENT", "version": "3.70", "min_version": "3.0",
		"updated": "2023-08-31T00:00:00Z", "links": []any{map[string]any{"rel": "self", "href": base(r) + "/volume/v3/"}},
		"media-types": []any{map[string]any{"base": "application/json", "type": "application/vnd.openstack.volume+json;version=3"}}}
}

func (c *Cloud) volumeVersions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusMultipleChoices, map[string]any{"versions": []any{c.volumeVersionJSON(r)}})
}

func (c *Cloud) volumeVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"versions": []any{c.volumeVersionJSON(r)}})
}

func (c *Cloud) withVolume(h func(w http.ResponseWriter, r *http.Request, now time.Time, v *volume)) func(http.ResponseWriter, *http.Request, time.Time) {
	return withID(func(id string) (*volume, bool) { v, ok := c.st.volumes[id]; return v, ok },
		func(w http.ResponseWriter, id string) {
			novaError(w, http.StatusNotFound, fmt.Sprintf("Volume %s could not be found.", id))
		}, h)
}

func (c *Cloud) volumeJSON(r *http.Request, v *volume, detail bool) map[string]any {
	links := []any{
		map[string]any{"rel": "self", "href": base(r) + "/volume/v3/" + c.st.projectID + "/volumes/" + v.id},
		map[string]any{"rel": "bookmark", "href": base(r) + "/volume/" + c.st.projectID + "/volumes/" + v.id},
	}
	var name any
	if v.name != "" {
		name = v.name
	}
	if !detail {
		return map[string]any{"id": v.id, "name": name, "links": links}
	}
	attachments := []any{}
	if v.serverID != "" {
		attachments = append(attachments, map[string]any{"server_id": v.serverID, "attachment_id": v.attachID,
			"attached_at": stampMicro(v.attachedAt), "host_name": nil, "volume_id": v.id, "device": v.device, "id": v.id})
	}
	bootable := "false"
	if v.imageID != "" {
		bootable = "true"
	}
	var desc, source any
	if v.description != "" {
		desc = v.description
	}
	out := map[string]any{"id": v.id, "name": name, "links": links, "status": v.status, "size": v.size,
		"availability_zone": v.az, "created_at": stampMicro(v.created), "updated_at": stampMicro(v.updated),
		"attachments": attachments, "bootable": bootable, "encrypted": false, "metadata": v.metadata,
		"volume_type": "lvmdriver-1", "snapshot_id": nil, "source_volid": source, "user_id": c.st.userID,
		"os-vol-tenant-attr:tenant_id": c.st.projectID, "description": desc, "multiattach": false,
		"replication_status": nil, "consistencygroup_id": nil, "migration_status": nil}
	if v.imageID != "" {
		out["volume_image_metadata"] = map[string]any{"image_id": v.imageID}
	}
	return out
}

func (c *Cloud) listVolumes(detail bool) func(http.ResponseWriter, *http.Request, time.Time) {
	return func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		q := r.URL.Query()
		limit, err := c.limitParam(r)
		if err != nil {
			novaError(w, http.StatusBadRequest, "Invalid input received: "+err.Error())
			return
		}
		var meta map[string]string
		if m := q.Get("metadata"); m != "" {
			// Cinder takes metadata={'k': 'v'} (a Python literal) or JSON.
			if err := json.Unmarshal([]byte(strings.ReplaceAll(m, "'", `"`)), &meta); err != nil {
				novaError(w, http.StatusBadRequest, "Invalid input received: metadata filter must be a dict")
				return
			}
		}
		var list []*volume
		for _, v := range c.st.volumes {
			if n := q.Get("name"); n != "" && n != v.name {
				continue
			}
			if s := q.Get("status"); s != "" && s != v.status {
				continue
			}
			ok := true
			for k, want := range meta {
				ok = ok && v.metadata[k] == want
			}
			if ok {
				list = append(list, v)
			}
		}
		slices.SortFunc(list, func(a, b *volume) int {
			if x := b.created.Compare(a.created); x != 0 {
				return x
			}
			return strings.Compare(b.id, a.id)
		})
		pg, more, ok := page(list, func(v *volume) string { return v.id }, q.Get("marker"), limit)
		if !ok {
			novaError(w, http.StatusNotFound, fmt.Sprintf("Marker %s could not be found.", q.Get("marker")))
			return
		}
		out := []any{}
		for _, v := range pg {
			out = append(out, c.volumeJSON(r, v, detail))
		}
		body := map[string]any{"volumes": out}
		if more {
			body["volumes_links"] = []any{map[string]any{"rel": "next", "href": nextLink(r, "", pg[len(pg)-1].id)}}
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// volumeQuota says why a new volume of size GiB does not fit ("" if it
// does), as Cinder words it.
func (c *Cloud) volumeQuota(size int) string {
	_, _, _, vols, gigs, _ := c.st.usage()
	q := c.quota
	switch {
	case q.Volumes >= 0 && vols+1 > q.Volumes:
		return fmt.Sprintf("VolumeLimitExceeded: Maximum number of volumes allowed (%d) exceeded for quota 'volumes'.", q.Volumes)
	case q.Gigabytes >= 0 && gigs+size > q.Gigabytes:
		return fmt.Sprintf("VolumeSizeExceedsAvailableQuota: Requested volume or snapshot exceeds allowed gigabytes quota. Requested %dG, quota is %dG and %dG has been consumed.", size, q.Gigabytes, gigs)
	}
	return ""
}

func (c *Cloud) createVolume(w http.ResponseWriter, r *http.Request, now time.Time) {
	var body struct {
		Volume struct {
			Size             int               `json:"size"`
			Name             string            `json:"name"`
			Description      string            `json:"description"`
			ImageRef         string            `json:"imageRef"`
			AvailabilityZone string            `json:"availability_zone"`
			Metadata         map[string]string `json:"metadata"`
		} `json:"volume"`
	}
	if err := readJSON(r, &body); err != nil {
		novaError(w, http.StatusBadRequest, "Invalid input received: "+err.Error())
		return
	}
	req := body.Volume
	if req.Size < 1 {
		novaError(w, http.StatusBadRequest, fmt.Sprintf("Invalid input for field/attribute size. Value: %d. %d is less than the minimum of 1", req.Size, req.Size))
		return
	}
	if req.ImageRef != "" {
		img, ok := c.st.images[req.ImageRef]
		if !ok || img.status != "active" {
			novaError(w, http.StatusBadRequest, "Invalid image identifier or unable to access requested image. (HTTP 400)")
			return
		}
	}
	az := req.AvailabilityZone
	if az == "" {
		az = c.opts.AvailabilityZones[0]
	} else if !slices.Contains(c.opts.AvailabilityZones, az) {
		novaError(w, http.StatusBadRequest, "Invalid input received: Availability zone '"+az+"' is invalid.")
		return
	}
	if msg := c.volumeQuota(req.Size); msg != "" {
		w.Header().Set("Retry-After", "0")
		novaError(w, http.StatusRequestEntityTooLarge, msg)
		return
	}
	v := &volume{id: newID(), name: req.Name, description: req.Description, status: "creating", size: req.Size, az: az,
		imageID: req.ImageRef, metadata: map[string]string{}, created: now, updated: now, readyAt: now.Add(c.volumeTime)}
	for k, val := range req.Metadata {
		v.metadata[k] = val
	}
	if c.volumeTime <= 0 {
		v.status = "available"
	}
	c.st.volumes[v.id] = v
	writeJSON(w, http.StatusAccepted, map[string]any{"volume": c.volumeJSON(r, v, true)})
}

func (c *Cloud) showVolume(w http.ResponseWriter, r *http.Request, _ time.Time, v *volume) {
	writeJSON(w, http.StatusOK, map[string]any{"volume": c.volumeJSON(r, v, true)})
}

func (c *Cloud) deleteVolume(w http.ResponseWriter, _ *http.Request, now time.Time, v *volume) {
	switch v.status {
	case "available", "error":
	case "deleting":
		w.WriteHeader(http.StatusAccepted)
		return
	default:
		novaError(w, http.StatusBadRequest, "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots or be disassociated from snapshots after volume transfer.")
		return
	}
	v.status, v.updated, v.goneAt = "deleting", now, now.Add(c.volumeTime)
	if c.volumeTime <= 0 {
		delete(c.st.volumes, v.id)
	}
	w.WriteHeader(http.StatusAccepted)
}

func (c *Cloud) volumeLimits(w http.ResponseWriter, _ *http.Request, _ time.Time) {
	_, _, _, vols, gigs, _ := c.st.usage()
	q := c.quota
	writeJSON(w, http.StatusOK, map[string]any{"limits": map[string]any{"rate": []any{}, "absolute": map[string]any{
		"maxTotalVolumes": q.Volumes, "maxTotalVolumeGigabytes": q.Gigabytes, "totalVolumesUsed": vols,
		"totalGigabytesUsed": gigs, "maxTotalSnapshots": 10, "totalSnapshotsUsed": 0, "maxTotalBackups": 10,
		"totalBackupsUsed": 0, "maxTotalBackupGigabytes": 1000, "totalBackupGigabytesUsed": 0,
	}}})
}
