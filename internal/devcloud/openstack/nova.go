package openstack

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

func (c *Cloud) computeRoutes() {
	m := c.mux
	m.HandleFunc("GET /compute", c.computeVersions)
	m.HandleFunc("GET /compute/{$}", c.computeVersions)
	m.HandleFunc("GET /compute/v2.1", c.computeVersion)
	m.HandleFunc("GET /compute/v2.1/{$}", c.computeVersion)
	h := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) {
		m.HandleFunc(pattern, c.microversioned(c.locked(fn)))
	}
	h("GET /compute/v2.1/servers", c.listServers(false))
	h("GET /compute/v2.1/servers/detail", c.listServers(true))
	h("POST /compute/v2.1/servers", c.createServer)
	h("GET /compute/v2.1/servers/{id}", c.withServer(c.showServer))
	h("DELETE /compute/v2.1/servers/{id}", c.withServer(c.deleteServer))
	h("POST /compute/v2.1/servers/{id}/action", c.withServer(c.serverAction))
	h("GET /compute/v2.1/servers/{id}/metadata", c.withServer(c.showMetadata))
	h("POST /compute/v2.1/servers/{id}/metadata", c.withServer(c.updateMetadata(false)))
	h("PUT /compute/v2.1/servers/{id}/metadata", c.withServer(c.updateMetadata(true)))
	h("GET /compute/v2.1/servers/{id}/metadata/{key}", c.withServer(c.metadataItem))
	h("PUT /compute/v2.1/servers/{id}/metadata/{key}", c.withServer(c.metadataItem))
	h("DELETE /compute/v2.1/servers/{id}/metadata/{key}", c.withServer(c.metadataItem))
	h("GET /compute/v2.1/servers/{id}/os-volume_attachments", c.withServer(c.volumeAttachments))
	h("GET /compute/v2.1/flavors", c.listFlavors(false))
	h("GET /compute/v2.1/flavors/detail", c.listFlavors(true))
	h("GET /compute/v2.1/flavors/{id}", c.showFlavor)
	h("GET /compute/v2.1/flavors/{id}/os-extra_specs", func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		writeJSON(w, http.StatusOK, map[string]any{"extra_specs": map[string]any{}})
	})
	h("GET /compute/v2.1/limits", c.computeLimits)
	h("GET /compute/v2.1/os-availability-zone", c.availabilityZones)
	h("GET /compute/v2.1/os-availability-zone/detail", c.availabilityZones)
	h("GET /compute/v2.1/os-keypairs", c.listKeypairs)
	h("POST /compute/v2.1/os-keypairs", c.createKeypair)
	h("GET /compute/v2.1/os-keypairs/{name}", c.keypairItem)
	h("DELETE /compute/v2.1/os-keypairs/{name}", c.keypairItem)
}

// microversion is a compute API microversion (2.x).
type microversion int

func (c *Cloud) computeVersionJSON(r *http.Request) map[string]any {
	return map[string]any{
		"id": "v2.1", "status": "CURRENT", "version": MaxMicroversion, "min_version": "2.1",
		"updated": "2013-07-23T11:33:21Z",
		"links": []any{
			map[string]any{"rel": "self", "href": base(r) + "/compute/v2.1/"},
			map[string]any{"rel": "describedby", "type": "text/html", "href": "http://docs.openstack.org/"},
		},
		"media-types": []any{map[string]any{"base": "application/json", "type": "application/vnd.openstack.compute+json;version=2.1"}},
	}
}

func (c *Cloud) computeVersions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"versions": []any{c.computeVersionJSON(r)}})
}

func (c *Cloud) computeVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"version": c.computeVersionJSON(r)})
}

// microversioned reads the microversion a call asks for (2.1 when it
// names none), refuses one out of range with 406, and says in the
// response which one served it.
func (c *Cloud) microversioned(h http.HandlerFunc) http.HandlerFunc {
	maxMinor, _ := strconv.Atoi(strings.TrimPrefix(MaxMicroversion, "2."))
	return func(w http.ResponseWriter, r *http.Request) {
		asked := r.Header.Get("X-OpenStack-Nova-API-Version")
		if v := r.Header.Get("OpenStack-API-Version"); v != "" {
			if svc, ver, ok := strings.Cut(strings.TrimSpace(v), " "); ok && svc == "compute" {
				asked = ver
			}
		}
		minor := 1
		switch asked = strings.TrimSpace(asked); asked {
		case "":
		case "latest":
			minor = maxMinor
		default:
			major, m, ok := strings.Cut(asked, ".")
			n, err := strconv.Atoi(m)
			if !ok || major != "2" || err != nil || n < 1 || n > maxMinor {
				novaError(w, http.StatusNotAcceptable, fmt.Sprintf("Version %s is not supported by the API. Minimum is 2.1 and maximum is %s.", asked, MaxMicroversion))
				return
			}
			minor = n
		}
		w.Header().Set("OpenStack-API-Version", fmt.Sprintf("compute 2.%d", minor))
		w.Header().Set("X-OpenStack-Nova-API-Version", fmt.Sprintf("2.%d", minor))
		w.Header().Set("Vary", "OpenStack-API-Version, X-OpenStack-Nova-API-Version")
		r.Header.Set("X-Devcloud-Microversion", strconv.Itoa(minor))
		h(w, r)
	}
}

