package config

import "go.yaml.in/yaml/v3"

// FakeProvider holds the keys of the fake driver's simulated cloud.
type FakeProvider struct {
	BootDelay   Duration `yaml:"boot-delay" drivers:"fake"`
	DeleteDelay Duration `yaml:"delete-delay" drivers:"fake"`
	APIDelay    Duration `yaml:"api-delay" drivers:"fake"`
	FailureRate float64  `yaml:"failure-rate" drivers:"fake"`
	// APIRateLimit makes the simulated cloud refuse calls beyond this many
	// per second from all clients together (0: no limit).
	APIRateLimit float64      `yaml:"api-rate-limit" drivers:"fake"`
	Quota        *CloudQuota  `yaml:"quota" drivers:"fake"`
	Flavors      []FakeFlavor `yaml:"flavors" drivers:"fake"`

	// The fake cloud's image service: the format it takes, how long an
	// upload takes, the share of uploads that fail.
	ImageFormat       string   `yaml:"image-format" drivers:"fake"`
	UploadDelay       Duration `yaml:"upload-delay" drivers:"fake"`
	UploadFailureRate float64  `yaml:"upload-failure-rate" drivers:"fake"`
}

// CloudQuota is a simulated cloud's limits; zero means unlimited.
type CloudQuota struct {
	Instances int `yaml:"instances"`
	Cores     int `yaml:"cores"`
	RAM       int `yaml:"ram"`
}

// FakeFlavor is an instance size of the fake cloud.
type FakeFlavor struct {
	Name  string `yaml:"name" required:"true"`
	Cores int    `yaml:"cores"`
	RAM   int    `yaml:"ram"`
}

// Flavor returns the fake flavor of that name.
func (p *Provider) Flavor(name string) (FakeFlavor, bool) {
	for _, f := range p.Flavors {
		if f.Name == name {
			return f, true
		}
	}
	return FakeFlavor{}, false
}

func fakeDefaults(p *Provider) {
	if p.Cloud == "" {
		p.Cloud = p.Name
	}
	if p.ImageFormat == "" {
		p.ImageFormat = DefaultImageFormat
	}
}

func validateFake(c *Config, v *validation, i int) {
	p := &c.Providers[i]
	path := indexPath("providers", i)
	at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
	if p.set["cloud"] && !validName(p.Cloud) {
		v.fail(path+".cloud", at("cloud"), "cloud name %q is not valid; expected %s", p.Cloud, nameExpected)
	}
	if p.APIRateLimit < 0 {
		v.fail(path+".api-rate-limit", at("api-rate-limit"), "expected 0 (no limit) or more calls per second, got %g", p.APIRateLimit)
	}
	if p.FailureRate < 0 || p.FailureRate > 1 {
		v.fail(path+".failure-rate", at("failure-rate"), "expected a number from 0 to 1, got %g", p.FailureRate)
	}
	if p.UploadFailureRate < 0 || p.UploadFailureRate > 1 {
		v.fail(path+".upload-failure-rate", at("upload-failure-rate"), "expected a number from 0 to 1, got %g", p.UploadFailureRate)
	}
	if q := p.Quota; q != nil && (q.Instances < 0 || q.Cores < 0 || q.RAM < 0) {
		v.fail(path+".quota", at("quota"), "instances, cores and ram must be 0 (no limit) or more")
	}
	flavors := map[string]bool{}
	for j, f := range p.Flavors {
		if flavors[f.Name] {
			v.fail(indexPath(path+".flavors", j)+".name", at("flavors", j, "name"), "flavor %q is defined twice", f.Name)
		}
		flavors[f.Name] = true
		if f.Cores < 0 || f.RAM < 0 {
			v.fail(indexPath(path+".flavors", j), at("flavors", j), "cores and ram must be 0 or more")
		}
	}
	for j, pool := range p.Pools {
		for k, pl := range pool.Labels {
			if pl.FlavorName != "" && !flavors[pl.FlavorName] {
				v.fail(indexPath(indexPath(path+".pools", j)+".labels", k)+".flavor-name", at("pools", j, "labels", k, "flavor-name"),
					"flavor %q is not defined in this provider's flavors", pl.FlavorName)
			}
		}
	}
}
