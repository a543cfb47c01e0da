package aws

import (
	"encoding/base64"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// parseLaunchSpec reads what RunInstances (or a launch template's data,
// with the template's key names) asks for.
func parseLaunchSpec(f form, template bool) (launchSpec, *apiError) {
	var s launchSpec
	s.ImageID = f.get("ImageId")
	s.InstanceType = f.get("InstanceType")
	s.KeyName = f.get("KeyName")
	s.SubnetID = f.get("SubnetId")
	s.Groups = f.list("SecurityGroupId")
	s.UserData = f.get("UserData")
	s.ClientToken = f.get("ClientToken")
	var err *apiError
	if s.EbsOptimized, err = f.bool("EbsOptimized", false); err != nil {
		return s, err
	}
	if f.hasSub("IamInstanceProfile") {
		s.IAMArn, s.IAMName = f.get("IamInstanceProfile.Arn"), f.get("IamInstanceProfile.Name")
		if s.IAMArn != "" && s.IAMName != "" {
			return s, errf(http.StatusBadRequest, "InvalidParameterCombination", "The parameter 'iamInstanceProfile.name' may not be used in combination with 'iamInstanceProfile.arn'")
		}
	}
	if f.hasSub("MetadataOptions") {
		s.HTTPTokens, s.HTTPEndpoint = f.get("MetadataOptions.HttpTokens"), f.get("MetadataOptions.HttpEndpoint")
		if s.HTTPTokens != "" && s.HTTPTokens != "optional" && s.HTTPTokens != "required" {
			return s, badParam("Invalid value '%s' for HttpTokens. Expected optional or required.", s.HTTPTokens)
		}
		if s.HTTPEndpoint != "" && s.HTTPEndpoint != "enabled" && s.HTTPEndpoint != "disabled" {
			return s, badParam("Invalid value '%s' for HttpEndpoint. Expected enabled or disabled.", s.HTTPEndpoint)
		}
	}
	if mt := f.get("InstanceMarketOptions.MarketType"); mt != "" {
		switch mt {
		case "spot":
			s.Spot = true
			s.SpotMaxPrice = f.get("InstanceMarketOptions.SpotOptions.MaxPrice")
			if st := f.get("InstanceMarketOptions.SpotOptions.SpotInstanceType"); st != "" && st != "one-time" && st != "persistent" {
				return s, badParam("Invalid value '%s' for SpotInstanceType.", st)
			}
		case "capacity-block":
			return s, badParam("Capacity blocks are not offered by this cloud")
		default:
			return s, badParam("Invalid value '%s' for MarketType. Expected spot or capacity-block.", mt)
		}
	}
	s.AZ = f.get("Placement.AvailabilityZone")
	s.HostID = f.get("Placement.HostId")
	s.Tenancy = f.get("Placement.Tenancy")
	for _, ni := range f.structs("NetworkInterface") {
		if idx, _ := ni.int("DeviceIndex", 0); idx != 0 {
			continue
		}
		if ni.has("AssociatePublicIpAddress") {
			b, err := ni.bool("AssociatePublicIpAddress", true)
			if err != nil {
				return s, err
			}
			s.PublicIP = &b
		}
		if sid := ni.get("SubnetId"); sid != "" {
			if s.SubnetID != "" {
				return s, errf(http.StatusBadRequest, "InvalidParameterCombination", "Network interfaces and an instance-level subnet ID may not be specified on the same request")
			}
			s.SubnetID = sid
		}
		if g := ni.list("SecurityGroupId"); len(g) > 0 {
			if len(s.Groups) > 0 {
				return s, errf(http.StatusBadRequest, "InvalidParameterCombination", "Network interfaces and an instance-level security groups may not be specified on the same request")
			}
			s.Groups = g
		}
		if s.IPv6Count, err = ni.int("Ipv6AddressCount", 0); err != nil {
			return s, err
		}
	}
	if !template {
		if n, err := f.int("Ipv6AddressCount", 0); err != nil {
			return s, err
		} else if n > 0 {
			s.IPv6Count = n
		}
	}
	for _, bd := range f.structs("BlockDeviceMapping") {
		d, err := parseBlockDevice(bd)
		if err != nil {
			return s, err
		}
		s.Devices = append(s.Devices, d)
	}
	allowed := []string{"instance", "volume", "spot-instances-request", "network-interface"}
	if s.Tags, err = f.tagSpecs("TagSpecification", allowed...); err != nil {
		return s, err
	}
	return s, nil
}

func parseBlockDevice(bd form) (blockDevice, *apiError) {
	d := blockDevice{DeviceName: bd.get("DeviceName"), NoDevice: bd.has("NoDevice")}
	if d.DeviceName == "" {
		return d, missing(bd.key("DeviceName"))
	}
	e := bd.sub("Ebs")
	var err *apiError
	d.SnapshotID, d.Type = e.get("SnapshotId"), e.get("VolumeType")
	if d.Size, err = e.int("VolumeSize", 0); err != nil {
		return d, err
	}
	if d.Iops, err = e.int("Iops", 0); err != nil {
		return d, err
	}
	if d.Throughput, err = e.int("Throughput", 0); err != nil {
		return d, err
	}
	if d.DeleteOnEnd, err = e.bool("DeleteOnTermination", true); err != nil {
		return d, err
	}
	if d.Encrypted, err = e.bool("Encrypted", false); err != nil {
		return d, err
	}
	if d.Type != "" && !slices.Contains([]string{"standard", "io1", "io2", "gp2", "gp3", "sc1", "st1"}, d.Type) {
		return d, badParam("Value (%s) for parameter volumeType is invalid. Valid volume types are standard, io1, io2, gp2, gp3, sc1 and st1.", d.Type)
	}
	if d.Throughput > 0 && d.Type != "gp3" {
		return d, badParam("Throughput can only be specified for gp3 volumes")
	}
	if d.Iops > 0 && d.Type != "gp3" && d.Type != "io1" && d.Type != "io2" {
		return d, badParam("IOPS can only be specified for io1, io2 and gp3 volumes")
	}
	return d, nil
}

// checkLaunch validates a launch spec against what exists and returns
// the image and instance type it names.
func (c *Cloud) checkLaunch(s *launchSpec) (*image, InstanceType, *apiError) {
	if s.ImageID == "" {
		return nil, InstanceType{}, missing("ImageId")
	}
	if !wellFormed(s.ImageID, "ami") {
		return nil, InstanceType{}, malformed(s.ImageID, "InvalidAMIID")
	}
	img := c.images[s.ImageID]
	if img == nil || img.State == "deregistered" || (!img.Public && img.Owner != c.account) {
		return nil, InstanceType{}, notFound(s.ImageID)
	}
	if img.State != "available" {
		return nil, InstanceType{}, errf(http.StatusBadRequest, "IncorrectState", "Image %s is not available (state: %s)", img.ID, img.State)
	}
	if s.InstanceType == "" {
		s.InstanceType = "m1.small"
	}
	it, ok := c.types[s.InstanceType]
	if !ok {
		return nil, InstanceType{}, badParam("The instance type '%s' does not exist", s.InstanceType)
	}
	if it.Arch != img.Arch {
		return nil, InstanceType{}, badParam("The architecture '%s' of the specified instance type does not match the architecture '%s' of the specified AMI. Specify an instance type and an AMI that have matching architectures, and try again.", it.Arch, img.Arch)
	}
	if s.AZ != "" && !contains(c.zones(), s.AZ) {
		return nil, InstanceType{}, badParam("Invalid availability zone: [%s]", s.AZ)
	}
	if s.SubnetID != "" && !wellFormed(s.SubnetID, "subnet") {
		return nil, InstanceType{}, malformed(s.SubnetID, "InvalidSubnetID")
	}
	for _, g := range s.Groups {
		if !wellFormed(g, "sg") {
			return nil, InstanceType{}, malformed(g, "InvalidGroupId")
		}
	}
	if s.UserData != "" {
		if _, err := base64.StdEncoding.DecodeString(s.UserData); err != nil {
			return nil, InstanceType{}, badParam("Invalid BASE64 encoding of user data.")
		}
		if len(s.UserData) > 16384*4/3+4 {
			return nil, InstanceType{}, badParam("User data is limited to 16384 bytes")
		}
	}
	if s.HostID != "" {
		h := c.hosts[s.HostID]
		if h == nil || h.State == "released" {
			return nil, InstanceType{}, notFound(s.HostID)
		}
		if h.InstanceType != s.InstanceType {
			return nil, InstanceType{}, errf(http.StatusBadRequest, "InvalidHostConfiguration", "Host %s supports instance type %s, not %s", h.ID, h.InstanceType, s.InstanceType)
		}
		if len(h.Instances) > 0 {
			return nil, InstanceType{}, errf(http.StatusInternalServerError, "InsufficientHostCapacity", "Host %s has no room for another %s instance", h.ID, s.InstanceType)
		}
		if s.Spot {
			return nil, InstanceType{}, errf(http.StatusBadRequest, "InvalidParameterCombination", "Spot instances cannot run on dedicated hosts")
		}
		if s.AZ == "" {
			s.AZ = h.AZ
		} else if s.AZ != h.AZ {
			return nil, InstanceType{}, badParam("Host %s is in %s, not %s", h.ID, h.AZ, s.AZ)
		}
	}
	for _, d := range s.Devices {
		if d.DeviceName == img.RootDevice && d.Size > 0 {
			if snap := rootSnapshotSize(img); d.Size < snap {
				return nil, InstanceType{}, errf(http.StatusBadRequest, "InvalidBlockDeviceMapping", "Volume of size %dGB is smaller than snapshot '%s', expect size >= %dGB", d.Size, img.Devices[0].SnapshotID, snap)
			}
		}
	}
	return img, it, nil
}

func rootSnapshotSize(img *image) int {
	for _, d := range img.Devices {
		if d.DeviceName == img.RootDevice {
			return d.Size
		}
	}
	return 8
}

// usedVCPUs adds up the vCPUs of live instances by quota code.
func (c *Cloud) usedVCPUs() map[string]int {
	used := map[string]int{}
	for _, in := range c.instances {
		if in.State != "pending" && in.State != "running" {
			continue
		}
		if code := awsquota.Code(in.Type, in.Spot); code != "" {
			used[code] += c.types[in.Type].VCPUs
		}
	}
	return used
}

// capacityError takes one refusal of the NoCapacity knob for a launch,
// if it has one left.
func (c *Cloud) capacityError(typ string, spot bool, az string) *apiError {
	key := typ
	if spot {
		key = "spot/" + typ
	}
	n, ok := c.knobs.NoCapacity[key]
	if !ok || n == 0 {
		return nil
	}
	if n > 0 {
		c.knobs.NoCapacity[key] = n - 1
	}
	if spot {
		return errf(http.StatusInternalServerError, "InsufficientInstanceCapacity", "There is no Spot capacity available that matches your request.")
	}
	return errf(http.StatusInternalServerError, "InsufficientInstanceCapacity", "We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). Our system will be working on provisioning additional capacity. You can currently get %s capacity by not specifying an Availability Zone in your request or choosing %s.", typ, az, typ, strings.Join(c.zones()[1:], ", "))
}

// quotaError checks that count more instances fit the vCPU quota.
func (c *Cloud) quotaError(it InstanceType, spot bool, count int) *apiError {
	code := awsquota.Code(it.Name, spot)
	if code == "" {
		return nil
	}
	limit, ok := c.knobs.Quotas[code]
	if !ok {
		return nil
	}
	if float64(c.usedVCPUs()[code]+count*it.VCPUs) <= limit {
		return nil
	}
	if spot {
		return errf(http.StatusBadRequest, "MaxSpotInstanceCountExceeded", "Max spot instance count exceeded")
	}
	return errf(http.StatusBadRequest, "VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of %d allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.", int(math.Round(limit)))
}

// launch makes count instances of a checked spec. It returns them in a
// new reservation.
func (c *Cloud) launch(s launchSpec, img *image, it InstanceType, count int, now time.Time, fleetID string) (string, []*instance) {
	rid := newID("r")
	var out []*instance
	az := s.AZ
	if az == "" {
		az = c.zones()[rand.IntN(3)]
	}
	for range count {
		in := &instance{
			ID: newID("i"), ReservationID: rid, ImageID: img.ID, Type: it.Name, Arch: it.Arch,
			KeyName: s.KeyName, SubnetID: s.SubnetID, AZ: az, State: "pending",
			LaunchTime: now, RunningAt: now.Add(c.knobs.BootTime.D()),
			Groups: s.Groups, Tags: cloneTags(s.Tags["instance"]), ClientToken: s.ClientToken,
			EbsOptimized: s.EbsOptimized, RootDevice: img.RootDevice, HostID: s.HostID,
			Tenancy: "default", UserData: s.UserData, FleetID: fleetID,
			HTTPTokens: s.HTTPTokens, HTTPEndpoint: s.HTTPEndpoint,
		}
		if in.SubnetID == "" {
			in.SubnetID = "subnet-0d0e0f00000000001"
		}
		in.VpcID = "vpc-0d0e0f00000000001"
		if len(in.Groups) == 0 {
			in.Groups = []string{"sg-0d0e0f00000000001"}
		}
		if s.HostID != "" {
			in.Tenancy = "host"
			c.hosts[s.HostID].Instances = append(c.hosts[s.HostID].Instances, in.ID)
		}
		if in.HTTPTokens == "" {
			in.HTTPTokens = "optional"
			if img.ImdsSupport == "v2.0" {
				in.HTTPTokens = "required"
			}
		}
		if in.HTTPEndpoint == "" {
			in.HTTPEndpoint = "enabled"
		}
		switch {
		case s.IAMArn != "":
			in.IAMProfileArn = s.IAMArn
		case s.IAMName != "":
			in.IAMProfileArn = "arn:aws:iam::" + c.account + ":instance-profile/" + s.IAMName
		}
		in.PrivateIP = fmt.Sprintf("10.0.%d.%d", rand.IntN(256), 1+rand.IntN(254))
		if s.PublicIP == nil || *s.PublicIP {
			in.PublicIP = fmt.Sprintf("203.0.113.%d", 1+rand.IntN(254))
		}
		if addr := c.knobs.InstanceAddress; addr != "" {
			in.PrivateIP = addr
			if in.PublicIP != "" {
				in.PublicIP = addr
			}
		}
		if s.IPv6Count > 0 {
			in.IPv6 = fmt.Sprintf("2001:db8::%x", rand.Uint32())
		}
		// The root volume, from the image's root snapshot and the
		// launch's own mapping of the root device.
		root := blockDevice{DeviceName: img.RootDevice, Size: rootSnapshotSize(img), Type: "gp2", DeleteOnEnd: true}
		for _, d := range img.Devices {
			if d.DeviceName == img.RootDevice {
				root = d
			}
		}
		for _, d := range s.Devices {
			if d.DeviceName == img.RootDevice {
				if d.Size > 0 {
					root.Size = d.Size
				}
				if d.Type != "" {
					root.Type = d.Type
				}
				root.Iops, root.Throughput, root.DeleteOnEnd = d.Iops, d.Throughput, d.DeleteOnEnd
			}
		}
		v := &volume{ID: newID("vol"), Size: root.Size, Type: root.Type, Iops: root.Iops, Throughput: root.Throughput,
			AZ: az, State: "in-use", SnapshotID: root.SnapshotID, Created: now, Tags: cloneTags(s.Tags["volume"]),
			InstanceID: in.ID, Device: root.DeviceName, DeleteOnEnd: root.DeleteOnEnd, AttachTime: now}
		if v.Type == "" {
			v.Type = "gp2"
		}
		c.volumes[v.ID] = v
		in.RootVolumeID = v.ID
		if s.Spot {
			in.Spot = true
			sr := &spotRequest{ID: "sir-" + newID("x")[2:10], InstanceID: in.ID, Type: "one-time", State: "active",
				StatusCode: "fulfilled", StatusMsg: "Your spot request is fulfilled.", StatusTime: now, Created: now,
				AZ: az, Tags: cloneTags(s.Tags["spot-instances-request"])}
			c.spot[sr.ID] = sr
			in.SpotRequestID = sr.ID
		}
		c.instances[in.ID] = in
		out = append(out, in)
	}
	return rid, out
}

type runInstancesResponse struct {
	meta
	xmlReservation
}

func (c *Cloud) runInstances(f form, now time.Time) (response, *apiError) {
	s, err := parseLaunchSpec(f, false)
	if err != nil {
		return nil, err
	}
	if f.hasSub("LaunchTemplate") {
		return nil, badParam("Launch templates are taken by CreateFleet only in this cloud")
	}
	minCount, err := f.int("MinCount", -1)
	if err != nil {
		return nil, err
	}
	maxCount, err := f.int("MaxCount", -1)
	if err != nil {
		return nil, err
	}
	if minCount < 0 {
		return nil, missing("MinCount")
	}
	if maxCount < 0 {
		return nil, missing("MaxCount")
	}
	if minCount < 1 || maxCount < minCount {
		return nil, badParam("Invalid value for MinCount or MaxCount: MinCount must be 1 or more and at most MaxCount")
	}
	if s.ClientToken != "" {
		if rid, ok := c.tokens["run/"+s.ClientToken]; ok {
			return &runInstancesResponse{xmlReservation: c.reservationXML(rid, nil)}, nil
		}
	}
	img, it, err := c.checkLaunch(&s)
	if err != nil {
		return nil, err
	}
	az := s.AZ
	if az == "" {
		az = c.zones()[0]
	}
	if err := c.capacityError(it.Name, s.Spot, az); err != nil {
		return nil, err
	}
	if err := c.quotaError(it, s.Spot, minCount); err != nil {
		return nil, err
	}
	count := maxCount
	for count > minCount && c.quotaError(it, s.Spot, count) != nil {
		count--
	}
	rid, _ := c.launch(s, img, it, count, now, "")
	if s.ClientToken != "" {
		c.tokens["run/"+s.ClientToken] = rid
	}
	return &runInstancesResponse{xmlReservation: c.reservationXML(rid, nil)}, nil
}

// reservationXML writes a reservation with its instances (only those in
// ids, if given).
func (c *Cloud) reservationXML(rid string, only []*instance) xmlReservation {
	r := xmlReservation{ReservationID: rid, OwnerID: c.account, Groups: items[xmlGroup]{}, Instances: items[xmlInstance]{}}
	list := only
	if list == nil {
		for _, in := range c.instances {
			if in.ReservationID == rid {
				list = append(list, in)
			}
		}
		slices.SortFunc(list, func(a, b *instance) int { return strings.Compare(a.ID, b.ID) })
	}
	for _, in := range list {
		r.Instances = append(r.Instances, c.instanceXML(in))
	}
	return r
}

func (c *Cloud) instanceXML(in *instance) xmlInstance {
	x := xmlInstance{
		InstanceID: in.ID, ImageID: in.ImageID, State: xmlState{Code: stateCodes[in.State], Name: in.State},
		PrivateDNS: "ip-" + strings.ReplaceAll(in.PrivateIP, ".", "-") + ".ec2.internal", DNSName: "",
		Reason: in.Transition, KeyName: in.KeyName, AmiLaunchIndex: 0, ProductCodes: items[struct{}]{},
		InstanceType: in.Type, LaunchTime: ts(in.LaunchTime),
		Placement:  xmlPlacement{AvailabilityZone: in.AZ, Tenancy: in.Tenancy, HostID: in.HostID},
		Monitoring: xmlMonitoring{State: "disabled"}, Architecture: in.Arch, RootDeviceType: "ebs",
		RootDeviceName: in.RootDevice, BlockDevices: items[xmlInstanceBlockDevice]{}, VirtualizationType: "hvm",
		ClientToken: in.ClientToken, Tags: tagSet(in.Tags), Groups: items[xmlGroup]{}, Hypervisor: "xen",
		EbsOptimized: in.EbsOptimized, EnaSupport: true, SourceDestCheck: true,
		Metadata:   xmlMetadataOptions{State: "applied", HTTPTokens: in.HTTPTokens, HopLimit: 2, HTTPEndpoint: in.HTTPEndpoint, ProtocolIPv6: "disabled", MetadataTags: "disabled"},
		CPU:        xmlCPU{CoreCount: max(1, c.types[in.Type].VCPUs/2), ThreadsPerCore: min(2, max(1, c.types[in.Type].VCPUs))},
		Interfaces: items[xmlNetworkInterface]{},
	}
	if in.State != "terminated" {
		x.SubnetID, x.VpcID, x.PrivateIP = in.SubnetID, in.VpcID, in.PrivateIP
		if in.PublicIP != "" && (in.State == "pending" || in.State == "running") {
			x.PublicIP = in.PublicIP
			x.DNSName = "ec2-" + strings.ReplaceAll(in.PublicIP, ".", "-") + ".compute-1.amazonaws.com"
		}
		x.IPv6 = in.IPv6
		for _, g := range in.Groups {
			x.Groups = append(x.Groups, xmlGroup{GroupID: g, GroupName: "default"})
		}
		ni := xmlNetworkInterface{ID: "eni-" + in.ID[2:], SubnetID: in.SubnetID, VpcID: in.VpcID, OwnerID: c.account, Status: "in-use",
			PrivateIP: in.PrivateIP, SourceDestCheck: true, Groups: x.Groups, IPv6: items[xmlIPv6]{}, InterfaceType: "interface"}
		if x.PublicIP != "" {
			ni.Association = &xmlAssociation{PublicIP: x.PublicIP, PublicDNS: x.DNSName, IPOwnerID: "amazon"}
		}
		if in.IPv6 != "" {
			ni.IPv6 = append(ni.IPv6, xmlIPv6{Address: in.IPv6, Primary: true})
		}
		x.Interfaces = append(x.Interfaces, ni)
		if v := c.volumes[in.RootVolumeID]; v != nil && v.InstanceID == in.ID {
			x.BlockDevices = append(x.BlockDevices, xmlInstanceBlockDevice{DeviceName: v.Device,
				Ebs: xmlInstanceEbs{VolumeID: v.ID, Status: "attached", AttachTime: ts(v.AttachTime), DeleteOnTermination: v.DeleteOnEnd}})
		}
	}
	if in.ReasonCode != "" {
		x.StateReason = &xmlStateReason{Code: in.ReasonCode, Message: in.ReasonMessage}
	}
	if in.Spot {
		x.Lifecycle, x.SpotRequestID = "spot", in.SpotRequestID
	}
	if in.IAMProfileArn != "" {
		x.IAMProfile = &xmlIAMProfile{Arn: in.IAMProfileArn, ID: "AIPA" + strings.ToUpper(in.ID[2:])}
	}
	return x
}

type describeInstancesResponse struct {
	meta
	Reservations items[xmlReservation] `xml:"reservationSet"`
	NextToken    string                `xml:"nextToken,omitempty"`
}

var instanceFilters = knownFilters("instance-state-name", "instance-state-code", "instance-id", "instance-type", "tag-key", "tag-value",
	"instance-lifecycle", "image-id", "availability-zone", "spot-instance-request-id", "client-token", "reservation-id",
	"private-ip-address", "ip-address", "host-id", "key-name", "subnet-id", "vpc-id", "architecture", "launch-time")

func (c *Cloud) describeInstances(f form, _ time.Time) (response, *apiError) {
	ids := f.list("InstanceId")
	if len(ids) > 0 && f.has("MaxResults") {
		return nil, errf(http.StatusBadRequest, "InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
	}
	fl, err := f.filters("Filter", instanceFilters)
	if err != nil {
		return nil, err
	}
	var missingIDs []string
	for _, id := range ids {
		if !wellFormed(id, "i") {
			return nil, malformed(id, "InvalidInstanceID")
		}
		if c.instances[id] == nil {
			missingIDs = append(missingIDs, id)
		}
	}
	if len(missingIDs) == 1 {
		return nil, notFound(missingIDs[0])
	} else if len(missingIDs) > 1 {
		return nil, errf(http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance IDs '%s' do not exist", strings.Join(missingIDs, ", "))
	}
	var list []*instance
	for _, in := range c.instances {
		if len(ids) > 0 && !contains(ids, in.ID) {
			continue
		}
		if c.instanceMatches(in, fl) {
			list = append(list, in)
		}
	}
	slices.SortFunc(list, func(a, b *instance) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(in *instance) string { return in.ID }, f, c.knobs.PageSize, 5)
	if err != nil {
		return nil, err
	}
	resp := &describeInstancesResponse{Reservations: items[xmlReservation]{}, NextToken: next}
	byRes := map[string]int{}
	for _, in := range pageList {
		i, ok := byRes[in.ReservationID]
		if !ok {
			i = len(resp.Reservations)
			byRes[in.ReservationID] = i
			resp.Reservations = append(resp.Reservations, xmlReservation{ReservationID: in.ReservationID, OwnerID: c.account, Groups: items[xmlGroup]{}, Instances: items[xmlInstance]{}})
		}
		resp.Reservations[i].Instances = append(resp.Reservations[i].Instances, c.instanceXML(in))
	}
	return resp, nil
}

func (c *Cloud) instanceMatches(in *instance, fl []filter) bool {
	for _, x := range fl {
		if m, isTag := x.matchTags(in.Tags); isTag {
			if !m {
				return false
			}
			continue
		}
		var vals []string
		switch x.name {
		case "instance-state-name":
			vals = []string{in.State}
		case "instance-state-code":
			vals = []string{fmt.Sprint(stateCodes[in.State])}
		case "instance-id":
			vals = []string{in.ID}
		case "instance-type":
			vals = []string{in.Type}
		case "instance-lifecycle":
			if in.Spot {
				vals = []string{"spot"}
			}
		case "image-id":
			vals = []string{in.ImageID}
		case "availability-zone":
			vals = []string{in.AZ}
		case "spot-instance-request-id":
			vals = []string{in.SpotRequestID}
		case "client-token":
			vals = []string{in.ClientToken}
		case "reservation-id":
			vals = []string{in.ReservationID}
		case "private-ip-address":
			vals = []string{in.PrivateIP}
		case "ip-address":
			vals = []string{in.PublicIP}
		case "host-id":
			vals = []string{in.HostID}
		case "key-name":
			vals = []string{in.KeyName}
		case "subnet-id":
			vals = []string{in.SubnetID}
		case "vpc-id":
			vals = []string{in.VpcID}
		case "architecture":
			vals = []string{in.Arch}
		case "launch-time":
			vals = []string{time.Time(in.LaunchTime).UTC().Format("2006-01-02T15:04:05.000Z")}
		}
		if !x.match(vals...) {
			return false
		}
	}
	return true
}

type terminateResponse struct {
	meta
	Instances items[xmlStateChange] `xml:"instancesSet"`
}

func (c *Cloud) terminateInstances(f form, now time.Time) (response, *apiError) {
	ids := f.list("InstanceId")
	if len(ids) == 0 {
		return nil, missing("InstanceId")
	}
	for _, id := range ids {
		if !wellFormed(id, "i") {
			return nil, malformed(id, "InvalidInstanceID")
		}
		if c.instances[id] == nil {
			return nil, notFound(id)
		}
	}
	resp := &terminateResponse{Instances: items[xmlStateChange]{}}
	for _, id := range ids {
		in := c.instances[id]
		prev := in.State
		if in.State == "pending" || in.State == "running" || in.State == "stopped" || in.State == "stopping" {
			c.shutDown(in, now, "Client.UserInitiatedShutdown", "Client.UserInitiatedShutdown: User initiated shutdown",
				fmt.Sprintf("User initiated (%s)", now.UTC().Format("2006-01-02 15:04:05 MST")))
			if sr := c.spot[in.SpotRequestID]; sr != nil && sr.State == "active" {
				sr.State, sr.StatusCode, sr.StatusMsg, sr.StatusTime = "closed", "instance-terminated-by-user", "Spot Instance terminated due to user-initiated termination.", now
			}
		}
		resp.Instances = append(resp.Instances, xmlStateChange{InstanceID: id,
			Current: xmlState{Code: stateCodes[in.State], Name: in.State}, Previous: xmlState{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

type stopResponse struct {
	meta
	Instances items[xmlStateChange] `xml:"instancesSet"`
}

// instanceIDs reads and checks the InstanceId list of a call: every id
// well formed and known, or the call fails as a whole.
func (c *Cloud) instanceIDs(f form) ([]string, *apiError) {
	ids := f.list("InstanceId")
	if len(ids) == 0 {
		return nil, missing("InstanceId")
	}
	for _, id := range ids {
		if !wellFormed(id, "i") {
			return nil, malformed(id, "InvalidInstanceID")
		}
		if c.instances[id] == nil {
			return nil, notFound(id)
		}
	}
	return ids, nil
}

// stopInstances stops running instances, as EC2 does: stopping for
// TerminateTime, then stopped (their vCPUs no longer count, their public
// address is let go). A stopped or stopping instance is answered as it
// is; one that is pending, shutting-down or terminated, or a spot
// instance of a one-time request, is refused, and then none is stopped.
func (c *Cloud) stopInstances(f form, now time.Time) (response, *apiError) {
	ids, err := c.instanceIDs(f)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		in := c.instances[id]
		if sr := c.spot[in.SpotRequestID]; in.Spot && (sr == nil || sr.Type == "one-time") {
			return nil, errf(http.StatusBadRequest, "UnsupportedOperation", "You can't stop the Spot Instance '%s' because it is associated with a one-time Spot Instance request. You can only stop Spot Instances associated with persistent Spot Instance requests.", id)
		}
		if in.State != "running" && in.State != "stopping" && in.State != "stopped" {
			return nil, errf(http.StatusBadRequest, "IncorrectInstanceState", "The instance '%s' is not in a state from which it can be stopped.", id)
		}
	}
	resp := &stopResponse{Instances: items[xmlStateChange]{}}
	for _, id := range ids {
		in := c.instances[id]
		prev := in.State
		if in.State == "running" {
			in.State, in.StopAt = "stopping", now.Add(c.knobs.TerminateTime.D())
			in.ReasonCode, in.ReasonMessage = "Client.UserInitiatedShutdown", "Client.UserInitiatedShutdown: User initiated shutdown"
			in.Transition = fmt.Sprintf("User initiated (%s)", now.UTC().Format("2006-01-02 15:04:05 MST"))
			if !now.Before(in.StopAt) {
				in.State = "stopped"
			}
		}
		resp.Instances = append(resp.Instances, xmlStateChange{InstanceID: id,
			Current: xmlState{Code: stateCodes[in.State], Name: in.State}, Previous: xmlState{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

// startInstances starts stopped instances again: pending for BootTime,
// then running, if their vCPUs fit the quota. A pending or running
// instance is answered as it is; one that is stopping, shutting-down or
// terminated is refused, and then none is started.
func (c *Cloud) startInstances(f form, now time.Time) (response, *apiError) {
	ids, err := c.instanceIDs(f)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		in := c.instances[id]
		if in.State != "stopped" && in.State != "pending" && in.State != "running" {
			return nil, errf(http.StatusBadRequest, "IncorrectInstanceState", "The instance '%s' is not in a state from which it can be started.", id)
		}
		if in.State == "stopped" {
			if err := c.quotaError(c.types[in.Type], in.Spot, 1); err != nil {
				return nil, err
			}
		}
	}
	resp := &stopResponse{Instances: items[xmlStateChange]{}}
	for _, id := range ids {
		in := c.instances[id]
		prev := in.State
		if in.State == "stopped" {
			in.State, in.RunningAt = "pending", now.Add(c.knobs.BootTime.D())
			in.ReasonCode, in.ReasonMessage, in.Transition = "", "", ""
		}
		resp.Instances = append(resp.Instances, xmlStateChange{InstanceID: id,
			Current: xmlState{Code: stateCodes[in.State], Name: in.State}, Previous: xmlState{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

// shutDown starts an instance's termination.
func (c *Cloud) shutDown(in *instance, now time.Time, code, msg, transition string) {
	in.State = "shutting-down"
	in.TerminateAt = now.Add(c.knobs.TerminateTime.D())
	in.ReasonCode, in.ReasonMessage, in.Transition = code, msg, transition
	if !now.Before(in.TerminateAt) {
		c.terminated(in, now)
	}
}

// terminated finishes a termination: the root volume goes (or is
// detached), the dedicated host is free again.
func (c *Cloud) terminated(in *instance, now time.Time) {
	in.State = "terminated"
	in.GoneAt = now.Add(c.knobs.TerminatedRetention.D())
	for _, v := range c.volumes {
		if v.InstanceID != in.ID {
			continue
		}
		v.InstanceID, v.Device = "", ""
		if v.DeleteOnEnd {
			v.State, v.GoneAt = "deleting", now.Add(c.knobs.TerminateTime.D())
		} else {
			v.State = "available"
		}
	}
	if h := c.hosts[in.HostID]; h != nil {
		h.Instances = slices.DeleteFunc(h.Instances, func(id string) bool { return id == in.ID })
	}
}

// interruptNow has EC2 reclaim a spot instance.
func (c *Cloud) interruptNow(in *instance, sr *spotRequest, now time.Time) {
	sr.State, sr.StatusCode, sr.StatusMsg, sr.StatusTime = "closed", "instance-terminated-no-capacity", "Spot Instance terminated due to no available capacity.", now
	c.shutDown(in, now, "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot instance termination",
		fmt.Sprintf("Service initiated (%s)", now.UTC().Format("2006-01-02 15:04:05 MST")))
}

// RebalanceTag is the tag the cloud sets on an instance that receives a
// rebalance recommendation. AWS tells those only inside the instance
// (instance metadata) and on EventBridge; a relay (an EventBridge rule,
// an agent on the node) writing this tag is what makes it visible to a
// driver that polls, and the dev cloud plays that relay.
const RebalanceTag = "nodepool_rebalance_recommendation"

// Interruption kinds for Interrupt.
const (
	// InterruptNotice: the two-minute warning (spot request status
	// marked-for-termination), then the termination after SpotNotice.
	InterruptNotice = "notice"
	// InterruptNow: the instance is reclaimed at once.
	InterruptNow = "terminate"
	// InterruptRebalance: a rebalance recommendation (RebalanceTag).
	InterruptRebalance = "rebalance"
)

// Interrupt has EC2 interrupt a spot instance, as it does when it needs
// the capacity back.
func (c *Cloud) Interrupt(instanceID, kind string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.advance(now)
	in := c.instances[instanceID]
	if in == nil {
		return fmt.Errorf("no instance %s", instanceID)
	}
	sr := c.spot[in.SpotRequestID]
	if !in.Spot || sr == nil {
		return fmt.Errorf("instance %s is not a spot instance", instanceID)
	}
	if in.State != "pending" && in.State != "running" {
		return fmt.Errorf("instance %s is %s", instanceID, in.State)
	}
	switch kind {
	case InterruptNotice:
		sr.StatusCode, sr.StatusMsg, sr.StatusTime = "marked-for-termination", "Your Spot Instance is marked for termination because capacity is not available.", now
		sr.InterruptAt = now.Add(c.knobs.SpotNotice.D())
	case InterruptNow:
		c.interruptNow(in, sr, now)
	case InterruptRebalance:
		in.Tags[RebalanceTag] = now.UTC().Format(time.RFC3339)
	default:
		return fmt.Errorf("unknown interruption %q; expected %s, %s or %s", kind, InterruptNotice, InterruptNow, InterruptRebalance)
	}
	return nil
}

type describeSpotResponse struct {
	meta
	Requests  items[xmlSpotRequest] `xml:"spotInstanceRequestSet"`
	NextToken string                `xml:"nextToken,omitempty"`
}

func (c *Cloud) describeSpotInstanceRequests(f form, _ time.Time) (response, *apiError) {
	fl, err := f.filters("Filter", knownFilters("state", "status-code", "instance-id", "spot-instance-request-id", "launched-availability-zone", "type", "tag-key", "tag-value"))
	if err != nil {
		return nil, err
	}
	ids := f.list("SpotInstanceRequestId")
	for _, id := range ids {
		if c.spot[id] == nil {
			return nil, notFound(id)
		}
	}
	var list []*spotRequest
	for _, sr := range c.spot {
		if len(ids) > 0 && !contains(ids, sr.ID) {
			continue
		}
		ok := true
		for _, x := range fl {
			if m, isTag := x.matchTags(sr.Tags); isTag {
				ok = ok && m
				continue
			}
			switch x.name {
			case "state":
				ok = ok && x.match(sr.State)
			case "status-code":
				ok = ok && x.match(sr.StatusCode)
			case "instance-id":
				ok = ok && x.match(sr.InstanceID)
			case "spot-instance-request-id":
				ok = ok && x.match(sr.ID)
			case "launched-availability-zone":
				ok = ok && x.match(sr.AZ)
			case "type":
				ok = ok && x.match(sr.Type)
			}
		}
		if ok {
			list = append(list, sr)
		}
	}
	slices.SortFunc(list, func(a, b *spotRequest) int { return strings.Compare(a.ID, b.ID) })
	pageList, next, err := page(list, func(s *spotRequest) string { return s.ID }, f, c.knobs.PageSize, 5)
	if err != nil {
		return nil, err
	}
	resp := &describeSpotResponse{Requests: items[xmlSpotRequest]{}, NextToken: next}
	for _, sr := range pageList {
		resp.Requests = append(resp.Requests, xmlSpotRequest{ID: sr.ID, InstanceID: sr.InstanceID, State: sr.State, Type: sr.Type,
			Status:  xmlSpotStatus{Code: sr.StatusCode, Message: sr.StatusMsg, UpdateTime: ts(sr.StatusTime)},
			Created: ts(sr.Created), AZ: sr.AZ, Tags: tagSet(sr.Tags), Product: "Linux/UNIX", Interruption: "terminate"})
	}
	return resp, nil
}
