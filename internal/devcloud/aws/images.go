package aws

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

type xmlInstanceTypeInfo struct {
	InstanceType      string        `xml:"instanceType"`
	CurrentGeneration bool          `xml:"currentGeneration"`
	FreeTierEligible  bool          `xml:"freeTierEligible"`
	UsageClasses      items[string] `xml:"supportedUsageClasses"`
	RootDeviceTypes   items[string] `xml:"supportedRootDeviceTypes"`
	Virtualization    items[string] `xml:"supportedVirtualizationTypes"`
	BareMetal         bool          `xml:"bareMetal"`
	Hypervisor        string        `xml:"hypervisor"`
	Processor         struct {
		Architectures items[string] `xml:"supportedArchitectures"`
	} `xml:"processorInfo"`
	VCpu struct {
		DefaultVCpus          int `xml:"defaultVCpus"`
		DefaultCores          int `xml:"defaultCores"`
		DefaultThreadsPerCore int `xml:"defaultThreadsPerCore"`
	} `xml:"vCpuInfo"`
	Memory struct {
		SizeInMiB int `xml:"sizeInMiB"`
	} `xml:"memoryInfo"`
	DedicatedHostsSupported bool `xml:"dedicatedHostsSupported"`
	AutoRecoverySupported   bool `xml:"autoRecoverySupported"`
	HibernationSupported    bool `xml:"hibernationSupported"`
}

