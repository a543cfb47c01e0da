package config

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Defaults of the aws driver's keys, as aws.rst gives them (boot-timeout
// 180 s and rate 2 calls per second are in driverSpecs).
const (
	DefaultAWSImageFormat  = "raw"
	DefaultAWSArchitecture = "x86_64"
	DefaultAWSVolumeType   = "gp3"
	DefaultAWSImportMethod = "snapshot"
)

// AWS value sets.
var (
	AWSImageFormats    = []string{"ova", "vhd", "vhdx", "vmdk", "raw"}
	AWSImportMethods   = []string{"snapshot", "image", "ebs-direct"}
	AWSVolumeTypes     = []string{"standard", "io1", "io2", "gp2", "gp3", "sc1", "st1"}
	AWSArchitectures   = []string{"i386", "x86_64", "arm64", "x86_64_mac", "arm64_mac"}
	AWSOnDemandFleet   = []string{"lowest-price", "prioritized"}
	AWSSpotFleet       = []string{"price-capacity-optimized", "capacity-optimized", "diversified", "lowest-price"}
	AWSIMDSv2Settings  = []string{"optional", "required"}
	awsQuotaCodeRE     = regexp.MustCompile(`^L-[0-9A-F]{8}$`)
	awsDynamicFieldsRE = regexp.MustCompile(`\{[^{}]*\}`)
)

// AWSProvider holds the keys only an aws provider has.
type AWSProvider struct {
	RegionName  string `yaml:"region-name" drivers:"aws" required:"true"`
	ProfileName string `yaml:"profile-name" drivers:"aws"`
	// The provider's limits are the defaults of its pools' (absent:
	// unlimited).
	MaxServers   int            `yaml:"max-servers" drivers:"aws"`
	MaxCores     int            `yaml:"max-cores" drivers:"aws"`
	MaxRAM       int            `yaml:"max-ram" drivers:"aws"`
	MaxResources map[string]int `yaml:"max-resources" drivers:"aws"`
	// PostUploadHook runs after an upload, before the image is used:
	// HOOK PROVIDER EXTERNAL_IMAGE_ID LOCAL_IMAGE_FILENAME; a failure
	// deletes the image.
	PostUploadHook string            `yaml:"post-upload-hook" drivers:"aws"`
	ObjectStorage  *AWSObjectStorage `yaml:"object-storage" drivers:"aws"`
	// DiskFormat is the provider's image-format: the format builds are
	// made in and imported as.
	DiskFormat string `yaml:"image-format" drivers:"aws"`
	// ImageImportTimeout: how long imports are retried while AWS refuses
	// them for lack of resources (0: not retried).
	ImageImportTimeout Duration        `yaml:"image-import-timeout" drivers:"aws"`
	CloudImages        []AWSCloudImage `yaml:"cloud-images" drivers:"aws"`
}

// AWSObjectStorage is the bucket image files pass through on their way to
// a snapshot or an image import.
type AWSObjectStorage struct {
	BucketName string `yaml:"bucket-name"`
}

// AWSCloudImage is an entry of an aws provider's cloud-images: an AMI the
// account can boot, by id or by filters (the newest match).
type AWSCloudImage struct {
	Name           string           `yaml:"name" required:"true"`
	ImageID        string           `yaml:"image-id"`
	ImageFilters   []AWSImageFilter `yaml:"image-filters"`
	Username       string           `yaml:"username"`
	PythonPath     string           `yaml:"python-path"`
	ShellType      string           `yaml:"shell-type"`
	ConnectionType string           `yaml:"connection-type"`
	ConnectionPort int              `yaml:"connection-port"`
}

// AWSImageFilter is a DescribeImages filter. Its keys may also be spelt
// as EC2's API spells them (Name, Values), as Nodepool, which hands them to
// boto3, accepts.
type AWSImageFilter struct {
	Name   string     `yaml:"name" required:"true"`
	Values StringList `yaml:"values" required:"true"`
}