func mv(r *http.Request) microversion {
	n, _ := strconv.Atoi(r.Header.Get("X-Devcloud-Microversion"))
	return microversion(max(n, 1))
}

// withServer finds the server a path names, or answers 404.
func (c *Cloud) withServer(h func(w http.ResponseWriter, r *http.Request, now time.Time, s *server)) func(http.ResponseWriter, *http.Request, time.Time) {
	return withID(func(id string) (*server, bool) { s, ok := c.st.servers[id]; return s, ok && s.live() },
		func(w http.ResponseWriter, id string) {
			novaError(w, http.StatusNotFound, fmt.Sprintf("Instance %s could not be found.", id))
		}, h)
}

func (c *Cloud) serverLinks(r *http.Request, id string) []any {
	return []any{
		map[string]any{"rel": "self", "href": base(r) + "/compute/v2.1/servers/" + id},
		map[string]any{"rel": "bookmark", "href": base(r) + "/compute/servers/" + id},
	}
}

// vmState is Nova's vm_state and power_state for a status.
func vmState(status string) (string, int) {
	switch status {
	case "ACTIVE":
		return "active", 1
	case "SHUTOFF":
		return "stopped", 4
	case "ERROR":
		return "error", 0
	case "DELETED":
		return "deleted", 0
	}
	return "building", 0
}

func (c *Cloud) serverJSON(r *http.Request, s *server) map[string]any {
	v := mv(r)
	vm, power := vmState(s.status)
	var task any
	if s.taskState != "" {
		task = s.taskState
	}
	addresses := map[string]any{}
	for _, pid := range s.ports {
		p := c.st.ports[pid]
		if p == nil {
			continue
		}
		n := c.st.networks[p.networkID]
		if n == nil {
			continue
		}
		list, _ := addresses[n.name].([]any)
		list = append(list, map[string]any{"version": 4, "addr": p.ip, "OS-EXT-IPS:type": "fixed", "OS-EXT-IPS-MAC:mac_addr": p.mac})
		for _, f := range c.st.fips {
			if f.portID == pid {
				list = append(list, map[string]any{"version": 4, "addr": f.address, "OS-EXT-IPS:type": "floating", "OS-EXT-IPS-MAC:mac_addr": p.mac})
			}
		}
		addresses[n.name] = list
	}
	var image any = ""
	if s.imageID != "" {
		image = map[string]any{"id": s.imageID, "links": []any{map[string]any{"rel": "bookmark", "href": base(r) + "/compute/images/" + s.imageID}}}
	}
	var flavor any = map[string]any{"id": s.flavor.ID, "links": []any{map[string]any{"rel": "bookmark", "href": base(r) + "/compute/flavors/" + s.flavor.ID}}}
	if v >= 47 {
		flavor = map[string]any{"vcpus": s.flavor.VCPUs, "ram": s.flavor.RAM, "disk": s.flavor.Disk, "ephemeral": 0, "swap": 0,
			"original_name": s.flavor.Name, "extra_specs": map[string]any{}}
	}
	var sgs []any
	for _, g := range s.secGroups {
		sgs = append(sgs, map[string]any{"name": g})
	}
	var vols []any
	for _, a := range s.volumes {
		vol := map[string]any{"id": a.volumeID}
		if v >= 3 {
			vol["delete_on_termination"] = a.deleteOnTermination
		}
		vols = append(vols, vol)
	}
	var launched, keyName any
	if !s.launchedAt.IsZero() {
		launched = stampMicro(s.launchedAt)
	}
	if s.keyName != "" {
		keyName = s.keyName
	}
	configDrive := ""
	if s.configDrive {
		configDrive = "True"
	}
	out := map[string]any{
		"id": s.id, "name": s.name, "status": s.status, "tenant_id": c.st.projectID, "user_id": c.st.userID,
		"metadata": s.metadata, "hostId": hostID(c.st.projectID, s.az), "image": image, "flavor": flavor,
		"created": stamp(s.created), "updated": stamp(s.updated), "addresses": addresses,
		"accessIPv4": "", "accessIPv6": "", "links": c.serverLinks(r, s.id), "OS-DCF:diskConfig": "MANUAL",
		"progress": 0, "OS-EXT-AZ:availability_zone": s.az, "config_drive": configDrive, "key_name": keyName,
		"OS-SRV-USG:launched_at": launched, "OS-SRV-USG:terminated_at": nil,
		"security_groups": sgs, "OS-EXT-STS:task_state": task, "OS-EXT-STS:vm_state": vm, "OS-EXT-STS:power_state": power,
		"os-extended-volumes:volumes_attached": orEmpty(vols),
	}
	if s.status == "BUILD" {
		out["progress"] = 0
	} else if s.status == "ACTIVE" {
		out["progress"] = 100
	}
	if v >= 9 {
		out["locked"] = false
	}
	if v >= 19 {
		out["description"] = nil
	}
	if v >= 26 {
		out["tags"] = []any{}
	}
	if v >= 73 {
		out["locked_reason"] = nil
	}
	if s.status == "ERROR" && s.fault != "" {
		out["fault"] = map[string]any{"code": 500, "created": stamp(s.updated), "message": s.fault,
			"details": "Traceback (most recent call last):\n  File \"/opt/stack/nova/nova/conductor/manager.py\", line 1654, in schedule_and_build_instances\n"}
	}
	return out
}