type describeInstanceTypesResponse struct {
	meta
	Types     items[xmlInstanceTypeInfo] `xml:"instanceTypeSet"`
	NextToken string                     `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeInstanceTypes(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("instance-type", "processor-info.supported-architecture", "vcpu-info.default-vcpus", "memory-info.size-in-mib", "current-generation", "supported-usage-class"))
	if err != nil {
		return nil, err
	}
	names := f.list("InstanceType")
	var unknown []string
	for _, n := range names {
		if _, ok := c.types[n]; !ok {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return nil, errf(http.StatusBadRequest, "InvalidInstanceType", "The following supplied instance types do not exist: [%s]", strings.Join(unknown, ", "))
	}
	var list []InstanceType
	for _, it := range c.types {
		if len(names) > 0 && !contains(names, it.Name) {
			continue
		}
		ok := true
		for _, x := range fl {
			switch x.name {
			case "instance-type":
				ok = ok && x.match(it.Name)
			case "processor-info.supported-architecture":
				ok = ok && x.match(it.Arch)
			case "vcpu-info.default-vcpus":
				ok = ok && x.match(strconv.Itoa(it.VCPUs))
			case "memory-info.size-in-mib":
				ok = ok && x.match(strconv.Itoa(it.MemoryMiB))
			case "current-generation":
				ok = ok && x.match("true")
			case "supported-usage-class":
				ok = ok && x.match("on-demand", "spot")
			}
		}
		if ok {
			list = append(list, it)
		}
	}
	slices.SortFunc(list, func(a, b InstanceType) int { return strings.Compare(a.Name, b.Name) })
	pageList, next, err := page(list, func(it InstanceType) string { return it.Name }, f, min(c.knobs.PageSize, 100), 5)
	if err != nil {
		return nil, err
	}
	resp := &describeInstanceTypesResponse{Types: items[xmlInstanceTypeInfo]{}, NextToken: next}
	for _, it := range pageList {
		x := xmlInstanceTypeInfo{InstanceType: it.Name, CurrentGeneration: true, UsageClasses: items[string]{"on-demand", "spot"},
			RootDeviceTypes: items[string]{"ebs"}, Virtualization: items[string]{"hvm"}, Hypervisor: "nitro",
			DedicatedHostsSupported: true, AutoRecoverySupported: true}
		x.Processor.Architectures = items[string]{it.Arch}
		x.VCpu.DefaultVCpus, x.VCpu.DefaultCores, x.VCpu.DefaultThreadsPerCore = it.VCPUs, max(1, it.VCPUs/2), min(2, it.VCPUs)
		x.Memory.SizeInMiB = it.MemoryMiB
		resp.Types = append(resp.Types, x)
	}
	return resp, nil
}

// seedImage adds a public image (with its root snapshot) that exists from
// the start.
func (c *Cloud) seedImage(si SeedImage, now time.Time) {
	snap := &snapshot{ID: newID("snap"), Size: 8, State: "completed", Progress: 100, Started: si.Created, Owner: si.Owner, Tags: map[string]string{}}
	c.snapshots[snap.ID] = snap
	arch := si.Arch
	if arch == "" {
		arch = "x86_64"
	}
	created := si.Created
	if created.IsZero() {
		created = now
	}
	owner := si.Owner
	if owner == "" {
		owner = "136693071363"
	}
	c.images[si.ID] = &image{ID: si.ID, Name: si.Name, State: "available", Arch: arch, EnaSupport: true,
		RootDevice: "/dev/xvda", Virtualization: "hvm", BootMode: "uefi-preferred", Owner: owner, Public: true,
		Created: created, AvailableAt: created, ImageType: "machine", Tags: map[string]string{},
		Devices: []blockDevice{{DeviceName: "/dev/xvda", SnapshotID: snap.ID, Size: 8, Type: "gp3", DeleteOnEnd: true}}}
}

func (c *Cloud) imageXML(im *image) xmlImage {
	x := xmlImage{ImageID: im.ID, ImageLocation: im.Owner + "/" + im.Name, State: im.State, OwnerID: im.Owner,
		CreationDate: ts(im.Created), IsPublic: im.Public, Architecture: im.Arch, ImageType: im.ImageType, Name: im.Name,
		Description: im.Description, RootDeviceType: "ebs", RootDeviceName: im.RootDevice, BlockDevices: items[xmlBlockDevice]{},
		VirtualizationType: im.Virtualization, Tags: tagSet(im.Tags), Hypervisor: "xen", EnaSupport: im.EnaSupport,
		BootMode: im.BootMode, ImdsSupport: im.ImdsSupport, PlatformDetails: "Linux/UNIX", UsageOperation: "RunInstances"}
	if im.Owner == "136693071363" || im.Owner == "099720109477" {
		x.OwnerAlias = "amazon"
	}
	for _, d := range im.Devices {
		xd := xmlBlockDevice{DeviceName: d.DeviceName}
		if d.NoDevice {
			empty := ""
			xd.NoDevice = &empty
		} else {
			xd.Ebs = &xmlEbs{SnapshotID: d.SnapshotID, VolumeSize: d.Size, DeleteOnTermination: d.DeleteOnEnd, VolumeType: d.Type,
				Iops: d.Iops, Throughput: d.Throughput, Encrypted: d.Encrypted}
		}
		x.BlockDevices = append(x.BlockDevices, xd)
	}
	if im.State == "failed" {
		x.StateReason = &xmlStateReason{Code: "Client.InvalidSnapshot", Message: "The snapshot could not be used"}
	}
	return x
}

type describeImagesResponse struct {
	meta
	Images    items[xmlImage] `xml:"imagesSet"`
	NextToken string          `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeImages(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("name", "image-id", "state", "tag-key", "tag-value", "architecture", "owner-id", "owner-alias",
		"is-public", "image-type", "root-device-type", "virtualization-type", "description", "block-device-mapping.snapshot-id", "creation-date"))
	if err != nil {
		return nil, err
	}
	ids := f.list("ImageId")
	for _, id := range ids {
		if !wellFormed(id, "ami") {
			return nil, malformed(id, "InvalidAMIID")
		}
		if im := c.images[id]; im == nil || im.State == "deregistered" {
			return nil, notFound(id)
		}
	}
	owners := f.list("Owner")
	var list []*image
	for _, im := range c.images {
		if im.State == "deregistered" || (!im.Public && im.Owner != c.account) {
			continue
		}
		if len(ids) > 0 && !contains(ids, im.ID) {
			continue
		}
		if len(owners) > 0 && !slices.ContainsFunc(owners, func(o string) bool {
			return o == im.Owner || (o == "self" && im.Owner == c.account) || (o == "amazon" && (im.Owner == "136693071363" || im.Owner == "099720109477"))
		}) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(im.Tags); isTag {
				ok = ok && m
				continue
			}
			var vals []string
			switch x.name {
			case "name":
				vals = []string{im.Name}
			case "image-id":
				vals = []string{im.ID}
			case "state":
				vals = []string{im.State}
			case "architecture":
				vals = []string{im.Arch}
			case "owner-id":
				vals = []string{im.Owner}
			case "owner-alias":
				if im.Owner != c.account {
					vals = []string{"amazon"}
				}
			case "is-public":
				vals = []string{strconv.FormatBool(im.Public)}
			case "image-type":
				vals = []string{im.ImageType}
			case "root-device-type":
				vals = []string{"ebs"}
			case "virtualization-type":
				vals = []string{im.Virtualization}
			case "description":
				vals = []string{im.Description}
			case "creation-date":
				vals = []string{im.Created.UTC().Format("2006-01-02T15:04:05.000Z")}
			case "block-device-mapping.snapshot-id":
				for _, d := range im.Devices {
					vals = append(vals, d.SnapshotID)
				}
			}
			ok = ok && x.match(vals...)
		}
		if ok {
			list = append(list, im)
		}
	}
	slices.SortFunc(list, func(a, b *image) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(im *image) string { return im.ID }, f, c.knobs.PageSize, 5)
	if err != nil {
		return nil, err
	}
	resp := &describeImagesResponse{Images: items[xmlImage]{}, NextToken: next}
	for _, im := range pageList {
		resp.Images = append(resp.Images, c.imageXML(im))
	}
	return resp, nil
}