func (f *AWSImageFilter) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping with name and values, got %s", describe(n))
		return
	}
	seen := map[string]*yaml.Node{}
	for _, p := range d.pairs(path, n) {
		key := p.key.Value
		field := strings.ToLower(key)
		if p.key.Kind != yaml.ScalarNode || (key != field && key != "Name" && key != "Values") || (field != "name" && field != "values") {
			msg := "unknown key; expected name and values (or EC2's Name and Values)"
			if alt := nearest(key, []string{"name", "values"}); alt != "" {
				msg = fmt.Sprintf("unknown key; did you mean %q? (expected name and values, or EC2's Name and Values)", alt)
			}
			d.fail(joinPath(path, key), p.key, "%s", msg)
			continue
		}
		if prev := seen[field]; prev != nil {
			d.fail(joinPath(path, key), p.key, "%s and %s are the same key (also line %d); give one", prev.Value, key, prev.Line)
			continue
		}
		seen[field] = p.key
		v := resolveAlias(p.val)
		if v == nil || isNull(v) {
			continue
		}
		if field == "name" {
			d.decodeString(joinPath(path, key), v, reflect.ValueOf(&f.Name).Elem(), false)
		} else {
			f.Values.decodeYAML(d, joinPath(path, key), v)
		}
	}
	for _, k := range []string{"name", "values"} {
		if seen[k] == nil {
			d.fail(path, n, "missing required key %q", k)
		}
	}
}

// ImageRef is the AMI id to boot, when the entry names one: its image-id,
// or else its name (when it has no filters).
func (ci *AWSCloudImage) ImageRef() string {
	if ci.ImageID != "" || len(ci.ImageFilters) > 0 {
		return ci.ImageID
	}
	return ci.Name
}

// AWSDiskimage holds the keys an aws provider's diskimages entry adds.
type AWSDiskimage struct {
	// Username, PythonPath and ShellType override the build's for nodes
	// of this provider (Nodepool deprecates username here).
	AWSUsername   string `yaml:"username" drivers:"aws"`
	AWSPythonPath string `yaml:"python-path" drivers:"aws"`
	AWSShellType  string `yaml:"shell-type" drivers:"aws"`
	Architecture  string `yaml:"architecture" drivers:"aws"`
	// ENASupport defaults to true.
	ENASupport      *bool  `yaml:"ena-support" drivers:"aws"`
	ImageVolumeType string `yaml:"volume-type" drivers:"aws"`
	ImageVolumeSize int    `yaml:"volume-size" drivers:"aws"`
	IMDSSupport     string `yaml:"imds-support" drivers:"aws"`
	ImportMethod    string `yaml:"import-method" drivers:"aws"`
	ImageIops       int    `yaml:"iops" drivers:"aws"`
	ImageThroughput int    `yaml:"throughput" drivers:"aws"`
	ImageTags       Tags   `yaml:"tags" drivers:"aws"`
}

// HasENASupport reports ena-support (default true).
func (ad *AWSDiskimage) HasENASupport() bool { return ad.ENASupport == nil || *ad.ENASupport }

// AWSPool holds the keys only an aws pool has.
type AWSPool struct {
	AvailabilityZone string `yaml:"availability-zone" drivers:"aws"`
	SubnetID         string `yaml:"subnet-id" drivers:"aws"`
	SecurityGroupID  string `yaml:"security-group-id" drivers:"aws"`
	// PublicIPAddress is the deprecated alias of PublicIPv4.
	PublicIPAddress *bool          `yaml:"public-ip-address" drivers:"aws"`
	PublicIPv4      *bool          `yaml:"public-ipv4" drivers:"aws"`
	PublicIPv6      *bool          `yaml:"public-ipv6" drivers:"aws"`
	UseInternalIP   bool           `yaml:"use-internal-ip" drivers:"aws"`
	AWSHostKeyCheck *bool          `yaml:"host-key-checking" drivers:"aws"`
	MaxResources    map[string]int `yaml:"max-resources" drivers:"aws"`
}

// AssignsPublicIPv4 reports public-ipv4 (or its alias public-ip-address),
// default true.
func (ap *AWSPool) AssignsPublicIPv4() bool {
	switch {
	case ap.PublicIPv4 != nil:
		return *ap.PublicIPv4
	case ap.PublicIPAddress != nil:
		return *ap.PublicIPAddress
	}
	return true
}

// AssignsPublicIPv6 reports public-ipv6, default true.
func (ap *AWSPool) AssignsPublicIPv6() bool { return ap.PublicIPv6 == nil || *ap.PublicIPv6 }

// ChecksHostKeys reports host-key-checking, default true.
func (ap *AWSPool) ChecksHostKeys() bool { return ap.AWSHostKeyCheck == nil || *ap.AWSHostKeyCheck }