// hostID is Nova's hostId: a hash of the project and the compute host.
func hostID(project, host string) string {
	sum := sha256.Sum224([]byte(project + host))
	return hex.EncodeToString(sum[:])
}

func orEmpty(l []any) []any {
	if l == nil {
		return []any{}
	}
	return l
}

func (c *Cloud) listServers(detail bool) func(http.ResponseWriter, *http.Request, time.Time) {
	return func(w http.ResponseWriter, r *http.Request, now time.Time) {
		q := r.URL.Query()
		limit, err := c.limitParam(r)
		if err != nil {
			novaError(w, http.StatusBadRequest, "Invalid input for query parameters limit. Value: "+q.Get("limit")+". "+err.Error())
			return
		}
		var since time.Time
		if v := q.Get("changes-since"); v != "" {
			if since, err = parseTime(v); err != nil {
				novaError(w, http.StatusBadRequest, "Invalid input for query parameters changes-since. Value: "+v+". '"+v+"' is not a 'date-time'")
				return
			}
		}
		var nameRE *regexp.Regexp
		if v := q.Get("name"); v != "" {
			if nameRE, err = regexp.Compile(v); err != nil {
				nameRE = regexp.MustCompile(regexp.QuoteMeta(v))
			}
		}
		var list []*server
		for _, s := range c.st.servers {
			switch {
			case !s.live() && since.IsZero():
				continue
			case !since.IsZero() && s.updated.Before(since):
				continue
			case nameRE != nil && !nameRE.MatchString(s.name):
				continue
			case q.Get("status") != "" && !strings.EqualFold(q.Get("status"), s.status):
				continue
			case q.Get("availability_zone") != "" && q.Get("availability_zone") != s.az:
				continue
			case q.Get("image") != "" && q.Get("image") != s.imageID:
				continue
			case q.Get("flavor") != "" && q.Get("flavor") != s.flavor.ID:
				continue
			}
			list = append(list, s)
		}
		// Nova's default order: newest first, then by id.
		slices.SortFunc(list, func(a, b *server) int {
			if x := b.created.Compare(a.created); x != 0 {
				return x
			}
			return strings.Compare(b.id, a.id)
		})
		pg, more, ok := page(list, func(s *server) string { return s.id }, q.Get("marker"), limit)
		if !ok {
			novaError(w, http.StatusBadRequest, fmt.Sprintf("marker [%s] not found", q.Get("marker")))
			return
		}
		out := []any{}
		for _, s := range pg {
			if detail {
				out = append(out, c.serverJSON(r, s))
			} else {
				out = append(out, map[string]any{"id": s.id, "name": s.name, "links": c.serverLinks(r, s.id)})
			}
		}
		body := map[string]any{"servers": out}
		if more {
			body["servers_links"] = []any{map[string]any{"rel": "next", "href": nextLink(r, "", pg[len(pg)-1].id)}}
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// parseTime reads the ISO 8601 times of query parameters.
func parseTime(v string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("not a time")
}

func (c *Cloud) showServer(w http.ResponseWriter, r *http.Request, _ time.Time, s *server) {
	writeJSON(w, http.StatusOK, map[string]any{"server": c.serverJSON(r, s)})
}

// createRequest is the body of POST /servers.
type createRequest struct {
	Server struct {
		Name             string            `json:"name"`
		ImageRef         string            `json:"imageRef"`
		FlavorRef        string            `json:"flavorRef"`
		KeyName          string            `json:"key_name"`
		AvailabilityZone string            `json:"availability_zone"`
		UserData         string            `json:"user_data"`
		ConfigDrive      any               `json:"config_drive"`
		Metadata         map[string]string `json:"metadata"`
		SecurityGroups   []struct {
			Name string `json:"name"`
		} `json:"security_groups"`
		Networks any `json:"networks"`
		BDM      []struct {
			BootIndex           any    `json:"boot_index"`
			UUID                string `json:"uuid"`
			SourceType          string `json:"source_type"`
			DestinationType     string `json:"destination_type"`
			VolumeSize          int    `json:"volume_size"`
			DeleteOnTermination bool   `json:"delete_on_termination"`
		} `json:"block_device_mapping_v2"`
		MinCount int `json:"min_count"`
		MaxCount int `json:"max_count"`
	} `json:"server"`
}

func (c *Cloud) createServer(w http.ResponseWriter, r *http.Request, now time.Time) {
	var req createRequest
	if err := readJSON(r, &req); err != nil {
		novaError(w, http.StatusBadRequest, "Invalid JSON in request body: "+err.Error())
		return
	}
	rs := req.Server
	bad := func(format string, args ...any) { novaError(w, http.StatusBadRequest, fmt.Sprintf(format, args...)) }
	st := c.st
	if strings.TrimSpace(rs.Name) == "" || len(rs.Name) > 255 {
		bad("Invalid input for field/attribute name. Value: %s. '%s' does not match '^(?! )[[:print:]]{1,255}(?<! )$'", rs.Name, rs.Name)
		return
	}
	if rs.MaxCount > 1 || rs.MinCount > 1 {
		bad("This dev cloud boots one server per request (min_count and max_count must be 1).")
		return
	}
	var flavor *Flavor
	for i := range st.flavors {
		f := &st.flavors[i]
		if f.ID == rs.FlavorRef || strings.HasSuffix(rs.FlavorRef, "/flavors/"+f.ID) {
			flavor = f
		}
	}
	if flavor == nil {
		bad("Flavor %s could not be found.", rs.FlavorRef)
		return
	}
	fromVolume := len(rs.BDM) > 0
	imageID := rs.ImageRef
	if imageID != "" || !fromVolume {
		img, ok := st.images[imageID]
		if !ok || img.status != "active" {
			bad("Can not find requested image")
			return
		}
	}
	if rs.KeyName != "" {
		if _, ok := st.keypairs[rs.KeyName]; !ok {
			bad("Invalid key_name provided.")
			return
		}
	}
	az := rs.AvailabilityZone
	if az == "" {
		az = c.opts.AvailabilityZones[st.rng.IntN(len(c.opts.AvailabilityZones))]
	} else if !slices.Contains(c.opts.AvailabilityZones, az) {
		bad("The requested availability zone is not available")
		return
	}
	if rs.UserData != "" {
		data, err := base64.StdEncoding.DecodeString(rs.UserData)
		if err != nil {
			bad("User data needs to be valid base 64.")
			return
		}
		if len(data) > 65535 {
			bad("User data too large. User data must be no larger than 65535 bytes once base64 encoded. Your data is %d bytes", len(rs.UserData))
			return
		}
	}
	if len(rs.Metadata) > 128 {
		novaError(w, http.StatusForbidden, "Quota exceeded for metadata_items: Requested "+strconv.Itoa(len(rs.Metadata))+", but already used 0 of 128 metadata_items")
		return
	}
	for k, v := range rs.Metadata {
		if k == "" || len(k) > 255 || len(v) > 255 {
			bad("Invalid input for field/attribute metadata. Value: %s. keys and values must be 1 to 255 characters", k)
			return
		}
	}
	groups := []string{}
	for _, g := range rs.SecurityGroups {
		sg := st.securityGroup(g.Name)
		if sg == nil {
			bad("Unable to find security_group with name or id '%s'", g.Name)
			return
		}
		groups = append(groups, sg.name)
	}
	if len(groups) == 0 {
		groups = []string{"default"}
	}
	// Networks: "auto", "none", or a list of {"uuid"} / {"port"}.
	var nets []*network
	var ports []*port
	switch n := rs.Networks.(type) {
	case nil:
		if mv(r) >= 37 {
			bad("Invalid input for field/attribute server. Value: %v. 'networks' is a required property", "server")
			return
		}
		nets = st.projectNetworks()
	case string:
		switch n {
		case "auto":
			nets = st.projectNetworks()
		case "none":
		default:
			bad("Invalid input for field/attribute networks. Value: %s. '%s' is not one of ['none', 'auto']", n, n)
			return
		}
	case []any:
		for _, item := range n {
			m, _ := item.(map[string]any)
			if pid, _ := m["port"].(string); pid != "" {
				p := st.ports[pid]
				if p == nil {
					bad("Port %s could not be found.", pid)
					return
				}
				if p.deviceID != "" {
					novaError(w, http.StatusConflict, fmt.Sprintf("Port %s is still in use.", pid))
					return
				}
				ports = append(ports, p)
				continue
			}
			uuid, _ := m["uuid"].(string)
			net := st.networks[uuid]
			if net == nil {
				bad("Network %s could not be found.", uuid)
				return
			}
			nets = append(nets, net)
		}
	default:
		bad("Invalid input for field/attribute networks.")
		return
	}
	if len(nets) > 1 && rs.Networks == nil {
		novaError(w, http.StatusConflict, "Multiple possible networks found, use a Network ID to be more specific.")
		return
	}
	// Block devices: boot from an existing volume, or from an image onto
	// a new volume.
	var attach []volumeAttachment
	var newVolume *volume
	for _, b := range rs.BDM {
		switch {
		case b.SourceType == "volume" && b.DestinationType == "volume":
			v := st.volumes[b.UUID]
			if v == nil {
				bad("Block Device Mapping is Invalid: failed to get volume %s.", b.UUID)
				return
			}
			if v.status != "available" {
				bad("Block Device Mapping is Invalid: Volume %s status must be available, but current status is: %s.", v.id, v.status)
				return
			}
			attach = append(attach, volumeAttachment{volumeID: v.id, deleteOnTermination: b.DeleteOnTermination, attachmentID: newID()})
		case b.SourceType == "image" && b.DestinationType == "volume":
			img, ok := st.images[b.UUID]
			if !ok || img.status != "active" {
				bad("Block Device Mapping is Invalid: failed to get image %s.", b.UUID)
				return
			}
			if b.VolumeSize < 1 {
				bad("Block Device Mapping is Invalid: Boot sequence for the instance and image/block device mapping combination is not valid.")
				return
			}
			if msg := c.volumeQuota(b.VolumeSize); msg != "" {
				novaError(w, http.StatusForbidden, msg)
				return
			}
			newVolume = &volume{id: newID(), size: b.VolumeSize, az: az, imageID: img.id, metadata: map[string]string{},
				status: "in-use", created: now, updated: now, readyAt: now}
			attach = append(attach, volumeAttachment{volumeID: newVolume.id, deleteOnTermination: b.DeleteOnTermination, attachmentID: newID()})
		case b.SourceType == "image" && (b.DestinationType == "local" || b.DestinationType == ""):
			imageID = b.UUID
		default:
			bad("Block Device Mapping is Invalid: source_type %q with destination_type %q is not supported here.", b.SourceType, b.DestinationType)
			return
		}
	}
	if len(c.failCreates) > 0 {
		f := c.failCreates[0]
		c.failCreates = c.failCreates[1:]
		msg := f.message
		if msg == "" {
			msg = defaultFailure(f.status)
		}
		if f.status == http.StatusTooManyRequests || f.status == http.StatusRequestEntityTooLarge {
			w.Header().Set("Retry-After", "1")
		}
		novaError(w, f.status, msg)
		return
	}
	instances, cores, ram, _, _, _ := st.usage()
	q := c.quota
	switch {
	case q.Instances >= 0 && instances+1 > q.Instances:
		novaError(w, http.StatusForbidden, fmt.Sprintf("Quota exceeded for instances: Requested 1, but already used %d of %d instances", instances, q.Instances))
		return
	case q.Cores >= 0 && cores+flavor.VCPUs > q.Cores:
		novaError(w, http.StatusForbidden, fmt.Sprintf("Quota exceeded for cores: Requested %d, but already used %d of %d cores", flavor.VCPUs, cores, q.Cores))
		return
	case q.RAM >= 0 && ram+flavor.RAM > q.RAM:
		novaError(w, http.StatusForbidden, fmt.Sprintf("Quota exceeded for ram: Requested %d, but already used %d of %d ram", flavor.RAM, ram, q.RAM))
		return
	}

	s := &server{
		id: newID(), name: rs.Name, status: "BUILD", taskState: "spawning", flavor: *flavor, imageID: imageID,
		keyName: rs.KeyName, az: az, userData: rs.UserData, configDrive: truthy(rs.ConfigDrive),
		metadata: map[string]string{}, secGroups: groups, volumes: attach,
		created: now, updated: now, readyAt: now.Add(c.bootTime),
	}
	for k, v := range rs.Metadata {
		s.metadata[k] = v
	}
	if len(c.errorNext) > 0 {
		s.fault, c.errorNext = c.errorNext[0], c.errorNext[1:]
	} else if c.errorRate > 0 && st.rng.Float64() < c.errorRate {
		s.fault = FaultNoValidHost
	}
	for _, n := range nets {
		p := st.newPort(n, c.hostIP, now)
		p.byNova, p.deviceID, p.deviceOwner, p.status = true, s.id, "compute:"+az, "BUILD"
		p.secGroups = st.groupIDs(groups)
		s.ports = append(s.ports, p.id)
	}
	for _, p := range ports {
		p.deviceID, p.deviceOwner, p.status, p.updated = s.id, "compute:"+az, "BUILD", now
		p.revision++
		s.ports = append(s.ports, p.id)
	}
	if newVolume != nil {
		st.volumes[newVolume.id] = newVolume
	}
	for _, a := range attach {
		v := st.volumes[a.volumeID]
		v.status, v.serverID, v.attachID, v.attachedAt, v.device, v.updated = "in-use", s.id, a.attachmentID, now, "/dev/vda", now
	}
	s.consoleLines = []string{
		"[    0.000000] Linux version 6.1.0-21-amd64 (debian-kernel@lists.debian.org)",
		"[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz root=LABEL=cloudimg-rootfs ro console=ttyS0",
		fmt.Sprintf("[    1.523110] cloud-init[301]: Cloud-init v. 24.1 running 'init' at %s. Up 1.50 seconds.", now.Format(time.RFC1123)),
	}
	st.servers[s.id] = s
	c.stats.ServersCreated++
	w.Header().Set("Location", base(r)+"/compute/v2.1/servers/"+s.id)
	writeJSON(w, http.StatusAccepted, map[string]any{"server": map[string]any{
		"id": s.id, "links": c.serverLinks(r, s.id), "OS-DCF:diskConfig": "MANUAL",
		"security_groups": func() []any {
			var out []any
			for _, g := range groups {
				out = append(out, map[string]any{"name": g})
			}
			return out
		}(),
		"adminPass": randomHex(6),
	}})
}

// mayAct answers 409 as Nova does (its check_instance_state) unless the
// server is in one of the statuses an action starts from, with no task
// running.
func (c *Cloud) mayAct(w http.ResponseWriter, s *server, verb string, from ...string) bool {
	if s.taskState != "" {
		novaError(w, http.StatusConflict, fmt.Sprintf("Cannot '%s' instance %s while it is in task_state %s", verb, s.id, s.taskState))
		return false
	}
	if !slices.Contains(from, s.status) {
		vm, _ := vmState(s.status)
		novaError(w, http.StatusConflict, fmt.Sprintf("Cannot '%s' instance %s while it is in vm_state %s", verb, s.id, vm))
		return false
	}
	return true
}

// defaultFailure is Nova's message for an injected failure's status.
func defaultFailure(status int) string {
	switch status {
	case http.StatusForbidden, http.StatusRequestEntityTooLarge:
		return "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"
	case http.StatusConflict:
		return "Conflict updating instance. Expected: {'task_state': [None]}. Actual: {'task_state': 'deleting'}"
	case http.StatusServiceUnavailable:
		return "Service Unavailable"
	case http.StatusTooManyRequests:
		return "This request was rate-limited."
	}
	return "Unexpected API Error. Please report this at http://bugs.launchpad.net/nova/ and attach the Nova API log if possible.\n<class 'nova.exception.NovaException'>"
}

func truthy(v any) bool {
	switch t := v.(type) {
	case bool:
		return t
	case string:
		b, _ := strconv.ParseBool(t)
		return b
	}
	return false
}

// projectNetworks are the networks "auto" picks: those not external.
func (st *state) projectNetworks() []*network {
	var out []*network
	for _, n := range st.networks {
		if !n.external {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *network) int { return strings.Compare(a.name, b.name) })
	return out
}

func (st *state) securityGroup(ref string) *securityGroup {
	if g, ok := st.secgroup[ref]; ok {
		return g
	}
	for _, g := range st.secgroup {
		if g.name == ref {
			return g
		}
	}
	return nil
}

func (st *state) groupIDs(names []string) []string {
	var out []string
	for _, n := range names {
		if g := st.securityGroup(n); g != nil {
			out = append(out, g.id)
		}
	}
	return out
}

// newPort makes a port on a network with the next address of its first
// subnet (or hostIP).
func (st *state) newPort(n *network, hostIP string, now time.Time) *port {
	p := &port{id: newID(), networkID: n.id, mac: st.mac(), status: "DOWN", created: now, updated: now, revision: 1}
	if len(n.subnets) > 0 {
		sn := st.subnets[n.subnets[0]]
		p.subnetID, p.ip = sn.id, sn.nextIP()
	}
	if hostIP != "" {
		p.ip = hostIP
	}
	p.secGroups = st.groupIDs([]string{"default"})
	st.ports[p.id] = p
	return p
}

func (c *Cloud) deleteServer(w http.ResponseWriter, _ *http.Request, now time.Time, s *server) {
	if s.taskState != "deleting" {
		s.taskState, s.updated, s.goneAt = "deleting", now, now.Add(c.deleteTime)
		if c.deleteTime <= 0 {
			c.removeServer(s, now)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (c *Cloud) serverAction(w http.ResponseWriter, r *http.Request, now time.Time, s *server) {
	var body map[string]map[string]any
	if err := readJSON(r, &body); err != nil {
		novaError(w, http.StatusBadRequest, "Invalid JSON in request body: "+err.Error())
		return
	}
	for action, args := range body {
		switch action {
		case "os-getConsoleOutput":
			if s.status == "BUILD" {
				novaError(w, http.StatusConflict, fmt.Sprintf("Cannot 'get_console_output' instance %s while it is in vm_state building", s.id))
				return
			}
			lines := s.consoleLines
			if n, ok := args["length"].(float64); ok && int(n) >= 0 && int(n) < len(lines) {
				lines = lines[len(lines)-int(n):]
			}
			writeJSON(w, http.StatusOK, map[string]any{"output": strings.Join(lines, "\n") + "\n"})
			return
		case "os-stop", "os-start":
			// Nova stops an ACTIVE or ERROR server, starts a SHUTOFF one,
			// and refuses either while another task runs.
			verb, from, task, to := "stop", []string{"ACTIVE", "ERROR"}, "powering-off", "SHUTOFF"
			if action == "os-start" {
				verb, from, task, to = "start", []string{"SHUTOFF"}, "powering-on", "ACTIVE"
			}
			if !c.mayAct(w, s, verb, from...) {
				return
			}
			s.taskState, s.updated, s.powerAt = task, now, now.Add(c.powerTime)
			if c.powerTime <= 0 {
				s.status, s.taskState = to, ""
			}
			w.WriteHeader(http.StatusAccepted)
			return
		case "os-resetState":
			// An administrator sets the server's vm_state by hand (active
			// or error), whatever it is doing.
			state, _ := args["state"].(string)
			switch state {
			case "active":
				s.status = "ACTIVE"
			case "error":
				s.status = "ERROR"
			default:
				novaError(w, http.StatusBadRequest, fmt.Sprintf("Invalid input for field/attribute state. Value: %v. %q is not one of ['active', 'error']", args["state"], state))
				return
			}
			s.taskState, s.updated = "", now
			w.WriteHeader(http.StatusAccepted)
			return
		case "reboot":
			w.WriteHeader(http.StatusAccepted)
			return
		}
		novaError(w, http.StatusBadRequest, fmt.Sprintf("There is no such action: %s", action))
		return
	}
	novaError(w, http.StatusBadRequest, "Malformed request body")
}

func (c *Cloud) showMetadata(w http.ResponseWriter, _ *http.Request, _ time.Time, s *server) {
	writeJSON(w, http.StatusOK, map[string]any{"metadata": s.metadata})
}

func (c *Cloud) updateMetadata(replace bool) func(http.ResponseWriter, *http.Request, time.Time, *server) {
	return func(w http.ResponseWriter, r *http.Request, now time.Time, s *server) {
		var body struct {
			Metadata map[string]string `json:"metadata"`
		}
		if err := readJSON(r, &body); err != nil || body.Metadata == nil {
			novaError(w, http.StatusBadRequest, "Malformed request body")
			return
		}
		if replace {
			s.metadata = map[string]string{}
		}
		for k, v := range body.Metadata {
			s.metadata[k] = v
		}
		s.updated = now
		writeJSON(w, http.StatusOK, map[string]any{"metadata": s.metadata})
	}
}

func (c *Cloud) metadataItem(w http.ResponseWriter, r *http.Request, now time.Time, s *server) {
	key := r.PathValue("key")
	switch r.Method {
	case http.MethodGet:
		v, ok := s.metadata[key]
		if !ok {
			novaError(w, http.StatusNotFound, "Metadata item was not found")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"meta": map[string]string{key: v}})
	case http.MethodPut:
		var body struct {
			Meta map[string]string `json:"meta"`
		}
		if err := readJSON(r, &body); err != nil || len(body.Meta) != 1 {
			novaError(w, http.StatusBadRequest, "Request body contains too many items")
			return
		}
		v, ok := body.Meta[key]
		if !ok {
			novaError(w, http.StatusBadRequest, "Request body and URI mismatch")
			return
		}
		s.metadata[key], s.updated = v, now
		writeJSON(w, http.StatusOK, map[string]any{"meta": map[string]string{key: v}})
	case http.MethodDelete:
		if _, ok := s.metadata[key]; !ok {
			novaError(w, http.StatusNotFound, "Metadata item was not found")
			return
		}
		delete(s.metadata, key)
		s.updated = now
		w.WriteHeader(http.StatusNoContent)
	}
}

func (c *Cloud) volumeAttachments(w http.ResponseWriter, _ *http.Request, _ time.Time, s *server) {
	out := []any{}
	for _, a := range s.volumes {
		out = append(out, map[string]any{"id": a.volumeID, "volumeId": a.volumeID, "serverId": s.id, "device": "/dev/vda",
			"delete_on_termination": a.deleteOnTermination, "attachment_id": a.attachmentID})
	}
	writeJSON(w, http.StatusOK, map[string]any{"volumeAttachments": out})
}

func (c *Cloud) flavorJSON(r *http.Request, f *Flavor, detail bool) map[string]any {
	out := map[string]any{"id": f.ID, "name": f.Name, "links": []any{
		map[string]any{"rel": "self", "href": base(r) + "/compute/v2.1/flavors/" + f.ID},
		map[string]any{"rel": "bookmark", "href": base(r) + "/compute/flavors/" + f.ID},
	}}
	if mv(r) >= 55 {
		out["description"] = nil
	}
	if !detail {
		return out
	}
	out["ram"], out["vcpus"], out["disk"] = f.RAM, f.VCPUs, f.Disk
	out["OS-FLV-EXT-DATA:ephemeral"], out["OS-FLV-DISABLED:disabled"] = 0, false
	out["os-flavor-access:is_public"], out["rxtx_factor"] = true, 1.0
	out["swap"] = ""
	if mv(r) >= 75 {
		out["swap"] = 0
	}
	if mv(r) >= 61 {
		out["extra_specs"] = map[string]any{}
	}
	return out
}

func (c *Cloud) listFlavors(detail bool) func(http.ResponseWriter, *http.Request, time.Time) {
	return func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		q := r.URL.Query()
		limit, err := c.limitParam(r)
		if err != nil {
			novaError(w, http.StatusBadRequest, err.Error())
			return
		}
		minRAM, _ := strconv.Atoi(q.Get("minRam"))
		minDisk, _ := strconv.Atoi(q.Get("minDisk"))
		var list []*Flavor
		for i := range c.st.flavors {
			f := &c.st.flavors[i]
			if f.RAM >= minRAM && f.Disk >= minDisk {
				list = append(list, f)
			}
		}
		slices.SortFunc(list, func(a, b *Flavor) int { return strings.Compare(a.ID, b.ID) })
		pg, more, ok := page(list, func(f *Flavor) string { return f.ID }, q.Get("marker"), limit)
		if !ok {
			novaError(w, http.StatusBadRequest, fmt.Sprintf("marker [%s] not found", q.Get("marker")))
			return
		}
		out := []any{}
		for _, f := range pg {
			out = append(out, c.flavorJSON(r, f, detail))
		}
		body := map[string]any{"flavors": out}
		if more {
			body["flavors_links"] = []any{map[string]any{"rel": "next", "href": nextLink(r, "", pg[len(pg)-1].ID)}}
		}
		writeJSON(w, http.StatusOK, body)
	}
}

func (c *Cloud) showFlavor(w http.ResponseWriter, r *http.Request, _ time.Time) {
	for i := range c.st.flavors {
		if f := &c.st.flavors[i]; f.ID == r.PathValue("id") {
			writeJSON(w, http.StatusOK, map[string]any{"flavor": c.flavorJSON(r, f, true)})
			return
		}
	}
	novaError(w, http.StatusNotFound, fmt.Sprintf("Flavor %s could not be found.", r.PathValue("id")))
}

func (c *Cloud) computeLimits(w http.ResponseWriter, _ *http.Request, _ time.Time) {
	instances, cores, ram, _, _, _ := c.st.usage()
	q := c.quota
	writeJSON(w, http.StatusOK, map[string]any{"limits": map[string]any{"rate": []any{}, "absolute": map[string]any{
		"maxTotalInstances": q.Instances, "maxTotalCores": q.Cores, "maxTotalRAMSize": q.RAM,
		"totalInstancesUsed": instances, "totalCoresUsed": cores, "totalRAMUsed": ram,
		"maxServerMeta": 128, "maxPersonality": 5, "maxPersonalitySize": 10240, "maxImageMeta": 128,
		"maxTotalKeypairs": 100, "maxServerGroups": 10, "maxServerGroupMembers": 10, "totalServerGroupsUsed": 0,
		"maxSecurityGroups": -1, "maxSecurityGroupRules": -1, "totalSecurityGroupsUsed": 0,
		"maxTotalFloatingIps": -1, "totalFloatingIpsUsed": 0,
	}}})
}

func (c *Cloud) availabilityZones(w http.ResponseWriter, _ *http.Request, _ time.Time) {
	var zones []any
	for _, z := range c.opts.AvailabilityZones {
		zones = append(zones, map[string]any{"zoneName": z, "zoneState": map[string]any{"available": true}, "hosts": nil})
	}
	writeJSON(w, http.StatusOK, map[string]any{"availabilityZoneInfo": zones})
}