type registerImageResponse struct {
	meta
	ImageID string `xml:"imageId"`
}

func (c *Cloud) registerImage(f form, now time.Time) (response, *apiError) {
	name := f.get("Name")
	if name == "" {
		return nil, missing("Name")
	}
	if len(name) < 3 || len(name) > 128 {
		return nil, badParam("AMI names must be between 3 and 128 characters long")
	}
	for _, im := range c.images {
		if im.Name == name && im.Owner == c.account && im.State != "deregistered" {
			return nil, errf(http.StatusBadRequest, "InvalidAMIName.Duplicate", "AMI name %s is already in use by AMI %s", name, im.ID)
		}
	}
	arch := f.get("Architecture")
	if arch == "" {
		arch = "x86_64"
	}
	if !slices.Contains([]string{"i386", "x86_64", "arm64", "x86_64_mac", "arm64_mac"}, arch) {
		return nil, badParam("Invalid value '%s' for architecture. Expected i386, x86_64, arm64, x86_64_mac or arm64_mac.", arch)
	}
	root := f.get("RootDeviceName")
	if root == "" {
		return nil, missing("RootDeviceName")
	}
	ena, err := f.bool("EnaSupport", false)
	if err != nil {
		return nil, err
	}
	imds := f.get("ImdsSupport")
	if imds != "" && imds != "v2.0" {
		return nil, badParam("Invalid value '%s' for ImdsSupport. Expected v2.0.", imds)
	}
	virt := f.get("VirtualizationType")
	if virt == "" {
		virt = "hvm"
	}
	bootMode := f.get("BootMode")
	if bootMode != "" && !slices.Contains([]string{"legacy-bios", "uefi", "uefi-preferred"}, bootMode) {
		return nil, badParam("Invalid value '%s' for BootMode.", bootMode)
	}
	tags, err := f.tagSpecs("TagSpecification", "image", "snapshot")
	if err != nil {
		return nil, err
	}
	var devices []blockDevice
	hasRoot := false
	for _, bd := range f.structs("BlockDeviceMapping") {
		d, err := parseBlockDevice(bd)
		if err != nil {
			return nil, err
		}
		if d.SnapshotID != "" {
			s := c.snapshots[d.SnapshotID]
			if s == nil {
				return nil, notFound(d.SnapshotID)
			}
			if s.State != "completed" {
				return nil, errf(http.StatusBadRequest, "IncorrectState", "Snapshot %s is not completed (state: %s)", s.ID, s.State)
			}
			if d.Size == 0 {
				d.Size = s.Size
			} else if d.Size < s.Size {
				return nil, errf(http.StatusBadRequest, "InvalidBlockDeviceMapping", "Volume of size %dGB is smaller than snapshot '%s', expect size >= %dGB", d.Size, s.ID, s.Size)
			}
		}
		if d.Type == "" {
			d.Type = "gp2"
		}
		if d.DeviceName == root {
			hasRoot = true
		}
		devices = append(devices, d)
	}
	if !hasRoot {
		return nil, badParam("The root device name %s is not in the block device mapping", root)
	}
	im := &image{ID: newID("ami"), Name: name, Description: f.get("Description"), State: "pending", Arch: arch,
		EnaSupport: ena, ImdsSupport: imds, BootMode: bootMode, RootDevice: root, Virtualization: virt, Devices: devices,
		Tags: cloneTags(tags["image"]), Owner: c.account, Created: now, AvailableAt: now.Add(c.knobs.ImportTime.D() / 2), ImageType: "machine"}
	c.images[im.ID] = im
	for _, d := range devices {
		if s := c.snapshots[d.SnapshotID]; s != nil {
			for k, v := range tags["snapshot"] {
				s.Tags[k] = v
			}
		}
	}
	return &registerImageResponse{ImageID: im.ID}, nil
}