// AWSLabel holds the keys only an aws pool's label has.
type AWSLabel struct {
	InstanceType       string                 `yaml:"instance-type" drivers:"aws" orlist:"some Nodepool builds take a list and try its types in turn when EC2 lacks capacity; this launcher launches the first type only: give one type, or fleet: {instance-types: [...]} to let EC2 choose among several"`
	Fleet              *AWSFleet              `yaml:"fleet" drivers:"aws"`
	DedicatedHost      bool                   `yaml:"dedicated-host" drivers:"aws"`
	EBSOptimized       bool                   `yaml:"ebs-optimized" drivers:"aws"`
	IAMInstanceProfile *AWSIAMInstanceProfile `yaml:"iam-instance-profile" drivers:"aws"`
	IMDSv2             string                 `yaml:"imdsv2" drivers:"aws"`
	EC2KeyName         string                 `yaml:"key-name" drivers:"aws"`
	RootVolumeType     string                 `yaml:"volume-type" drivers:"aws"`
	RootVolumeSize     int                    `yaml:"volume-size" drivers:"aws"`
	RootIops           int                    `yaml:"iops" drivers:"aws"`
	RootThroughput     int                    `yaml:"throughput" drivers:"aws"`
	EC2UserData        string                 `yaml:"userdata" drivers:"aws"`
	Tags               Tags                   `yaml:"tags" drivers:"aws"`
	DynamicTags        Tags                   `yaml:"dynamic-tags" drivers:"aws"`
	UseSpot            bool                   `yaml:"use-spot" drivers:"aws"`
	// OnDemandFallback (an extension): after this many spot capacity
	// errors in a row, a node of a use-spot label is launched on demand
	// instead (0: never).
	OnDemandFallback int `yaml:"on-demand-fallback" drivers:"aws"`
}

// AWSFleet is a label's fleet: CreateFleet picks one of several instance
// types.
type AWSFleet struct {
	InstanceTypes []string `yaml:"instance-types"`
	// InstanceRequirements (EC2's attribute-based selection, in some
	// Nodepool builds) is read and checked, but this launcher does not
	// send it: a label that has it cannot launch (see validateAWS).
	InstanceRequirements *RawYAML `yaml:"instance-requirements"`
	AllocationStrategy   string   `yaml:"allocation-strategy" required:"true"`
}

// AWSIAMInstanceProfile names an instance profile by name or arn.
type AWSIAMInstanceProfile struct {
	Name string `yaml:"name"`
	Arn  string `yaml:"arn"`
}

// AWSCloudImage returns the provider's cloud-images entry of that name.
func (ap *AWSProvider) AWSCloudImage(name string) (*AWSCloudImage, bool) {
	for i := range ap.CloudImages {
		if ap.CloudImages[i].Name == name {
			return &ap.CloudImages[i], true
		}
	}
	return nil, false
}

func awsDefaults(p *Provider) {
	ap := &p.AWSProvider
	if ap.DiskFormat == "" {
		ap.DiskFormat = DefaultAWSImageFormat
	}
	for i := range p.Diskimages {
		ad := &p.Diskimages[i].AWSDiskimage
		if ad.Architecture == "" {
			ad.Architecture = DefaultAWSArchitecture
		}
		if ad.ImageVolumeType == "" {
			ad.ImageVolumeType = DefaultAWSVolumeType
		}
		if ad.ImportMethod == "" {
			ad.ImportMethod = DefaultAWSImportMethod
		}
	}
	for j := range p.Pools {
		pool := &p.Pools[j]
		if !pool.set["max-servers"] && p.set["max-servers"] {
			pool.MaxServers = ap.MaxServers
		}
		if !pool.set["max-cores"] && p.set["max-cores"] {
			pool.MaxCores = ap.MaxCores
		}
		if !pool.set["max-ram"] && p.set["max-ram"] {
			pool.MaxRAM = ap.MaxRAM
		}
		if pool.AWSPool.MaxResources == nil && ap.MaxResources != nil {
			pool.AWSPool.MaxResources = cloneLimits(ap.MaxResources)
		}
	}
}

func cloneLimits(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// validDynamicTag checks a dynamic-tags format string: {request.FIELD}
// with Nodepool's fields, {{ and }} for braces.
func validDynamicTag(s string) error {
	rest := strings.NewReplacer("{{", "", "}}", "").Replace(s)
	for _, m := range awsDynamicFieldsRE.FindAllString(rest, -1) {
		field := strings.TrimSuffix(strings.TrimPrefix(m, "{"), "}")
		field, _, _ = strings.Cut(field, "[")
		if !slices.Contains(DynamicTagFields, field) {
			return fmt.Errorf("unknown field %s; expected one of {%s}", m, strings.Join(DynamicTagFields, "}, {"))
		}
		rest = strings.Replace(rest, m, "", 1)
	}
	if strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("unbalanced braces in %q; write {{ and }} for literal braces", s)
	}
	return nil
}

