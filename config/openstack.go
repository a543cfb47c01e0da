package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of the openstack driver's keys, as in Nodepool.
const (
	DefaultOpenStackRate                = 1.0 // seconds between API calls
	DefaultImageNameFormat              = "{image_name}-{timestamp}"
	DefaultPortCleanupInterval          = 600 * time.Second
	DefaultImageUploadTimeout           = time.Hour
	DefaultVolumeSize                   = 50 // GiB
	DefaultCloudImageUsername           = "zuul"
	DefaultCloudImageConnectionType     = "ssh"
	DefaultCloudImageSSHPort            = 22
	DefaultCloudImageWinRMPort          = 5986
	OpenStackConnectionTypesDescription = "ssh, winrm or network_cli"
)

// OpenStackConnectionTypes are the values of connection-type of cloud
// images and diskimages.
var OpenStackConnectionTypes = []string{"ssh", "winrm", "network_cli"}

// OpenStackProvider holds the keys only an openstack provider has. The
// cloud's name (`cloud`, an entry of clouds.yaml) is Provider.Cloud, which
// the fake driver shares.
type OpenStackProvider struct {
	// RateSeconds is Nodepool's `rate` of an openstack provider: seconds
	// between API calls (0: no pacing). Provider.Rate holds it as calls
	// per second.
	RateSeconds     float64 `yaml:"rate" drivers:"openstack"`
	Region          string  `yaml:"region-name" drivers:"openstack"`
	ImageNameFormat string  `yaml:"image-name-format" drivers:"openstack"`
	// PostUploadHook runs after an upload, before the image is used:
	// HOOK PROVIDER EXTERNAL_IMAGE_ID LOCAL_IMAGE_FILENAME; a failure
	// deletes the image.
	UploadHook          string   `yaml:"post-upload-hook" drivers:"openstack"`
	CleanFloatingIPs    *bool    `yaml:"clean-floating-ips" drivers:"openstack"`
	PortCleanupInterval Duration `yaml:"port-cleanup-interval" drivers:"openstack"`
	ImageUploadTimeout  Duration `yaml:"image-upload-timeout" drivers:"openstack"`
	// NodepoolID is Nodepool's deprecated nodepool-id: when set, instances
	// are tagged with it and only instances carrying it count as ours.
	NodepoolID           string                `yaml:"nodepool-id" drivers:"openstack"`
	OpenStackCloudImages []OpenStackCloudImage `yaml:"cloud-images" drivers:"openstack"`
}

// OpenStackCloudImage is an entry of an openstack provider's cloud-images:
// an image the cloud already has.
type OpenStackCloudImage struct {
	Name           string `yaml:"name" required:"true"`
	ConfigDrive    *bool  `yaml:"config-drive"`
	ImageID        string `yaml:"image-id"`
	ImageName      string `yaml:"image-name"`
	Username       string `yaml:"username"`
	PythonPath     string `yaml:"python-path"`
	ShellType      string `yaml:"shell-type"`
	ConnectionType string `yaml:"connection-type"`
	ConnectionPort int    `yaml:"connection-port"`
}

// Ref is what to look the image up by in the cloud: its image-id, its
// image-name, or else its name (an id or a name).
func (ci *OpenStackCloudImage) Ref() string {
	switch {
	case ci.ImageID != "":
		return ci.ImageID
	case ci.ImageName != "":
		return ci.ImageName
	}
	return ci.Name
}

// OpenStackDiskimage holds the keys an openstack provider's diskimages
// entry adds (connection-type and -port are ProviderDiskimage's).
type OpenStackDiskimage struct {
	// Meta becomes Glance image properties of the uploads.
	Meta        map[string]string `yaml:"meta" drivers:"openstack"`
	ConfigDrive *bool             `yaml:"config-drive" drivers:"openstack"`
}

// OpenStackPool holds the keys only an openstack pool has.
type OpenStackPool struct {
	Networks            []string `yaml:"networks" drivers:"openstack"`
	SecurityGroups      []string `yaml:"security-groups" drivers:"openstack"`
	AvailabilityZones   []string `yaml:"availability-zones" drivers:"openstack"`
	AutoFloatingIP      *bool    `yaml:"auto-floating-ip" drivers:"openstack"`
	CheckHostKeys       *bool    `yaml:"host-key-checking" drivers:"openstack"`
	IgnoreProviderQuota bool     `yaml:"ignore-provider-quota" drivers:"openstack"`
	// MaxVolumes and MaxVolumeGB are Unlimited when absent; 0 is a limit
	// of zero.
	MaxVolumes  int `yaml:"max-volumes" drivers:"openstack"`
	MaxVolumeGB int `yaml:"max-volume-gb" drivers:"openstack"`
}