type deregisterImageResponse struct {
	meta
	Return bool `xml:"return"`
}

func (c *Cloud) deregisterImage(f form, _ time.Time) (response, *apiError) {
	id := f.get("ImageId")
	if id == "" {
		return nil, missing("ImageId")
	}
	if !wellFormed(id, "ami") {
		return nil, malformed(id, "InvalidAMIID")
	}
	im := c.images[id]
	if im == nil || im.State == "deregistered" {
		return nil, notFound(id)
	}
	if im.Owner != c.account {
		return nil, errf(http.StatusBadRequest, "AuthFailure", "Not authorized for image:%s", id)
	}
	delSnaps, err := f.bool("DeleteAssociatedSnapshots", false)
	if err != nil {
		return nil, err
	}
	delete(c.images, id)
	if delSnaps {
		for _, d := range im.Devices {
			delete(c.snapshots, d.SnapshotID)
		}
	}
	return &deregisterImageResponse{Return: true}, nil
}

func (c *Cloud) snapshotXML(s *snapshot) xmlSnapshot {
	return xmlSnapshot{SnapshotID: s.ID, VolumeID: orDefault(s.VolumeID, "vol-ffffffff"), Status: s.State, StartTime: ts(s.Started),
		Progress: strconv.Itoa(s.Progress) + "%", OwnerID: s.Owner, VolumeSize: s.Size, Description: s.Description,
		StorageTier: "standard", Tags: tagSet(s.Tags)}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

type describeSnapshotsResponse struct {
	meta
	Snapshots items[xmlSnapshot] `xml:"snapshotSet"`
	NextToken string             `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeSnapshots(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("status", "snapshot-id", "tag-key", "tag-value", "volume-size", "description", "owner-id", "volume-id", "progress", "start-time", "storage-tier"))
	if err != nil {
		return nil, err
	}
	ids := f.list("SnapshotId")
	for _, id := range ids {
		if !wellFormed(id, "snap") {
			return nil, malformed(id, "InvalidSnapshotID")
		}
		if c.snapshots[id] == nil {
			return nil, notFound(id)
		}
	}
	owners := f.list("Owner")
	var list []*snapshot
	for _, s := range c.snapshots {
		if len(ids) > 0 && !contains(ids, s.ID) {
			continue
		}
		if len(ids) == 0 && len(owners) == 0 && s.Owner != c.account {
			continue // public snapshots of others are not listed without an owner
		}
		if len(owners) > 0 && !slices.ContainsFunc(owners, func(o string) bool {
			return o == s.Owner || (o == "self" && s.Owner == c.account) || (o == "amazon" && s.Owner != c.account)
		}) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(s.Tags); isTag {
				ok = ok && m
				continue
			}
			switch x.name {
			case "status":
				ok = ok && x.match(s.State)
			case "snapshot-id":
				ok = ok && x.match(s.ID)
			case "volume-size":
				ok = ok && x.match(strconv.Itoa(s.Size))
			case "description":
				ok = ok && x.match(s.Description)
			case "owner-id":
				ok = ok && x.match(s.Owner)
			case "volume-id":
				ok = ok && x.match(s.VolumeID)
			case "progress":
				ok = ok && x.match(strconv.Itoa(s.Progress)+"%")
			case "storage-tier":
				ok = ok && x.match("standard")
			case "start-time":
				ok = ok && x.match(s.Started.UTC().Format("2006-01-02T15:04:05.000Z"))
			}
		}
		if ok {
			list = append(list, s)
		}
	}
	slices.SortFunc(list, func(a, b *snapshot) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(s *snapshot) string { return s.ID }, f, c.knobs.PageSize, 5)
	if err != nil {
		return nil, err
	}
	resp := &describeSnapshotsResponse{Snapshots: items[xmlSnapshot]{}, NextToken: next}
	for _, s := range pageList {
		resp.Snapshots = append(resp.Snapshots, c.snapshotXML(s))
	}
	return resp, nil
}

func (c *Cloud) deleteSnapshot(f form, _ time.Time) (response, *apiError) {
	id := f.get("SnapshotId")
	if id == "" {
		return nil, missing("SnapshotId")
	}
	if !wellFormed(id, "snap") {
		return nil, malformed(id, "InvalidSnapshotID")
	}
	s := c.snapshots[id]
	if s == nil {
		return nil, notFound(id)
	}
	if s.Owner != c.account {
		return nil, errf(http.StatusBadRequest, "AuthFailure", "Not authorized for snapshot:%s", id)
	}
	for _, im := range c.images {
		for _, d := range im.Devices {
			if d.SnapshotID == id {
				return nil, errf(http.StatusBadRequest, "InvalidSnapshot.InUse", "The snapshot %s is currently in use by %s", id, im.ID)
			}
		}
	}
	delete(c.snapshots, id)
	return &emptyResponse{Return: true}, nil
}

type describeVolumesResponse struct {
	meta
	Volumes   items[xmlVolume] `xml:"volumeSet"`
	NextToken string           `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeVolumes(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("status", "volume-id", "tag-key", "tag-value", "attachment.instance-id", "attachment.status",
		"attachment.delete-on-termination", "snapshot-id", "availability-zone", "size", "volume-type", "create-time"))
	if err != nil {
		return nil, err
	}
	ids := f.list("VolumeId")
	if len(ids) > 0 && f.has("MaxResults") {
		return nil, errf(http.StatusBadRequest, "InvalidParameterCombination", "The parameter volumeSet cannot be used with the parameter maxResults")
	}
	for _, id := range ids {
		if !wellFormed(id, "vol") {
			return nil, malformed(id, "InvalidVolumeID")
		}
		if c.volumes[id] == nil {
			return nil, notFound(id)
		}
	}
	var list []*volume
	for _, v := range c.volumes {
		if len(ids) > 0 && !contains(ids, v.ID) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(v.Tags); isTag {
				ok = ok && m
				continue
			}
			switch x.name {
			case "status":
				ok = ok && x.match(v.State)
			case "volume-id":
				ok = ok && x.match(v.ID)
			case "attachment.instance-id":
				ok = ok && x.match(v.InstanceID)
			case "attachment.status":
				if v.InstanceID != "" {
					ok = ok && x.match("attached")
				} else {
					ok = false
				}
			case "attachment.delete-on-termination":
				ok = ok && v.InstanceID != "" && x.match(strconv.FormatBool(v.DeleteOnEnd))
			case "snapshot-id":
				ok = ok && x.match(v.SnapshotID)
			case "availability-zone":
				ok = ok && x.match(v.AZ)
			case "size":
				ok = ok && x.match(strconv.Itoa(v.Size))
			case "volume-type":
				ok = ok && x.match(v.Type)
			case "create-time":
				ok = ok && x.match(v.Created.UTC().Format("2006-01-02T15:04:05.000Z"))
			}
		}
		if ok {
			list = append(list, v)
		}
	}
	slices.SortFunc(list, func(a, b *volume) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(v *volume) string { return v.ID }, f, min(c.knobs.PageSize, 500), 5)
	if err != nil {
		return nil, err
	}
	resp := &describeVolumesResponse{Volumes: items[xmlVolume]{}, NextToken: next}
	for _, v := range pageList {
		x := xmlVolume{VolumeID: v.ID, Size: v.Size, SnapshotID: v.SnapshotID, AZ: v.AZ, Status: v.State, CreateTime: ts(v.Created),
			Attachments: items[xmlVolumeAttachment]{}, Tags: tagSet(v.Tags), VolumeType: v.Type, Iops: v.Iops, Throughput: v.Throughput}
		if v.InstanceID != "" {
			x.Attachments = append(x.Attachments, xmlVolumeAttachment{VolumeID: v.ID, InstanceID: v.InstanceID, Device: v.Device,
				Status: "attached", AttachTime: ts(v.AttachTime), DeleteOnTermination: v.DeleteOnEnd})
		}
		resp.Volumes = append(resp.Volumes, x)
	}
	return resp, nil
}

