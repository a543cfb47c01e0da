package config

import (
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// How a driver's keys are declared (the convention every driver follows):
//
//   - A key that every driver has is a field of Provider, Pool or
//     PoolLabel without a `drivers` tag.
//   - A key that some drivers share, with one meaning, is a field there
//     tagged `drivers:"a,b"` (launch-retries, diskimage, max-cores...).
//   - A key of one driver alone lives in a struct of config/<driver>.go
//     (FakeProvider, StaticPool, MetastaticLabel...) embedded anonymously
//     with `yaml:",inline"` in Provider, Pool or PoolLabel, every field
//     tagged `drivers:"<driver>"`.
//
// The decoder stores a key in the first field of that name whose drivers
// tag names the provider's driver, so one key may exist for several
// drivers with a different type each (give the Go fields different names).
// A driver's defaults and checks are the hooks of its driverSpec below.

// defaultDriver is the driver of a provider without a `driver` key, as in
// Nodepool.
const defaultDriver = "openstack"

// driverSpec is what the loader knows of a driver.
type driverSpec struct {
	// available: the driver is built into this binary.
	available bool
	// missing says why a driver of Nodepool's is not available.
	missing string
	// bootTimeout and rate are the driver's defaults of those keys when
	// they differ from the common ones (0: the common default).
	bootTimeout time.Duration
	rate        float64
	// defaults fills the driver's keys a provider left out (after the
	// common defaults).
	defaults func(p *Provider)
	// validate checks a provider of the driver; at points at lines under
	// providers[i].
	validate func(c *Config, v *validation, i int)
}

// driverSpecs are Nodepool's drivers; those built into this binary are
// available.
var driverSpecs = map[string]driverSpec{
	"fake":          {available: true, defaults: fakeDefaults, validate: validateFake},
	"static":        {available: true, defaults: staticDefaults, validate: validateStatic},
	"metastatic":    {available: true, defaults: metastaticDefaults, validate: validateMetastatic},
	"openstack":     {available: true, defaults: openstackDefaults, validate: validateOpenStack},
	"aws":           {available: true, bootTimeout: 180 * time.Second, rate: 2, defaults: awsDefaults, validate: validateAWS},
	"azure":         {missing: "was not carried over from Nodepool"},
	"gce":           {missing: "was not carried over from Nodepool"},
	"ibmvpc":        {missing: "was not carried over from Nodepool"},
	"kubernetes":    {missing: "was not carried over from Nodepool"},
	"openshift":     {missing: "was not carried over from Nodepool"},
	"openshiftpods": {missing: "was not carried over from Nodepool"},
}

// Drivers lists the provider drivers this build has, sorted.
func Drivers() []string {
	var out []string
	for name, s := range driverSpecs {
		if s.available {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// providerDriver reads a provider's driver before its other keys, so that
// a driver this build does not have is reported alone: the keys only that
// driver knows are not called unknown. It sets d.driver (and d.lenient
// for a driver that is not available).
func (d *decoder) providerDriver(path string, n *yaml.Node) string {
	d.driver, d.lenient = defaultDriver, false
	dn := mappingValue(n, "driver")
	var at *yaml.Node = keyNode(n, "driver")
	switch {
	case dn == nil || isNull(dn):
		at = n
	case dn.Kind != yaml.ScalarNode || dn.Tag != "!!str":
		d.fail(joinPath(path, "driver"), dn, "expected a driver name (one of: %s), got %s", strings.Join(Drivers(), ", "), describe(dn))
		d.driver, d.lenient = "", true
		return ""
	default:
		d.driver, at = dn.Value, dn
	}
	spec, known := driverSpecs[d.driver]
	switch {
	case spec.available:
		return d.driver
	case !known:
		d.fail(joinPath(path, "driver"), at, "unknown driver %q; expected one of: %s", d.driver, strings.Join(Drivers(), ", "))
	case dn == nil || isNull(dn):
		d.fail(joinPath(path, "driver"), at, "no driver given, so it is %s (Nodepool's default), and driver %s %s; set driver to one of: %s", d.driver, d.driver, spec.missing, strings.Join(Drivers(), ", "))
	default:
		d.fail(joinPath(path, "driver"), at, "driver %s %s; expected one of: %s", d.driver, spec.missing, strings.Join(Drivers(), ", "))
	}
	d.lenient = true
	return d.driver
}