// DynamicTagFields are what dynamic-tags may use, as in Nodepool
// (requestor_data takes an index: {request.requestor_data[key]}).
var DynamicTagFields = []string{"request.id", "request.labels", "request.requestor", "request.requestor_data",
	"request.relative_priority", "request.event_id", "request.created_time", "request.tenant_name"}

func validateAWS(c *Config, v *validation, i int) {
	p := &c.Providers[i]
	ap := &p.AWSProvider
	path := indexPath("providers", i)
	at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
	if ap.RegionName == "" || strings.ContainsAny(ap.RegionName, " /\t\n") {
		v.fail(path+".region-name", at("region-name"), "expected an AWS region such as us-west-2, got %q", ap.RegionName)
	}
	if p.Rate < 0 {
		v.fail(path+".rate", at("rate"), "expected 0 (no limit) or more calls per second, got %g", p.Rate)
	}
	if !slices.Contains(AWSImageFormats, ap.DiskFormat) {
		v.fail(path+".image-format", at("image-format"), "expected one of %s, got %q", strings.Join(AWSImageFormats, ", "), ap.DiskFormat)
	}
	if ap.ObjectStorage != nil && ap.ObjectStorage.BucketName == "" {
		v.fail(path+".object-storage.bucket-name", at("object-storage"), "expected the name of an existing S3 bucket")
	}
	checkLimits := func(lpath string, lat func(...any) *yaml.Node, servers, cores, ram int, res map[string]int, set map[string]bool) {
		for _, k := range []struct {
			key string
			val int
		}{{"max-servers", servers}, {"max-cores", cores}, {"max-ram", ram}} {
			if set[k.key] && k.val < 0 {
				v.fail(lpath+"."+k.key, lat(k.key), "expected 0 or more, got %d", k.val)
			}
		}
		for code, n := range res {
			if n < 0 {
				v.fail(lpath+".max-resources."+code, lat("max-resources", code), "expected 0 or more, got %d", n)
			}
			if !awsQuotaCodeRE.MatchString(code) && code != "cores" && code != "ram" && code != "instances" {
				v.warn(lpath+".max-resources."+code, lat("max-resources", code), "%q is not an EC2 quota code such as L-1216C47A; it limits nothing the driver counts", code)
			}
		}
	}
	checkLimits(path, at, ap.MaxServers, ap.MaxCores, ap.MaxRAM, ap.MaxResources, p.set)
	images := map[string]bool{}
	for j, ci := range ap.CloudImages {
		cpath := indexPath(path+".cloud-images", j)
		cat := func(rest ...any) *yaml.Node { return at(append([]any{"cloud-images", j}, rest...)...) }
		if images[ci.Name] {
			v.fail(cpath+".name", cat("name"), "cloud image %q is defined twice", ci.Name)
		}
		images[ci.Name] = true
		if ci.ImageID != "" && len(ci.ImageFilters) > 0 {
			v.fail(cpath, cat(), "give image-id or image-filters, not both")
		}
		if ref := ci.ImageRef(); ref != "" && !strings.HasPrefix(ref, "ami-") {
			if ci.ImageID != "" {
				v.warn(cpath+".image-id", cat("image-id"), "%q is not an AMI id (such as ami-0123456789abcdef0): EC2 refuses it, so every launch of the labels booting cloud image %q fails (Nodepool loads it too)", ci.ImageID, ci.Name)
			} else {
				v.warn(cpath, cat(), "cloud image %q has neither image-id nor image-filters, so its name is taken as the AMI id, and %q is not one (ami-...): EC2 refuses it, so every launch of the labels booting it fails", ci.Name, ci.Name)
			}
		}
		for k, f := range ci.ImageFilters {
			if len(f.Values) == 0 {
				v.fail(indexPath(cpath+".image-filters", k)+".values", cat("image-filters", k), "expected at least one value")
			}
		}
		if ci.ConnectionPort < 0 || ci.ConnectionPort > 65535 {
			v.fail(cpath+".connection-port", cat("connection-port"), "expected a port from 1 to 65535, got %d", ci.ConnectionPort)
		}
	}
	for j, pd := range p.Diskimages {
		ad := &pd.AWSDiskimage
		dpath := indexPath(path+".diskimages", j)
		dat := func(rest ...any) *yaml.Node { return at(append([]any{"diskimages", j}, rest...)...) }
		if !slices.Contains(AWSArchitectures, ad.Architecture) {
			v.fail(dpath+".architecture", dat("architecture"), "expected one of %s, got %q", strings.Join(AWSArchitectures, ", "), ad.Architecture)
		}
		if !slices.Contains(AWSVolumeTypes, ad.ImageVolumeType) {
			v.fail(dpath+".volume-type", dat("volume-type"), "expected one of %s, got %q", strings.Join(AWSVolumeTypes, ", "), ad.ImageVolumeType)
		}
		if ad.ImageVolumeSize < 0 || ad.ImageIops < 0 || ad.ImageThroughput < 0 {
			v.fail(dpath, dat(), "volume-size, iops and throughput must be 0 or more")
		}
		if ad.ImageThroughput > 0 && ad.ImageVolumeType != "gp3" {
			v.warn(dpath+".throughput", dat("throughput"), "throughput applies to gp3 volumes only: AWS refuses to register an image whose %s volume has one, so every upload of it to this provider fails (Nodepool sends it the same way); remove throughput or set volume-type: gp3", ad.ImageVolumeType)
		}
		if ad.IMDSSupport != "" && ad.IMDSSupport != "v2.0" {
			v.fail(dpath+".imds-support", dat("imds-support"), "expected v2.0 (or nothing), got %q", ad.IMDSSupport)
		}
		if !slices.Contains(AWSImportMethods, ad.ImportMethod) {
			v.fail(dpath+".import-method", dat("import-method"), "expected one of %s, got %q", strings.Join(AWSImportMethods, ", "), ad.ImportMethod)
		}
		if ad.ImportMethod != "ebs-direct" && ap.ObjectStorage == nil && !pd.Pause {
			v.warn(dpath, dat(), "diskimage %q is imported through S3 (import-method %s) but the provider has no object-storage bucket-name; its uploads will fail", pd.Name, ad.ImportMethod)
		}
		for k := range ad.ImageTags {
			if strings.HasPrefix(k, "nodepool_") {
				v.warn(dpath+".tags."+k, dat("tags", k), "tags starting with nodepool_ are nodepool's own")
			}
		}
	}
	for j := range p.Pools {
		pool := &p.Pools[j]
		ppath := indexPath(path+".pools", j)
		pat := func(rest ...any) *yaml.Node { return at(append([]any{"pools", j}, rest...)...) }
		checkLimits(ppath, pat, pool.MaxServers, pool.MaxCores, pool.MaxRAM, pool.AWSPool.MaxResources, pool.set)
		if pool.PublicIPAddress != nil && pool.PublicIPv4 != nil && *pool.PublicIPAddress != *pool.PublicIPv4 {
			v.fail(ppath+".public-ip-address", pat("public-ip-address"), "public-ip-address is the old name of public-ipv4; they disagree")
		}
		for k := range pool.Labels {
			pl := &pool.Labels[k]
			al := &pl.AWSLabel
			lpath := indexPath(ppath+".labels", k)
			lat := func(rest ...any) *yaml.Node { return pat(append([]any{"labels", k}, rest...)...) }
			switch {
			case pl.CloudImage == "" && pl.Diskimage == "":
				v.fail(lpath, lat(), "an aws label needs cloud-image (an entry of the provider's cloud-images) or diskimage")
			case pl.CloudImage != "" && !images[pl.CloudImage]:
				v.fail(lpath+".cloud-image", lat("cloud-image"), "cloud image %q is not in this provider's cloud-images", pl.CloudImage)
			}
			switch {
			case al.InstanceType == "" && al.Fleet == nil:
				v.fail(lpath, lat(), "an aws label needs instance-type or fleet")
			case al.InstanceType != "" && al.Fleet != nil:
				v.fail(lpath+".fleet", lat("fleet"), "instance-type and fleet exclude each other")
			}
			if f := al.Fleet; f != nil {
				switch {
				case f.InstanceRequirements != nil && len(f.InstanceTypes) > 0:
					v.fail(lpath+".fleet", lat("fleet"), "instance-types and instance-requirements exclude each other (as in Nodepool); give one")
				case f.InstanceRequirements != nil:
					v.warn(lpath+".fleet.instance-requirements", lat("fleet", "instance-requirements"), "EC2's attribute-based instance selection (a key of some Nodepool builds) is not sent by this launcher, so every launch of label %q fails; list the types under instance-types instead", pl.Name)
				case len(f.InstanceTypes) == 0:
					v.fail(lpath+".fleet.instance-types", lat("fleet"), "expected at least one instance type (or instance-requirements)")
				}
				valid := AWSOnDemandFleet
				if al.UseSpot {
					valid = AWSSpotFleet
				}
				if !slices.Contains(valid, f.AllocationStrategy) {
					v.fail(lpath+".fleet.allocation-strategy", lat("fleet", "allocation-strategy"), "expected one of %s for %s instances, got %q",
						strings.Join(valid, ", "), map[bool]string{true: "spot", false: "on-demand"}[al.UseSpot], f.AllocationStrategy)
				}
			}
			if al.DedicatedHost {
				if al.UseSpot {
					v.fail(lpath+".dedicated-host", lat("dedicated-host"), "dedicated-host and use-spot exclude each other")
				}
				if al.Fleet != nil {
					v.fail(lpath+".dedicated-host", lat("dedicated-host"), "dedicated-host needs instance-type, not fleet")
				}
				if pool.AvailabilityZone == "" {
					v.fail(lpath+".dedicated-host", lat("dedicated-host"), "dedicated-host needs the pool's availability-zone")
				}
			}
			if ip := al.IAMInstanceProfile; ip != nil && (ip.Name == "") == (ip.Arn == "") {
				v.fail(lpath+".iam-instance-profile", lat("iam-instance-profile"), "expected name or arn (one of them)")
			}
			if al.IMDSv2 != "" && !slices.Contains(AWSIMDSv2Settings, al.IMDSv2) {
				v.fail(lpath+".imdsv2", lat("imdsv2"), "expected optional or required, got %q", al.IMDSv2)
			}
			if al.EC2KeyName == "" {
				v.fail(lpath, lat(), "missing required key \"key-name\": the EC2 key pair of the nodes")
			}
			if al.RootVolumeType != "" && !slices.Contains(AWSVolumeTypes, al.RootVolumeType) {
				v.fail(lpath+".volume-type", lat("volume-type"), "expected one of %s, got %q", strings.Join(AWSVolumeTypes, ", "), al.RootVolumeType)
			}
			if al.RootVolumeSize < 0 || al.RootIops < 0 || al.RootThroughput < 0 {
				v.fail(lpath, lat(), "volume-size, iops and throughput must be 0 or more")
			}
			if al.RootThroughput > 0 {
				checkThroughput(v, p, pl, lpath+".throughput", lat("throughput"))
			}
			if al.OnDemandFallback < 0 {
				v.fail(lpath+".on-demand-fallback", lat("on-demand-fallback"), "expected 0 (never) or more spot capacity errors, got %d", al.OnDemandFallback)
			} else if al.OnDemandFallback > 0 && !al.UseSpot {
				v.warn(lpath+".on-demand-fallback", lat("on-demand-fallback"), "on-demand-fallback applies to use-spot labels only")
			}
			for key, val := range al.DynamicTags {
				if err := validDynamicTag(val); err != nil {
					v.fail(lpath+".dynamic-tags."+key, lat("dynamic-tags", key), "%v", err)
				}
			}
		}
	}
}