func (c *Cloud) deleteVolume(f form, now time.Time) (response, *apiError) {
	id := f.get("VolumeId")
	if id == "" {
		return nil, missing("VolumeId")
	}
	if !wellFormed(id, "vol") {
		return nil, malformed(id, "InvalidVolumeID")
	}
	v := c.volumes[id]
	if v == nil {
		return nil, notFound(id)
	}
	if v.InstanceID != "" {
		return nil, errf(http.StatusBadRequest, "VolumeInUse", "Volume %s is currently attached to %s", id, v.InstanceID)
	}
	if v.State == "deleting" {
		return nil, errf(http.StatusBadRequest, "IncorrectState", "The volume '%s' is 'deleting'", id)
	}
	v.State, v.GoneAt = "deleting", now.Add(c.knobs.TerminateTime.D())
	return &emptyResponse{Return: true}, nil
}

// Import tasks.

// importTaskLimit is how many import tasks of a kind may be active at once,
// as in AWS.
const importTaskLimit = 20

// importFormats are the disk formats VM Import takes.
var importFormats = []string{"VHD", "VHDX", "VMDK", "RAW", "OVA"}

// importSource reads a disk container's source and checks the S3 object.
func (c *Cloud) importSource(dc form, kind string) (*importTask, *apiError) {
	t := &importTask{Kind: kind, Format: strings.ToUpper(dc.get("Format")), Bucket: dc.get("UserBucket.S3Bucket"), Key: dc.get("UserBucket.S3Key"), URL: dc.get("Url")}
	if t.Format == "" {
		return nil, missing(dc.key("Format"))
	}
	if !slices.Contains(importFormats, t.Format) || (kind == "snapshot" && (t.Format == "OVA" || t.Format == "VHDX")) {
		return nil, badParam("Invalid value '%s' for disk image format. Expected one of: VHD, VMDK, RAW%s.", t.Format, map[bool]string{true: ", VHDX, OVA", false: ""}[kind == "image"])
	}
	if t.URL != "" {
		bucket, key, ok := strings.Cut(strings.TrimPrefix(t.URL, "s3://"), "/")
		if !ok || !strings.HasPrefix(t.URL, "s3://") {
			return nil, badParam("Only s3:// URLs are taken by this cloud, got %s", t.URL)
		}
		t.Bucket, t.Key = bucket, key
	}
	if t.Bucket == "" || t.Key == "" {
		return nil, missing(dc.key("UserBucket"))
	}
	obj, err := c.s3back.HeadObject(t.Bucket, t.Key)
	if err != nil {
		return nil, errf(http.StatusBadRequest, "InvalidParameter", "The given S3 object s3://%s/%s does not exist or is not readable: %v", t.Bucket, t.Key, err)
	}
	t.Size = obj.Size
	active := 0
	for _, x := range c.imports {
		if x.Kind == kind && x.State == "active" {
			active++
		}
	}
	if active >= importTaskLimit {
		return nil, errf(http.StatusBadRequest, "ResourceCountLimitExceeded", "You have reached the limit of %d active import %s tasks", importTaskLimit, kind)
	}
	return t, nil
}

