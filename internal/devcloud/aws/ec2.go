package aws

import (
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ec2Handler runs one EC2 action with the cloud locked.
type ec2Handler func(c *Cloud, f form, now time.Time) (response, *apiError)

var ec2Actions = map[string]ec2Handler{
	"RunInstances":                 (*Cloud).runInstances,
	"DescribeInstances":            (*Cloud).describeInstances,
	"TerminateInstances":           (*Cloud).terminateInstances,
	"StopInstances":                (*Cloud).stopInstances,
	"StartInstances":               (*Cloud).startInstances,
	"CreateTags":                   (*Cloud).createTags,
	"DeleteTags":                   (*Cloud).deleteTags,
	"DescribeInstanceTypes":        (*Cloud).describeInstanceTypes,
	"DescribeImages":               (*Cloud).describeImages,
	"RegisterImage":                (*Cloud).registerImage,
	"DeregisterImage":              (*Cloud).deregisterImage,
	"DescribeSnapshots":            (*Cloud).describeSnapshots,
	"DeleteSnapshot":               (*Cloud).deleteSnapshot,
	"DescribeVolumes":              (*Cloud).describeVolumes,
	"DeleteVolume":                 (*Cloud).deleteVolume,
	"ImportSnapshot":               (*Cloud).importSnapshot,
	"DescribeImportSnapshotTasks":  (*Cloud).describeImportSnapshotTasks,
	"ImportImage":                  (*Cloud).importImage,
	"DescribeImportImageTasks":     (*Cloud).describeImportImageTasks,
	"CancelImportTask":             (*Cloud).cancelImportTask,
	"DescribeSpotInstanceRequests": (*Cloud).describeSpotInstanceRequests,
	"CreateLaunchTemplate":         (*Cloud).createLaunchTemplate,
	"DescribeLaunchTemplates":      (*Cloud).describeLaunchTemplates,
	"DeleteLaunchTemplate":         (*Cloud).deleteLaunchTemplate,
	"CreateFleet":                  (*Cloud).createFleet,
	"DescribeFleets":               (*Cloud).describeFleets,
	"AllocateHosts":                (*Cloud).allocateHosts,
	"ReleaseHosts":                 (*Cloud).releaseHosts,
	"DescribeHosts":                (*Cloud).describeHosts,
	"DescribeAvailabilityZones":    (*Cloud).describeAvailabilityZones,
	"DescribeRegions":              (*Cloud).describeRegions,
}

// maxFormBytes bounds a Query request's body.
const maxFormBytes = 1 << 20

func (c *Cloud) serveEC2(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	rid := c.requestID()
	c.mu.Unlock()
	if r.Method != http.MethodPost && r.Method != http.MethodGet {
		writeEC2Error(w, rid, errf(http.StatusBadRequest, "InvalidAction", "EC2 takes POST (or GET) requests of the Query protocol"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		writeEC2Error(w, rid, errf(http.StatusBadRequest, "MalformedQueryString", "The request is not a valid form-encoded Query request: %v", err))
		return
	}
	vals := url.Values(r.Form)
	action := vals.Get("Action")
	h, ok := ec2Actions[action]
	if !ok {
		c.count("ec2.unknown")
		if action == "" {
			writeEC2Error(w, rid, missing("Action"))
			return
		}
		writeEC2Error(w, rid, errf(http.StatusBadRequest, "InvalidAction", "The action %s is not valid for this web service.", action))
		return
	}
	if v := vals.Get("Version"); v != "" && v != "2016-11-15" {
		writeEC2Error(w, rid, errf(http.StatusBadRequest, "InvalidAction", "The action %s is not valid for version %s of this web service (this cloud speaks 2016-11-15).", action, v))
		return
	}
	c.count(action)
	if c.throttled() {
		c.count("throttled")
		writeEC2Error(w, rid, errf(http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded."))
		return
	}
	f := form{v: vals}
	if dry, _ := f.bool("DryRun", false); dry {
		writeEC2Error(w, rid, errf(http.StatusPreconditionFailed, "DryRunOperation", "Request would have succeeded, but DryRun flag is set."))
		return
	}
	c.mu.Lock()
	now := time.Now()
	c.advance(now)
	resp, aerr := h(c, f, now)
	c.mu.Unlock()
	if aerr != nil {
		writeEC2Error(w, rid, aerr)
		return
	}
	writeEC2(w, action, rid, resp)
}

// advance moves every resource along as time has passed: instances boot
// and terminate, spot interruptions fall due, imports, snapshots and
// images complete. Called with c.mu held before every call.
func (c *Cloud) advance(now time.Time) {
	for id, in := range c.instances {
		if sr := c.spot[in.SpotRequestID]; sr != nil && !sr.InterruptAt.IsZero() && !now.Before(sr.InterruptAt) && (in.State == "pending" || in.State == "running") {
			c.interruptNow(in, sr, now)
		}
		if in.State == "pending" && !now.Before(in.RunningAt) {
			in.State = "running"
		}
		if in.State == "stopping" && !now.Before(in.StopAt) {
			in.State = "stopped"
		}
		if in.State == "shutting-down" && !now.Before(in.TerminateAt) {
			c.terminated(in, now)
		}
		if in.State == "terminated" && !now.Before(in.GoneAt) {
			delete(c.instances, id)
		}
	}
	for id, v := range c.volumes {
		switch {
		case v.State == "creating" && !now.Before(v.Created.Add(c.knobs.ImportTime.D()/4)):
			v.State = "available"
		case v.State == "deleting" && !now.Before(v.GoneAt):
			delete(c.volumes, id)
		}
	}
	for _, s := range c.snapshots {
		if s.State == "pending" && !s.CompleteAt.IsZero() {
			if !now.Before(s.CompleteAt) {
				s.State, s.Progress = "completed", 100
			} else if d := s.CompleteAt.Sub(s.Started); d > 0 {
				s.Progress = int(100 * now.Sub(s.Started) / d)
			}
		}
	}
	for _, im := range c.images {
		if im.State == "pending" && !now.Before(im.AvailableAt) {
			im.State = "available"
		}
	}
	for id, t := range c.imports {
		switch {
		case t.State == "active" && !now.Before(t.DoneAt):
			c.completeImport(t, now)
		case t.State == "deleting":
			t.State = "deleted"
		case t.State == "deleted" && now.Sub(t.DoneAt) > 7*24*time.Hour:
			delete(c.imports, id)
		}
	}
	for id, h := range c.hosts {
		if h.State == "released" && now.Sub(h.Released) > time.Hour {
			delete(c.hosts, id)
		}
	}
}

// notFound is EC2's error for ids that do not exist, by id prefix.
func notFound(id string) *apiError {
	kind, _, _ := strings.Cut(id, "-")
	switch kind {
	case "i":
		return errf(http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
	case "ami":
		return errf(http.StatusBadRequest, "InvalidAMIID.NotFound", "The image id '[%s]' does not exist", id)
	case "snap":
		return errf(http.StatusBadRequest, "InvalidSnapshot.NotFound", "The snapshot '%s' does not exist.", id)
	case "vol":
		return errf(http.StatusBadRequest, "InvalidVolume.NotFound", "The volume '%s' does not exist.", id)
	case "sir":
		return errf(http.StatusBadRequest, "InvalidSpotInstanceRequestID.NotFound", "The spot instance request ID '%s' does not exist", id)
	case "h":
		return errf(http.StatusBadRequest, "InvalidHostID.NotFound", "The host ID '%s' does not exist", id)
	case "lt":
		return errf(http.StatusBadRequest, "InvalidLaunchTemplateId.NotFound", "The specified launch template, with template ID %s, does not exist.", id)
	case "fleet":
		return errf(http.StatusBadRequest, "InvalidFleetId.NotFound", "The fleet ID '%s' does not exist", id)
	case "import":
		return errf(http.StatusBadRequest, "InvalidConversionTaskId", "The import task ID '%s' does not exist", id)
	}
	return errf(http.StatusBadRequest, "InvalidID", "The ID '%s' is not valid", id)
}

// wellFormed checks the shape of an id (prefix-17 hex digits or 8).
func wellFormed(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix+"-")
	if !ok || (len(rest) != 17 && len(rest) != 8) {
		return false
	}
	for _, r := range rest {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

func malformed(id, kind string) *apiError {
	return errf(http.StatusBadRequest, kind+".Malformed", "Invalid id: \"%s\"", id)
}

// tagsOf finds the tags of any taggable resource by id.
func (c *Cloud) tagsOf(id string) (map[string]string, bool) {
	switch {
	case c.instances[id] != nil:
		return c.instances[id].Tags, true
	case c.images[id] != nil && c.images[id].State != "deregistered":
		return c.images[id].Tags, true
	case c.snapshots[id] != nil:
		return c.snapshots[id].Tags, true
	case c.volumes[id] != nil:
		return c.volumes[id].Tags, true
	case c.spot[id] != nil:
		return c.spot[id].Tags, true
	case c.hosts[id] != nil:
		return c.hosts[id].Tags, true
	case c.imports[id] != nil:
		return c.imports[id].Tags, true
	case c.fleets[id] != nil:
		return c.fleets[id].Tags, true
	case c.templates[id] != nil:
		return c.templates[id].Tags, true
	}
	return nil, false
}

type emptyResponse struct {
	meta
	Return bool `xml:"return"`
}

func (c *Cloud) createTags(f form, _ time.Time) (response, *apiError) {
	ids := f.list("ResourceId")
	if len(ids) == 0 {
		return nil, missing("ResourceId")
	}
	tags, err := f.tags("Tag")
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		cur, ok := c.tagsOf(id)
		if !ok {
			return nil, notFound(id)
		}
		if len(cur)+len(tags) > 50 {
			return nil, errf(http.StatusBadRequest, "TagLimitExceeded", "The maximum number of tags (50) for resource %s would be exceeded", id)
		}
	}
	for _, id := range ids {
		cur, _ := c.tagsOf(id)
		for k, v := range tags {
			cur[k] = v
		}
	}
	return &emptyResponse{Return: true}, nil
}

func (c *Cloud) deleteTags(f form, _ time.Time) (response, *apiError) {
	ids := f.list("ResourceId")
	if len(ids) == 0 {
		return nil, missing("ResourceId")
	}
	for _, id := range ids {
		cur, ok := c.tagsOf(id)
		if !ok {
			return nil, notFound(id)
		}
		for _, t := range f.structs("Tag") {
			k := t.get("Key")
			if v, has := cur[k]; has && (!t.has("Value") || t.get("Value") == v) {
				delete(cur, k)
			}
		}
	}
	return &emptyResponse{Return: true}, nil
}

func (c *Cloud) zones() []string {
	return []string{c.region + "a", c.region + "b", c.region + "c"}
}

type xmlZone struct {
	ZoneName   string        `xml:"zoneName"`
	ZoneID     string        `xml:"zoneId"`
	ZoneState  string        `xml:"zoneState"`
	RegionName string        `xml:"regionName"`
	ZoneType   string        `xml:"zoneType"`
	OptIn      string        `xml:"optInStatus"`
	GroupName  string        `xml:"groupName"`
	Border     string        `xml:"networkBorderGroup"`
	Messages   items[string] `xml:"messageSet"`
}

type describeZonesResponse struct {
	meta
	Zones items[xmlZone] `xml:"availabilityZoneInfo"`
}

func (c *Cloud) describeAvailabilityZones(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("zone-name", "zone-id", "state", "region-name", "zone-type", "group-name"))
	if err != nil {
		return nil, err
	}
	names := f.list("ZoneName")
	out := items[xmlZone]{}
	for i, z := range c.zones() {
		xz := xmlZone{ZoneName: z, ZoneID: "use1-az" + string(rune('1'+i)), ZoneState: "available", RegionName: c.region,
			ZoneType: "availability-zone", OptIn: "opt-in-not-required", GroupName: c.region + "-zg-1", Border: c.region, Messages: items[string]{}}
		if len(names) > 0 && !contains(names, z) {
			continue
		}
		ok := true
		for _, x := range fl {
			switch x.name {
			case "zone-name":
				ok = ok && x.match(z)
			case "zone-id":
				ok = ok && x.match(xz.ZoneID)
			case "state":
				ok = ok && x.match("available")
			case "region-name":
				ok = ok && x.match(c.region)
			case "zone-type":
				ok = ok && x.match("availability-zone")
			case "group-name":
				ok = ok && x.match(xz.GroupName)
			}
		}
		if ok {
			out = append(out, xz)
		}
	}
	for _, n := range names {
		if !contains(c.zones(), n) {
			return nil, errf(http.StatusBadRequest, "InvalidParameterValue", "Invalid availability zone: [%s]", n)
		}
	}
	return &describeZonesResponse{Zones: out}, nil
}

type xmlRegion struct {
	Name     string `xml:"regionName"`
	Endpoint string `xml:"regionEndpoint"`
	OptIn    string `xml:"optInStatus"`
}

type describeRegionsResponse struct {
	meta
	Regions items[xmlRegion] `xml:"regionInfo"`
}

func (c *Cloud) describeRegions(f form, _ time.Time) (response, *apiError) {
	if _, err := f.filters("Filter", knownFilters("endpoint", "region-name", "opt-in-status")); err != nil {
		return nil, err
	}
	return &describeRegionsResponse{Regions: items[xmlRegion]{{Name: c.region, Endpoint: "ec2." + c.region + ".amazonaws.com", OptIn: "opt-in-not-required"}}}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func cloneTags(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
