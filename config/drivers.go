package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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
	// available: the driver is built into this binary (the launcher can
	// run its providers).
	available bool
	// readable: the driver's keys are known, so its providers are decoded
	// and checked strictly, although this build cannot run them (see
	// Config.Unavailable). Every available driver is readable.
	readable bool
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

// knows reports whether the driver's keys are known (it is available, or
// readable only).
func (s driverSpec) knows() bool { return s.available || s.readable }

// driverSpecs are Nodepool's drivers; those built into this binary are
// available.
var driverSpecs = map[string]driverSpec{
	"fake":          {available: true, defaults: fakeDefaults, validate: validateFake},
	"static":        {available: true, defaults: staticDefaults, validate: validateStatic},
	"metastatic":    {available: true, defaults: metastaticDefaults, validate: validateMetastatic},
	"openstack":     {available: true, defaults: openstackDefaults, validate: validateOpenStack},
	"aws":           {available: true, bootTimeout: 180 * time.Second, rate: 2, defaults: awsDefaults, validate: validateAWS},
	"kubernetes":    {available: true, bootTimeout: 300 * time.Second, defaults: kubernetesDefaults, validate: validateKubernetes},
	"azure":         {missing: "was not carried over from Nodepool"},
	"gce":           {missing: "was not carried over from Nodepool"},
	"ibmvpc":        {missing: "was not carried over from Nodepool"},
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

// ReadableDrivers lists the drivers whose keys this build reads and
// checks, sorted: the available ones and those it cannot run yet.
func ReadableDrivers() []string {
	var out []string
	for name, s := range driverSpecs {
		if s.knows() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// DriverAvailable reports whether this build can run providers of a
// driver.
func DriverAvailable(driver string) bool { return driverSpecs[driver].available }

// providerDriver reads a provider's driver before its other keys, so that
// a driver this build does not know is reported alone: the keys only that
// driver knows are not called unknown. It sets d.driver (and d.lenient
// for a driver whose keys are not known).
func (d *decoder) providerDriver(path string, n *yaml.Node) string {
	d.driver, d.lenient = defaultDriver, false
	dn := mappingValue(n, "driver")
	var at *yaml.Node = keyNode(n, "driver")
	switch {
	case dn == nil || isNull(dn):
		at = n
	case dn.Kind != yaml.ScalarNode || dn.Tag != "!!str":
		d.fail(joinPath(path, "driver"), dn, "expected a driver name (one of: %s), got %s", strings.Join(ReadableDrivers(), ", "), describe(dn))
		d.driver, d.lenient = "", true
		return ""
	default:
		d.driver, at = dn.Value, dn
	}
	// A driver this build does not know is reported alone (its keys are
	// not called unknown), and the rest of the file is still checked.
	spec, known := driverSpecs[d.driver]
	switch {
	case spec.knows():
		return d.driver
	case !known:
		msg := fmt.Sprintf("unknown driver %q; expected one of: %s", d.driver, strings.Join(ReadableDrivers(), ", "))
		if alt := nearest(d.driver, ReadableDrivers()); alt != "" {
			msg = fmt.Sprintf("unknown driver %q; did you mean %q? (expected one of: %s)", d.driver, alt, strings.Join(ReadableDrivers(), ", "))
		}
		d.failApart(joinPath(path, "driver"), at, "%s", msg)
	case dn == nil || isNull(dn):
		d.failApart(joinPath(path, "driver"), at, "no driver given, so it is %s (Nodepool's default), and driver %s %s; set driver to one of: %s", d.driver, d.driver, spec.missing, strings.Join(Drivers(), ", "))
	default:
		d.failApart(joinPath(path, "driver"), at, "driver %s %s; expected one of: %s", d.driver, spec.missing, strings.Join(ReadableDrivers(), ", "))
	}
	d.lenient = true
	return d.driver
}