type importSnapshotResponse struct {
	meta
	Description string                `xml:"description,omitempty"`
	TaskID      string                `xml:"importTaskId"`
	Detail      xmlSnapshotTaskDetail `xml:"snapshotTaskDetail"`
	Tags        items[xmlTag]         `xml:"tagSet"`
}

func (c *Cloud) importSnapshot(f form, now time.Time) (response, *apiError) {
	if tok := f.get("ClientToken"); tok != "" {
		if id, ok := c.tokens["import/"+tok]; ok && c.imports[id] != nil {
			t := c.imports[id]
			return &importSnapshotResponse{Description: t.Description, TaskID: t.ID, Detail: c.snapshotTaskDetail(t), Tags: tagSet(t.Tags)}, nil
		}
	}
	if !f.hasSub("DiskContainer") {
		return nil, missing("DiskContainer")
	}
	t, err := c.importSource(f.sub("DiskContainer"), "snapshot")
	if err != nil {
		return nil, err
	}
	tags, err := f.tagSpecs("TagSpecification", "import-snapshot-task")
	if err != nil {
		return nil, err
	}
	t.ID, t.Description, t.State, t.StatusMsg, t.Started = newID("import-snap"), f.get("Description"), "active", "pending", now
	t.DoneAt, t.Tags = now.Add(c.knobs.ImportTime.D()), cloneTags(tags["import-snapshot-task"])
	c.imports[t.ID] = t
	if tok := f.get("ClientToken"); tok != "" {
		c.tokens["import/"+tok] = t.ID
	}
	return &importSnapshotResponse{Description: t.Description, TaskID: t.ID, Detail: c.snapshotTaskDetail(t), Tags: tagSet(t.Tags)}, nil
}