// checkThroughput checks a label's throughput, which EC2 takes for gp3
// volumes only. Nodepool loads any throughput and sends it; EC2 refuses the
// launch when the root volume is of another type: that is said as a
// warning, as what a cloud refuses is. Without a volume-type the root
// volume keeps its image's type, known for a diskimage (volume-type, gp3 by
// default) but not for a cloud image.
func checkThroughput(v *validation, p *Provider, pl *PoolLabel, path string, at *yaml.Node) {
	al := &pl.AWSLabel
	refused := func(typ, whose string) {
		v.warn(path, at, "throughput applies to gp3 volumes only: AWS refuses a launch with throughput for %s %s volume, so every launch of label %q fails (Nodepool sends it the same way); remove throughput or set volume-type: gp3", whose, typ, pl.Name)
	}
	switch {
	case al.RootVolumeType == "gp3":
	case al.RootVolumeType != "":
		refused(al.RootVolumeType, "its")
	case pl.Diskimage != "":
		if pd, ok := p.Diskimage(pl.Diskimage); ok && pd.ImageVolumeType != "gp3" {
			refused(pd.ImageVolumeType, fmt.Sprintf("diskimage %s's", pd.Name))
		}
	default:
		v.warn(path, at, "throughput applies to gp3 volumes only, and this label sets no volume-type, so the root volume keeps the type of cloud image %q: AWS refuses the launch unless that is gp3; set volume-type: gp3 to be sure", pl.CloudImage)
	}
}