// OpenStackLabel holds the keys only an openstack pool's label has
// (cloud-image, diskimage and flavor-name are PoolLabel's, shared with the
// fake driver).
type OpenStackLabel struct {
	MinRAM                    int               `yaml:"min-ram" drivers:"openstack"`
	BootFromVolume            bool              `yaml:"boot-from-volume" drivers:"openstack"`
	VolumeSize                int               `yaml:"volume-size" drivers:"openstack"`
	KeyName                   string            `yaml:"key-name" drivers:"openstack"`
	ConsoleLog                bool              `yaml:"console-log" drivers:"openstack"`
	Userdata                  string            `yaml:"userdata" drivers:"openstack"`
	InstanceProperties        map[string]string `yaml:"instance-properties" drivers:"openstack"`
	DynamicInstanceProperties map[string]string `yaml:"dynamic-instance-properties" drivers:"openstack"`
	// HostKeyChecking and Networks override the pool's.
	CheckHostKeys *bool    `yaml:"host-key-checking" drivers:"openstack"`
	Networks      []string `yaml:"networks" drivers:"openstack"`
}

// CallsPerSecond is the provider's rate as calls per second, whatever the
// driver's `rate` means (0: no limit); the launcher paces the provider's
// API calls with it.
func (p *Provider) CallsPerSecond() float64 { return p.Rate }

// CleansFloatingIPs reports clean-floating-ips (default true).
func (op *OpenStackProvider) CleansFloatingIPs() bool {
	return op.CleanFloatingIPs == nil || *op.CleanFloatingIPs
}

// CloudImage returns the provider's cloud-images entry of that name.
func (op *OpenStackProvider) OpenStackCloudImage(name string) (*OpenStackCloudImage, bool) {
	for i := range op.OpenStackCloudImages {
		if op.OpenStackCloudImages[i].Name == name {
			return &op.OpenStackCloudImages[i], true
		}
	}
	return nil, false
}

// ChecksHostKeys reports whether a label's nodes have their SSH host keys
// scanned (the label's host-key-checking, else the pool's, default true).
func (p *Pool) ChecksLabelHostKeys(pl *PoolLabel) bool {
	switch {
	case pl.CheckHostKeys != nil:
		return *pl.CheckHostKeys
	case p.OpenStackPool.CheckHostKeys != nil:
		return *p.OpenStackPool.CheckHostKeys
	}
	return true
}

// LabelNetworks are the networks a label's nodes attach to: the label's,
// else the pool's.
func (p *Pool) LabelNetworks(pl *PoolLabel) []string {
	if pl.OpenStackLabel.Networks != nil {
		return pl.OpenStackLabel.Networks
	}
	return p.OpenStackPool.Networks
}

// AutoFloatingIPs reports auto-floating-ip (default true).
func (p *Pool) AutoFloatingIPs() bool {
	return p.AutoFloatingIP == nil || *p.AutoFloatingIP
}

// openstackDefaults fills the keys an openstack provider left out.
func openstackDefaults(p *Provider) {
	op := &p.OpenStackProvider
	if !p.set["rate"] {
		op.RateSeconds = DefaultOpenStackRate
	}
	p.Rate = 0
	if op.RateSeconds > 0 {
		p.Rate = 1 / op.RateSeconds
	}
	if op.ImageNameFormat == "" {
		op.ImageNameFormat = DefaultImageNameFormat
	}
	if !p.set["port-cleanup-interval"] {
		op.PortCleanupInterval = Duration(DefaultPortCleanupInterval)
	}
	if op.ImageUploadTimeout == 0 {
		op.ImageUploadTimeout = Duration(DefaultImageUploadTimeout)
	}
	for i := range op.OpenStackCloudImages {
		ci := &op.OpenStackCloudImages[i]
		if ci.Username == "" {
			ci.Username = DefaultCloudImageUsername
		}
		if ci.PythonPath == "" {
			ci.PythonPath = DefaultPythonPath
		}
		if ci.ConnectionType == "" {
			ci.ConnectionType = DefaultCloudImageConnectionType
		}
		if ci.ConnectionPort == 0 {
			ci.ConnectionPort = defaultConnectionPort(ci.ConnectionType)
		}
	}
	for j := range p.Pools {
		pool := &p.Pools[j]
		if !pool.set["max-volumes"] {
			pool.MaxVolumes = Unlimited
		}
		if !pool.set["max-volume-gb"] {
			pool.MaxVolumeGB = Unlimited
		}
		for k := range pool.Labels {
			ol := &pool.Labels[k].OpenStackLabel
			if ol.VolumeSize == 0 {
				ol.VolumeSize = DefaultVolumeSize
			}
		}
	}
}