// completeImport finishes an import task: its snapshot (and image) exist.
func (c *Cloud) completeImport(t *importTask, now time.Time) {
	gib := int((t.Size + 1<<30 - 1) >> 30)
	snap := &snapshot{ID: newID("snap"), Size: max(1, gib), State: "completed", Progress: 100, Started: t.Started, CompleteAt: now,
		Owner: c.account, Tags: map[string]string{}, Description: fmt.Sprintf("Created by AWS-VMImport service for %s", t.ID)}
	c.snapshots[snap.ID] = snap
	t.SnapshotID, t.State, t.StatusMsg = snap.ID, "completed", ""
	if t.Kind == "image" {
		im := &image{ID: newID("ami"), Name: t.ID, Description: t.Description, State: "available", Arch: orDefault(t.Arch, "x86_64"),
			EnaSupport: true, BootMode: t.BootMode, RootDevice: "/dev/sda1", Virtualization: "hvm", Owner: c.account, Created: now, AvailableAt: now,
			ImageType: "machine", Tags: map[string]string{},
			Devices: []blockDevice{{DeviceName: "/dev/sda1", SnapshotID: snap.ID, Size: snap.Size, Type: "gp2", DeleteOnEnd: true}}}
		c.images[im.ID] = im
		t.ImageID = im.ID
	}
}

func (c *Cloud) taskProgress(t *importTask, now time.Time) (string, string) {
	if t.State != "active" {
		return "", t.StatusMsg
	}
	total := t.DoneAt.Sub(t.Started)
	p := 0
	if total > 0 {
		p = int(100 * now.Sub(t.Started) / total)
	}
	msg := "pending"
	switch {
	case p >= 60:
		msg = "converting"
	case p >= 30:
		msg = "validated"
	case p >= 10:
		msg = "validating"
	}
	return strconv.Itoa(max(0, min(p, 99))), msg
}

func (c *Cloud) snapshotTaskDetail(t *importTask) xmlSnapshotTaskDetail {
	progress, msg := c.taskProgress(t, time.Now())
	d := xmlSnapshotTaskDetail{Description: t.Description, DiskImageSize: float64(t.Size), Format: t.Format, Progress: progress,
		SnapshotID: t.SnapshotID, Status: t.State, StatusMessage: msg, URL: t.URL}
	if t.Bucket != "" {
		d.UserBucket = &xmlUserBucket{S3Bucket: t.Bucket, S3Key: t.Key}
	}
	return d
}

type xmlImportSnapshotTask struct {
	Description string                `xml:"description,omitempty"`
	TaskID      string                `xml:"importTaskId"`
	Detail      xmlSnapshotTaskDetail `xml:"snapshotTaskDetail"`
	Tags        items[xmlTag]         `xml:"tagSet"`
}

type describeImportSnapshotTasksResponse struct {
	meta
	Tasks     items[xmlImportSnapshotTask] `xml:"importSnapshotTaskSet"`
	NextToken string                       `xml:"nextToken,omitempty"`
}

// importTasks lists the tasks of a kind that a Describe call asks for.
func (c *Cloud) importTasks(f form, kind string) ([]*importTask, string, *apiError) {
	fl, err := f.filters("Filters", knownFilters("task-state", "tag-key", "tag-value"))
	if err != nil {
		return nil, "", err
	}
	ids := f.list("ImportTaskId")
	for _, id := range ids {
		if t := c.imports[id]; t == nil || t.Kind != kind {
			return nil, "", notFound(id)
		}
	}
	var list []*importTask
	for _, t := range c.imports {
		if t.Kind != kind || (len(ids) > 0 && !contains(ids, t.ID)) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(t.Tags); isTag {
				ok = ok && m
			} else if x.name == "task-state" {
				ok = ok && x.match(t.State)
			}
		}
		if ok {
			list = append(list, t)
		}
	}
	slices.SortFunc(list, func(a, b *importTask) int { return strings.Compare(a.ID, b.ID) })
	return page(list, func(t *importTask) string { return t.ID }, f, c.knobs.PageSize, 1)
}

func (c *Cloud) describeImportSnapshotTasks(f form, _ time.Time) (response, *apiError) {
	list, next, err := c.importTasks(f, "snapshot")
	if err != nil {
		return nil, err
	}
	resp := &describeImportSnapshotTasksResponse{Tasks: items[xmlImportSnapshotTask]{}, NextToken: next}
	for _, t := range list {
		resp.Tasks = append(resp.Tasks, xmlImportSnapshotTask{Description: t.Description, TaskID: t.ID, Detail: c.snapshotTaskDetail(t), Tags: tagSet(t.Tags)})
	}
	return resp, nil
}

