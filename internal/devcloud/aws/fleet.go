package aws

import (
	"net/http"
	"slices"
	"strings"
	"time"
)

type xmlLaunchTemplate struct {
	ID             string        `xml:"launchTemplateId"`
	Name           string        `xml:"launchTemplateName"`
	CreateTime     ts            `xml:"createTime"`
	CreatedBy      string        `xml:"createdBy"`
	DefaultVersion int           `xml:"defaultVersionNumber"`
	LatestVersion  int           `xml:"latestVersionNumber"`
	Tags           items[xmlTag] `xml:"tagSet"`
}

func (c *Cloud) templateXML(t *launchTemplate) xmlLaunchTemplate {
	return xmlLaunchTemplate{ID: t.ID, Name: t.Name, CreateTime: ts(t.Created), CreatedBy: "arn:aws:iam::" + c.account + ":root",
		DefaultVersion: 1, LatestVersion: 1, Tags: tagSet(t.Tags)}
}

type createLaunchTemplateResponse struct {
	meta
	Template xmlLaunchTemplate `xml:"launchTemplate"`
}

var templateNameOK = func(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("()./_-", r)
}

func (c *Cloud) createLaunchTemplate(f form, now time.Time) (response, *apiError) {
	name := f.get("LaunchTemplateName")
	if name == "" {
		return nil, missing("LaunchTemplateName")
	}
	if len(name) < 3 || len(name) > 128 || strings.IndexFunc(name, func(r rune) bool { return !templateNameOK(r) }) >= 0 {
		return nil, badParam("Launch template name %q is not valid: 3 to 128 of A-Z a-z 0-9 ( ) . / _ -", name)
	}
	for _, t := range c.templates {
		if t.Name == name {
			return nil, errf(http.StatusBadRequest, "InvalidLaunchTemplateName.AlreadyExistsException", "Launch template name already in use.")
		}
	}
	if !f.hasSub("LaunchTemplateData") {
		return nil, missing("LaunchTemplateData")
	}
	spec, err := parseLaunchSpec(f.sub("LaunchTemplateData"), true)
	if err != nil {
		return nil, err
	}
	if spec.ImageID != "" && c.images[spec.ImageID] == nil {
		return nil, notFound(spec.ImageID)
	}
	tags, err := f.tagSpecs("TagSpecification", "launch-template")
	if err != nil {
		return nil, err
	}
	t := &launchTemplate{ID: newID("lt"), Name: name, Created: now, Spec: spec, Tags: cloneTags(tags["launch-template"])}
	c.templates[t.ID] = t
	return &createLaunchTemplateResponse{Template: c.templateXML(t)}, nil
}

func (c *Cloud) templateByName(name string) *launchTemplate {
	for _, t := range c.templates {
		if t.Name == name {
			return t
		}
	}
	return nil
}