func defaultConnectionPort(connectionType string) int {
	if connectionType == "winrm" {
		return DefaultCloudImageWinRMPort
	}
	return DefaultCloudImageSSHPort
}

// validateOpenStack checks what an openstack provider's keys must hold.
func validateOpenStack(c *Config, v *validation, i int) {
	d := v
	at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
	p := &c.Providers[i]
	op := &p.OpenStackProvider
	path := indexPath("providers", i)
	if strings.TrimSpace(p.Cloud) == "" {
		// Nodepool's launcher hands no cloud to openstacksdk, which then
		// takes OS_CLOUD, or else the OS_* credentials of the environment.
		if env := strings.TrimSpace(v.d.getenv("OS_CLOUD")); env != "" {
			p.Cloud = env
			d.warn(path, at(), "no cloud given, so cloud %q of clouds.yaml is used (OS_CLOUD), as Nodepool's openstacksdk does; write cloud: %s to say so in the file", env, env)
		} else {
			d.warn(path, at(), "no cloud given: Nodepool's openstacksdk would then use OS_CLOUD or the OS_AUTH_URL, OS_USERNAME... variables of its environment; this launcher reads credentials from clouds.yaml only, so it cannot reach this provider's cloud until cloud names an entry of clouds.yaml (or OS_CLOUD is set)")
		}
	}
	if op.RateSeconds < 0 {
		d.fail(path+".rate", at("rate"), "expected 0 (no pacing) or more seconds between API calls, got %g", op.RateSeconds)
	}
	if _, err := FormatImageName(op.ImageNameFormat, "image", time.Unix(0, 0)); err != nil {
		d.fail(path+".image-name-format", at("image-name-format"), "%v", err)
	}
	if op.PortCleanupInterval < 0 {
		d.fail(path+".port-cleanup-interval", at("port-cleanup-interval"), "expected 0 (no port cleanup) or more seconds")
	}
	checkConn := func(cpath string, cat func(...any) *yaml.Node, typ string, port int) {
		if !slices.Contains(OpenStackConnectionTypes, typ) {
			d.fail(cpath+".connection-type", cat("connection-type"), "expected one of %s, got %q", OpenStackConnectionTypesDescription, typ)
		}
		if port < 1 || port > 65535 {
			d.fail(cpath+".connection-port", cat("connection-port"), "expected a port from 1 to 65535, got %d", port)
		}
	}
	images := map[string]bool{}
	for j, ci := range op.OpenStackCloudImages {
		cpath := indexPath(path+".cloud-images", j)
		cat := func(rest ...any) *yaml.Node { return at(append([]any{"cloud-images", j}, rest...)...) }
		if images[ci.Name] {
			d.fail(cpath+".name", cat("name"), "cloud image %q is listed twice", ci.Name)
		}
		images[ci.Name] = true
		if ci.ImageID != "" && ci.ImageName != "" {
			d.fail(cpath, cat(), "image-id and image-name are mutually exclusive; give one")
		}
		checkConn(cpath, cat, ci.ConnectionType, ci.ConnectionPort)
	}
	for j, pool := range p.Pools {
		ppath := indexPath(path+".pools", j)
		pat := func(rest ...any) *yaml.Node { return at(append([]any{"pools", j}, rest...)...) }
		if pool.MaxVolumes < 0 || pool.MaxVolumeGB < 0 {
			d.fail(ppath, pat(), "max-volumes and max-volume-gb must be 0 or more")
		}
		for _, list := range []struct {
			key   string
			items []string
		}{{"networks", pool.Networks}, {"security-groups", pool.SecurityGroups}, {"availability-zones", pool.AvailabilityZones}} {
			for k, v := range list.items {
				if strings.TrimSpace(v) == "" {
					d.fail(indexPath(ppath+"."+list.key, k), pat(list.key, k), "expected a name or id, got an empty string")
				}
			}
		}
		for k, pl := range pool.Labels {
			lpath := indexPath(ppath+".labels", k)
			lat := func(rest ...any) *yaml.Node { return pat(append([]any{"labels", k}, rest...)...) }
			switch {
			case pl.CloudImage == "" && pl.Diskimage == "":
				d.fail(lpath, lat(), "a label needs \"cloud-image\" (an entry of the provider's cloud-images) or \"diskimage\" (an entry of its diskimages)")
			case pl.CloudImage != "" && !images[pl.CloudImage]:
				d.fail(lpath+".cloud-image", lat("cloud-image"), "cloud image %q is not in this provider's cloud-images; expected one of: %s", pl.CloudImage, strings.Join(cloudImageNames(op), ", "))
			}
			if pl.FlavorName == "" && pl.MinRAM == 0 {
				d.fail(lpath, lat(), "a label needs \"flavor-name\" or \"min-ram\" to choose its flavor")
			}
			if pl.MinRAM < 0 {
				d.fail(lpath+".min-ram", lat("min-ram"), "expected 0 or more MiB, got %d", pl.MinRAM)
			}
			if pl.VolumeSize < 1 {
				d.fail(lpath+".volume-size", lat("volume-size"), "expected 1 or more gigabytes, got %d", pl.VolumeSize)
			}
			for key, tmpl := range pl.DynamicInstanceProperties {
				if _, err := ExpandRequestTemplate(tmpl, func(string, string) (string, bool) { return "", true }); err != nil {
					d.fail(lpath+".dynamic-instance-properties."+key, lat("dynamic-instance-properties"), "%v", err)
				}
			}
		}
	}
}