type xmlImportImageTask struct {
	Architecture string                   `xml:"architecture,omitempty"`
	Description  string                   `xml:"description,omitempty"`
	ImageID      string                   `xml:"imageId,omitempty"`
	TaskID       string                   `xml:"importTaskId"`
	Platform     string                   `xml:"platform,omitempty"`
	Progress     string                   `xml:"progress,omitempty"`
	Snapshots    items[xmlSnapshotDetail] `xml:"snapshotDetailSet"`
	Status       string                   `xml:"status"`
	StatusMsg    string                   `xml:"statusMessage,omitempty"`
	Tags         items[xmlTag]            `xml:"tagSet"`
	BootMode     string                   `xml:"bootMode,omitempty"`
}

func (c *Cloud) imageTaskXML(t *importTask) xmlImportImageTask {
	progress, msg := c.taskProgress(t, time.Now())
	sd := xmlSnapshotDetail{Description: t.Description, DeviceName: "/dev/sda1", DiskImageSize: float64(t.Size), Format: t.Format,
		SnapshotID: t.SnapshotID, Status: t.State, Progress: progress, StatusMessage: msg}
	if t.Bucket != "" {
		sd.UserBucket = &xmlUserBucket{S3Bucket: t.Bucket, S3Key: t.Key}
	}
	return xmlImportImageTask{Architecture: t.Arch, Description: t.Description, ImageID: t.ImageID, TaskID: t.ID, Platform: t.Platform,
		Progress: progress, Snapshots: items[xmlSnapshotDetail]{sd}, Status: t.State, StatusMsg: msg, Tags: tagSet(t.Tags), BootMode: t.BootMode}
}

type importImageResponse struct {
	meta
	xmlImportImageTask
}

func (c *Cloud) importImage(f form, now time.Time) (response, *apiError) {
	if tok := f.get("ClientToken"); tok != "" {
		if id, ok := c.tokens["import/"+tok]; ok && c.imports[id] != nil {
			return &importImageResponse{xmlImportImageTask: c.imageTaskXML(c.imports[id])}, nil
		}
	}
	disks := f.structs("DiskContainer")
	if len(disks) == 0 {
		return nil, missing("DiskContainer")
	}
	if len(disks) > 1 {
		return nil, badParam("This cloud imports images of one disk")
	}
	t, err := c.importSource(disks[0], "image")
	if err != nil {
		return nil, err
	}
	tags, err := f.tagSpecs("TagSpecification", "import-image-task")
	if err != nil {
		return nil, err
	}
	t.Arch, t.Platform, t.BootMode = f.get("Architecture"), f.get("Platform"), f.get("BootMode")
	if t.Arch != "" && t.Arch != "x86_64" && t.Arch != "arm64" && t.Arch != "i386" {
		return nil, badParam("Invalid value '%s' for Architecture.", t.Arch)
	}
	t.ID, t.Description, t.State, t.StatusMsg, t.Started = newID("import-ami"), f.get("Description"), "active", "pending", now
	t.DoneAt, t.Tags = now.Add(2*c.knobs.ImportTime.D()), cloneTags(tags["import-image-task"])
	c.imports[t.ID] = t
	if tok := f.get("ClientToken"); tok != "" {
		c.tokens["import/"+tok] = t.ID
	}
	return &importImageResponse{xmlImportImageTask: c.imageTaskXML(t)}, nil
}

type describeImportImageTasksResponse struct {
	meta
	Tasks     items[xmlImportImageTask] `xml:"importImageTaskSet"`
	NextToken string                    `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeImportImageTasks(f form, _ time.Time) (response, *apiError) {
	list, next, err := c.importTasks(f, "image")
	if err != nil {
		return nil, err
	}
	resp := &describeImportImageTasksResponse{Tasks: items[xmlImportImageTask]{}, NextToken: next}
	for _, t := range list {
		resp.Tasks = append(resp.Tasks, c.imageTaskXML(t))
	}
	return resp, nil
}

type cancelImportResponse struct {
	meta
	TaskID   string `xml:"importTaskId"`
	Previous string `xml:"previousState"`
	State    string `xml:"state"`
}

func (c *Cloud) cancelImportTask(f form, now time.Time) (response, *apiError) {
	id := f.get("ImportTaskId")
	if id == "" {
		return nil, missing("ImportTaskId")
	}
	t := c.imports[id]
	if t == nil {
		return nil, notFound(id)
	}
	if t.State != "active" {
		return nil, errf(http.StatusBadRequest, "IncorrectState", "The import task %s is %s and cannot be cancelled", id, t.State)
	}
	t.State, t.StatusMsg, t.DoneAt = "deleting", "Cancelled", now
	return &cancelImportResponse{TaskID: id, Previous: "active", State: "deleting"}, nil
}