type describeLaunchTemplatesResponse struct {
	meta
	Templates items[xmlLaunchTemplate] `xml:"launchTemplates"`
	NextToken string                   `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeLaunchTemplates(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("launch-template-name", "create-time", "tag-key", "tag-value"))
	if err != nil {
		return nil, err
	}
	ids, names := f.list("LaunchTemplateId"), f.list("LaunchTemplateName")
	for _, id := range ids {
		if c.templates[id] == nil {
			return nil, notFound(id)
		}
	}
	for _, n := range names {
		if c.templateByName(n) == nil {
			return nil, errf(http.StatusBadRequest, "InvalidLaunchTemplateName.NotFoundException", "At least one of the launch templates specified in the request does not exist.")
		}
	}
	var list []*launchTemplate
	for _, t := range c.templates {
		if (len(ids) > 0 || len(names) > 0) && !contains(ids, t.ID) && !contains(names, t.Name) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(t.Tags); isTag {
				ok = ok && m
			} else if x.name == "launch-template-name" {
				ok = ok && x.match(t.Name)
			}
		}
		if ok {
			list = append(list, t)
		}
	}
	slices.SortFunc(list, func(a, b *launchTemplate) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(t *launchTemplate) string { return t.ID }, f, c.knobs.PageSize, 1)
	if err != nil {
		return nil, err
	}
	resp := &describeLaunchTemplatesResponse{Templates: items[xmlLaunchTemplate]{}, NextToken: next}
	for _, t := range pageList {
		resp.Templates = append(resp.Templates, c.templateXML(t))
	}
	return resp, nil
}

func (c *Cloud) deleteLaunchTemplate(f form, _ time.Time) (response, *apiError) {
	var t *launchTemplate
	switch {
	case f.get("LaunchTemplateId") != "":
		t = c.templates[f.get("LaunchTemplateId")]
		if t == nil {
			return nil, notFound(f.get("LaunchTemplateId"))
		}
	case f.get("LaunchTemplateName") != "":
		t = c.templateByName(f.get("LaunchTemplateName"))
		if t == nil {
			return nil, errf(http.StatusBadRequest, "InvalidLaunchTemplateName.NotFoundException", "The specified launch template, with template name %s, does not exist.", f.get("LaunchTemplateName"))
		}
	default:
		return nil, missing("LaunchTemplateId or LaunchTemplateName")
	}
	delete(c.templates, t.ID)
	return &createLaunchTemplateResponse{Template: c.templateXML(t)}, nil
}

// Fleets.

type xmlFleetTemplateSpec struct {
	ID      string `xml:"launchTemplateId"`
	Name    string `xml:"launchTemplateName"`
	Version string `xml:"version"`
}

type xmlFleetOverrides struct {
	InstanceType     string  `xml:"instanceType,omitempty"`
	SubnetID         string  `xml:"subnetId,omitempty"`
	AvailabilityZone string  `xml:"availabilityZone,omitempty"`
	ImageID          string  `xml:"imageId,omitempty"`
	Priority         float64 `xml:"priority,omitempty"`
	MaxPrice         string  `xml:"maxPrice,omitempty"`
}

type xmlTemplateAndOverrides struct {
	Spec      xmlFleetTemplateSpec `xml:"launchTemplateSpecification"`
	Overrides xmlFleetOverrides    `xml:"overrides"`
}

type xmlFleetError struct {
	Template  xmlTemplateAndOverrides `xml:"launchTemplateAndOverrides"`
	Lifecycle string                  `xml:"lifecycle"`
	Code      string                  `xml:"errorCode"`
	Message   string                  `xml:"errorMessage"`
}

type xmlFleetInstance struct {
	Template     xmlTemplateAndOverrides `xml:"launchTemplateAndOverrides"`
	Lifecycle    string                  `xml:"lifecycle"`
	InstanceIDs  items[string]           `xml:"instanceIds"`
	InstanceType string                  `xml:"instanceType"`
}

type createFleetResponse struct {
	meta
	FleetID   string                  `xml:"fleetId"`
	Errors    items[xmlFleetError]    `xml:"errorSet"`
	Instances items[xmlFleetInstance] `xml:"fleetInstanceSet"`
}

// fleetOverride is one override of a fleet request.
type fleetOverride struct {
	tmpl      *launchTemplate
	version   string
	typ       string
	subnet    string
	az        string
	imageID   string
	priority  float64
	maxPrice  string
	hasPrio   bool
	xml       xmlTemplateAndOverrides
	listIndex int
}

func (c *Cloud) createFleet(f form, now time.Time) (response, *apiError) {
	typ := f.get("Type")
	if typ == "" {
		typ = "maintain"
	}
	if typ != "instant" {
		return nil, badParam("This cloud runs fleets of type instant only, not %s", typ)
	}
	if tok := f.get("ClientToken"); tok != "" {
		if id, ok := c.tokens["fleet/"+tok]; ok {
			if fl := c.fleets[id]; fl != nil {
				resp := c.fleetXML(fl, nil)
				resp.Errors = append(resp.Errors, fl.Errors...)
				return resp, nil
			}
		}
	}
	ts := f.sub("TargetCapacitySpecification")
	total, err := ts.int("TotalTargetCapacity", -1)
	if err != nil {
		return nil, err
	}
	if total < 1 {
		return nil, missing("TargetCapacitySpecification.TotalTargetCapacity")
	}
	if total > 100 {
		return nil, badParam("TotalTargetCapacity of an instant fleet is at most 100 in this cloud")
	}
	capType := ts.get("DefaultTargetCapacityType")
	if capType != "spot" && capType != "on-demand" {
		return nil, badParam("Invalid value '%s' for DefaultTargetCapacityType. Expected spot or on-demand.", capType)
	}
	spot := capType == "spot"
	strategy := f.get("OnDemandOptions.AllocationStrategy")
	valid := []string{"lowest-price", "prioritized"}
	if spot {
		strategy = f.get("SpotOptions.AllocationStrategy")
		valid = []string{"lowest-price", "diversified", "capacity-optimized", "capacity-optimized-prioritized", "price-capacity-optimized"}
	}
	if strategy == "" {
		strategy = "lowest-price"
	}
	if !slices.Contains(valid, strategy) {
		return nil, badParam("Invalid value '%s' for AllocationStrategy. Expected one of %s.", strategy, strings.Join(valid, ", "))
	}
	tags, err := f.tagSpecs("TagSpecification", "fleet", "instance", "volume")
	if err != nil {
		return nil, err
	}
	var overrides []fleetOverride
	for _, cfg := range f.structs("LaunchTemplateConfigs") {
		ls := cfg.sub("LaunchTemplateSpecification")
		var t *launchTemplate
		switch {
		case ls.get("LaunchTemplateId") != "":
			t = c.templates[ls.get("LaunchTemplateId")]
			if t == nil {
				return nil, notFound(ls.get("LaunchTemplateId"))
			}
		case ls.get("LaunchTemplateName") != "":
			t = c.templateByName(ls.get("LaunchTemplateName"))
			if t == nil {
				return nil, errf(http.StatusBadRequest, "InvalidLaunchTemplateName.NotFoundException", "The specified launch template, with template name %s, does not exist.", ls.get("LaunchTemplateName"))
			}
		default:
			return nil, missing(ls.key("LaunchTemplateId"))
		}
		version := ls.get("Version")
		if version == "" {
			version = "$Default"
		}
		if version != "1" && version != "$Default" && version != "$Latest" {
			return nil, errf(http.StatusBadRequest, "InvalidLaunchTemplateVersion.NotFound", "Launch template %s has no version %s", t.ID, version)
		}
		ovs := cfg.structs("Overrides")
		if len(ovs) == 0 {
			ovs = []form{{v: f.v, prefix: cfg.key("Overrides.0")}}
		}
		for _, o := range ovs {
			fo := fleetOverride{tmpl: t, version: version, typ: o.get("InstanceType"), subnet: o.get("SubnetId"), az: o.get("AvailabilityZone"),
				imageID: o.get("ImageId"), maxPrice: o.get("MaxPrice"), hasPrio: o.has("Priority"), listIndex: len(overrides)}
			if fo.priority, err = o.float("Priority"); err != nil {
				return nil, err
			}
			fo.xml = xmlTemplateAndOverrides{Spec: xmlFleetTemplateSpec{ID: t.ID, Name: t.Name, Version: version},
				Overrides: xmlFleetOverrides{InstanceType: fo.typ, SubnetID: fo.subnet, AvailabilityZone: fo.az, ImageID: fo.imageID, Priority: fo.priority, MaxPrice: fo.maxPrice}}
			overrides = append(overrides, fo)
		}
	}
	if len(overrides) == 0 {
		return nil, missing("LaunchTemplateConfigs")
	}
	// The order the fleet tries its pools in: by priority where the
	// strategy honours it, by price (here: by size) otherwise.
	price := func(o fleetOverride) int {
		typ := o.typ
		if typ == "" {
			typ = o.tmpl.Spec.InstanceType
		}
		it := c.types[typ]
		return it.VCPUs*1000 + it.MemoryMiB/1024
	}
	slices.SortStableFunc(overrides, func(a, b fleetOverride) int {
		if strategy == "prioritized" || strategy == "capacity-optimized-prioritized" {
			if a.hasPrio != b.hasPrio {
				if a.hasPrio {
					return -1
				}
				return 1
			}
			if a.priority != b.priority {
				if a.priority < b.priority {
					return -1
				}
				return 1
			}
			return a.listIndex - b.listIndex
		}
		return price(a) - price(b)
	})
	fl := &fleet{ID: "fleet-" + newID("x")[2:10] + "-" + newID("x")[2:6] + "-" + newID("x")[2:6] + "-" + newID("x")[2:6] + "-" + newID("x")[2:14], Type: typ, Created: now, Tags: cloneTags(tags["fleet"])}
	lifecycle := "on-demand"
	if spot {
		lifecycle = "spot"
	}
	var errs items[xmlFleetError]
	var got []xmlFleetInstance
	need := total
	for _, o := range overrides {
		if need == 0 {
			break
		}
		s := o.tmpl.Spec
		s.Tags = map[string]map[string]string{"instance": cloneTags(s.Tags["instance"]), "volume": cloneTags(s.Tags["volume"])}
		for k, v := range tags["instance"] {
			s.Tags["instance"][k] = v
		}
		for k, v := range tags["volume"] {
			s.Tags["volume"][k] = v
		}
		if o.typ != "" {
			s.InstanceType = o.typ
		}
		if o.subnet != "" {
			s.SubnetID = o.subnet
		}
		if o.az != "" {
			s.AZ = o.az
		}
		if o.imageID != "" {
			s.ImageID = o.imageID
		}
		s.Spot, s.ClientToken = spot, ""
		img, it, aerr := c.checkLaunch(&s)
		if aerr == nil {
			aerr = c.capacityError(it.Name, spot, orDefault(s.AZ, c.zones()[0]))
		}
		if aerr == nil {
			aerr = c.quotaError(it, spot, need)
		}
		if aerr != nil {
			errs = append(errs, xmlFleetError{Template: o.xml, Lifecycle: lifecycle, Code: aerr.Code, Message: aerr.Message})
			continue
		}
		_, insts := c.launch(s, img, it, need, now, fl.ID)
		fi := xmlFleetInstance{Template: o.xml, Lifecycle: lifecycle, InstanceIDs: items[string]{}, InstanceType: it.Name}
		for _, in := range insts {
			fi.InstanceIDs = append(fi.InstanceIDs, in.ID)
			fl.Instances = append(fl.Instances, in.ID)
		}
		got = append(got, fi)
		need = 0
	}
	fl.Errors = errs
	c.fleets[fl.ID] = fl
	if tok := f.get("ClientToken"); tok != "" {
		c.tokens["fleet/"+tok] = fl.ID
	}
	resp := c.fleetXML(fl, got)
	resp.Errors = errs
	if resp.Errors == nil {
		resp.Errors = items[xmlFleetError]{}
	}
	return resp, nil
}

func (c *Cloud) fleetXML(fl *fleet, got []xmlFleetInstance) *createFleetResponse {
	resp := &createFleetResponse{FleetID: fl.ID, Errors: items[xmlFleetError]{}, Instances: items[xmlFleetInstance]{}}
	if got == nil && len(fl.Instances) > 0 {
		fi := xmlFleetInstance{InstanceIDs: items[string]{}}
		for _, id := range fl.Instances {
			fi.InstanceIDs = append(fi.InstanceIDs, id)
			if in := c.instances[id]; in != nil {
				fi.InstanceType = in.Type
				fi.Lifecycle = map[bool]string{true: "spot", false: "on-demand"}[in.Spot]
			}
		}
		got = []xmlFleetInstance{fi}
	}
	resp.Instances = append(resp.Instances, got...)
	return resp
}

type xmlFleetData struct {
	FleetID    string        `xml:"fleetId"`
	State      string        `xml:"fleetState"`
	Type       string        `xml:"type"`
	CreateTime ts            `xml:"createTime"`
	Tags       items[xmlTag] `xml:"tagSet"`
}

type describeFleetsResponse struct {
	meta
	Fleets    items[xmlFleetData] `xml:"fleetSet"`
	NextToken string              `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeFleets(f form, _ time.Time) (response, *apiError) {
	if _, err := f.filters("Filter", knownFilters("fleet-state", "type", "activity-status", "excess-capacity-termination-policy", "replace-unhealthy-instances")); err != nil {
		return nil, err
	}
	ids := f.list("FleetId")
	var list []*fleet
	for _, fl := range c.fleets {
		if len(ids) == 0 || contains(ids, fl.ID) {
			list = append(list, fl)
		}
	}
	slices.SortFunc(list, func(a, b *fleet) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(fl *fleet) string { return fl.ID }, f, c.knobs.PageSize, 1)
	if err != nil {
		return nil, err
	}
	resp := &describeFleetsResponse{Fleets: items[xmlFleetData]{}, NextToken: next}
	for _, fl := range pageList {
		resp.Fleets = append(resp.Fleets, xmlFleetData{FleetID: fl.ID, State: "active", Type: fl.Type, CreateTime: ts(fl.Created), Tags: tagSet(fl.Tags)})
	}
	return resp, nil
}

// Dedicated hosts.

type allocateHostsResponse struct {
	meta
	HostIDs items[string] `xml:"hostIdSet"`
}

func (c *Cloud) allocateHosts(f form, now time.Time) (response, *apiError) {
	if tok := f.get("ClientToken"); tok != "" {
		if id, ok := c.tokens["host/"+tok]; ok {
			return &allocateHostsResponse{HostIDs: items[string]{id}}, nil
		}
	}
	typ := f.get("InstanceType")
	if typ == "" {
		return nil, missing("InstanceType")
	}
	if _, ok := c.types[typ]; !ok {
		return nil, badParam("Invalid value '%s' for instanceType.", typ)
	}
	az := f.get("AvailabilityZone")
	if az == "" {
		return nil, missing("AvailabilityZone")
	}
	if !contains(c.zones(), az) {
		return nil, badParam("Invalid availability zone: [%s]", az)
	}
	qty, err := f.int("Quantity", 1)
	if err != nil {
		return nil, err
	}
	if qty < 1 || qty > 10 {
		return nil, badParam("Quantity must be from 1 to 10")
	}
	tags, err := f.tagSpecs("TagSpecification", "dedicated-host")
	if err != nil {
		return nil, err
	}
	if n, ok := c.knobs.NoCapacity["host/"+typ]; ok && n != 0 {
		if n > 0 {
			c.knobs.NoCapacity["host/"+typ] = n - 1
		}
		return nil, errf(http.StatusInternalServerError, "InsufficientHostCapacity", "Insufficient capacity for %s dedicated hosts in %s.", typ, az)
	}
	resp := &allocateHostsResponse{HostIDs: items[string]{}}
	for range qty {
		h := &host{ID: newID("h"), InstanceType: typ, AZ: az, State: "available", Allocated: now, Tags: cloneTags(tags["dedicated-host"]),
			ClientToken: f.get("ClientToken"), AutoPlace: orDefault(f.get("AutoPlacement"), "off")}
		c.hosts[h.ID] = h
		resp.HostIDs = append(resp.HostIDs, h.ID)
		if tok := f.get("ClientToken"); tok != "" {
			c.tokens["host/"+tok] = h.ID
		}
	}
	return resp, nil
}

type xmlUnsuccessful struct {
	Error struct {
		Code    string `xml:"code"`
		Message string `xml:"message"`
	} `xml:"error"`
	ResourceID string `xml:"resourceId"`
}

type releaseHostsResponse struct {
	meta
	Successful   items[string]          `xml:"successful"`
	Unsuccessful items[xmlUnsuccessful] `xml:"unsuccessful"`
}

func (c *Cloud) releaseHosts(f form, now time.Time) (response, *apiError) {
	ids := f.list("HostId")
	if len(ids) == 0 {
		return nil, missing("HostId")
	}
	resp := &releaseHostsResponse{Successful: items[string]{}, Unsuccessful: items[xmlUnsuccessful]{}}
	for _, id := range ids {
		h := c.hosts[id]
		var u xmlUnsuccessful
		u.ResourceID = id
		switch {
		case h == nil || h.State == "released":
			u.Error.Code, u.Error.Message = "Client.InvalidHostID.NotFound", "The specified host ID does not exist: "+id
		case len(h.Instances) > 0:
			u.Error.Code, u.Error.Message = "Client.InvalidHost.Occupied", "The specified host has running instances: "+strings.Join(h.Instances, ", ")
		default:
			h.State, h.Released = "released", now
			resp.Successful = append(resp.Successful, id)
			continue
		}
		resp.Unsuccessful = append(resp.Unsuccessful, u)
	}
	return resp, nil
}

type xmlHostInstance struct {
	InstanceID   string `xml:"instanceId"`
	InstanceType string `xml:"instanceType"`
	OwnerID      string `xml:"ownerId"`
}

type xmlHost struct {
	HostID        string `xml:"hostId"`
	AutoPlacement string `xml:"autoPlacement"`
	AZ            string `xml:"availabilityZone"`
	ClientToken   string `xml:"clientToken,omitempty"`
	Properties    struct {
		InstanceType string `xml:"instanceType"`
		Family       string `xml:"instanceFamily"`
		Cores        int    `xml:"cores"`
		Sockets      int    `xml:"sockets"`
		TotalVCpus   int    `xml:"totalVCpus"`
	} `xml:"hostProperties"`
	Instances      items[xmlHostInstance] `xml:"instances"`
	State          string                 `xml:"state"`
	AllocationTime ts                     `xml:"allocationTime"`
	ReleaseTime    *ts                    `xml:"releaseTime,omitempty"`
	Tags           items[xmlTag]          `xml:"tagSet"`
	OwnerID        string                 `xml:"ownerId"`
}

type describeHostsResponse struct {
	meta
	Hosts     items[xmlHost] `xml:"hostSet"`
	NextToken string         `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeHosts(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("state", "availability-zone", "instance-type", "client-token", "auto-placement", "host-reservation-id", "tag-key", "tag-value"))
	if err != nil {
		return nil, err
	}
	ids := f.list("HostId")
	for _, id := range ids {
		if c.hosts[id] == nil {
			return nil, notFound(id)
		}
	}
	var list []*host
	for _, h := range c.hosts {
		if len(ids) > 0 && !contains(ids, h.ID) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(h.Tags); isTag {
				ok = ok && m
				continue
			}
			switch x.name {
			case "state":
				ok = ok && x.match(h.State)
			case "availability-zone":
				ok = ok && x.match(h.AZ)
			case "instance-type":
				ok = ok && x.match(h.InstanceType)
			case "client-token":
				ok = ok && x.match(h.ClientToken)
			case "auto-placement":
				ok = ok && x.match(h.AutoPlace)
			}
		}
		if ok {
			list = append(list, h)
		}
	}
	slices.SortFunc(list, func(a, b *host) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(h *host) string { return h.ID }, f, min(c.knobs.PageSize, 500), 5)
	if err != nil {
		return nil, err
	}
	resp := &describeHostsResponse{Hosts: items[xmlHost]{}, NextToken: next}
	for _, h := range pageList {
		x := xmlHost{HostID: h.ID, AutoPlacement: h.AutoPlace, AZ: h.AZ, ClientToken: h.ClientToken, Instances: items[xmlHostInstance]{},
			State: h.State, AllocationTime: ts(h.Allocated), Tags: tagSet(h.Tags), OwnerID: c.account}
		it := c.types[h.InstanceType]
		x.Properties.InstanceType, x.Properties.Family = h.InstanceType, strings.SplitN(h.InstanceType, ".", 2)[0]
		x.Properties.Cores, x.Properties.Sockets, x.Properties.TotalVCpus = max(1, it.VCPUs/2), 1, it.VCPUs
		for _, id := range h.Instances {
			x.Instances = append(x.Instances, xmlHostInstance{InstanceID: id, InstanceType: h.InstanceType, OwnerID: c.account})
		}
		if h.State == "released" {
			r := ts(h.Released)
			x.ReleaseTime = &r
		}
		resp.Hosts = append(resp.Hosts, x)
	}
	return resp, nil
}