func cloudImageNames(op *OpenStackProvider) []string {
	names := make([]string, len(op.OpenStackCloudImages))
	for i, ci := range op.OpenStackCloudImages {
		names[i] = ci.Name
	}
	if len(names) == 0 {
		return []string{"(none defined)"}
	}
	return names
}

// FormatImageName applies image-name-format: {image_name} and
// {timestamp} (Unix seconds), as Nodepool's format string.
func FormatImageName(format, image string, at time.Time) (string, error) {
	return expandBraces(format, func(field string) (string, error) {
		switch field {
		case "image_name":
			return image, nil
		case "timestamp":
			return fmt.Sprint(at.Unix()), nil
		}
		return "", fmt.Errorf("image-name-format %q: unknown field {%s}; expected {image_name} and {timestamp}", format, field)
	})
}

// RequestFields are the fields of {request.FIELD} in
// dynamic-instance-properties.
var RequestFields = []string{"id", "labels", "requestor", "requestor_data", "relative_priority", "event_id", "created_time", "tenant_name"}

// ExpandRequestTemplate expands a dynamic-instance-properties value:
// {request.FIELD} and {request.requestor_data[KEY]}, with {{ and }} for
// braces, as Python's format does. lookup gives a field's value (key is
// the requestor_data key, or "").
func ExpandRequestTemplate(tmpl string, lookup func(field, key string) (string, bool)) (string, error) {
	return expandBraces(tmpl, func(ref string) (string, error) {
		field, ok := strings.CutPrefix(ref, "request.")
		if !ok {
			return "", fmt.Errorf("%q: unknown field {%s}; expected {request.FIELD} with FIELD one of %s", tmpl, ref, strings.Join(RequestFields, ", "))
		}
		key := ""
		if name, rest, ok := strings.Cut(field, "["); ok {
			if !strings.HasSuffix(rest, "]") || name != "requestor_data" {
				return "", fmt.Errorf("%q: {%s}: only requestor_data takes a [key]", tmpl, ref)
			}
			field, key = name, strings.Trim(strings.TrimSuffix(rest, "]"), `'"`)
		}
		if !slices.Contains(RequestFields, field) {
			return "", fmt.Errorf("%q: unknown field {%s}; expected {request.FIELD} with FIELD one of %s", tmpl, ref, strings.Join(RequestFields, ", "))
		}
		v, ok := lookup(field, key)
		if !ok {
			return "", fmt.Errorf("%q: {%s} has no value for this request", tmpl, ref)
		}
		return v, nil
	})
}

// expandBraces replaces {name} with value(name), {{ and }} with braces.
func expandBraces(s string, value func(string) (string, error)) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '{' && i+1 < len(s) && s[i+1] == '{':
			b.WriteByte('{')
			i++
		case ch == '}' && i+1 < len(s) && s[i+1] == '}':
			b.WriteByte('}')
			i++
		case ch == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("%q: a { is not closed", s)
			}
			v, err := value(s[i+1 : i+end])
			if err != nil {
				return "", err
			}
			b.WriteString(v)
			i += end
		case ch == '}':
			return "", fmt.Errorf("%q: a single } (write }} for a brace)", s)
		default:
			b.WriteByte(ch)
		}
	}
	return b.String(), nil
}
