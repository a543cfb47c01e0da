package config

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of the diskimage keys, as in Nodepool.
const (
	DefaultRebuildAge        = 24 * time.Hour
	DefaultBuildTimeout      = 8 * time.Hour
	DefaultDibCmd            = "disk-image-create"
	DefaultImageUsername     = "zuul"
	DefaultPythonPath        = "auto"
	DefaultBuildLogRetention = 7
	DefaultImageFormat       = "qcow2"
)

// ImageFormats are the disk image formats a build may produce (the `-t`
// values of disk-image-create that write a file).
var ImageFormats = []string{"qcow2", "raw", "vhd", "vhdx", "vmdk", "vdi", "tar", "tgz", "squashfs"}

// FormatExtension is the file extension disk-image-create gives a format.
func FormatExtension(format string) string {
	if format == "squashfs" {
		return "squash"
	}
	return format
}

// Diskimage is an entry of the top-level `diskimages` list: an image built
// with diskimage-builder (or the command in dib-cmd) and uploaded to every
// provider that lists it.
type Diskimage struct {
	Name     string `yaml:"name" required:"true"`
	Abstract bool   `yaml:"abstract"`
	Parent   string `yaml:"parent"`
	// Elements are diskimage-builder elements; an image adds its own to its
	// parent's.
	Elements []string `yaml:"elements"`
	// Release is passed to diskimage-builder as DIB_RELEASE (a number is
	// fine: release: 8).
	Release string `yaml:"release" anyscalar:"true"`
	// EnvVars are set in the build's environment; an image's own override
	// its parent's, and the secure file's override both.
	EnvVars map[string]string `yaml:"env-vars"`
	// Formats are built in addition to those the providers need.
	Formats []string `yaml:"formats"`
	// DeleteAfterUpload deletes a format's file once every upload of it
	// is done, except the formats in KeepFormats.
	DeleteAfterUpload bool     `yaml:"delete-after-upload"`
	KeepFormats       []string `yaml:"keep-formats"`
	RebuildAge        Duration `yaml:"rebuild-age"`
	BuildTimeout      Duration `yaml:"build-timeout"`
	Pause             bool     `yaml:"pause"`
	DibCmd            string   `yaml:"dib-cmd"`
	// What a node booted from the image is reached with.
	Username   string `yaml:"username"`
	PythonPath string `yaml:"python-path"`
	ShellType  string `yaml:"shell-type"`
	// Metadata are the default metadata (tags) of the image's uploads;
	// a driver adds its own nodepool_* ones.
	Metadata Attributes `yaml:"metadata"`

	// set holds the keys written in the file, for inheritance; secret
	// the env-vars the secure file gave.
	set    map[string]bool
	secret map[string]bool
}

// SecretEnv reports whether an env-var came from the secure file, so its
// value is not written where it could be read (build logs).
func (di *Diskimage) SecretEnv(name string) bool { return di.secret[name] }

// ProviderDiskimage is an entry of a provider's `diskimages`: an image to
// upload to this provider, and how nodes booted from it are reached.
type ProviderDiskimage struct {
	Name string `yaml:"name" required:"true"`
	// Pause stops uploads of the image to this provider.
	Pause bool `yaml:"pause"`
	// ConnectionType and ConnectionPort are what a consumer uses to
	// reach a node booted from the image (default ssh, and 22, or 5986
	// for winrm).
	ConnectionType string `yaml:"connection-type"`
	ConnectionPort int    `yaml:"connection-port"`

	// The keys an openstack provider adds (see openstack.go).
	OpenStackDiskimage `yaml:",inline"`
	// The keys an aws provider adds (aws.go).
	AWSDiskimage `yaml:",inline"`

	set map[string]bool
}

func (di *Diskimage) decodeYAML(d *decoder, path string, n *yaml.Node) {
	di.set = d.decodeStruct(path, n, reflect.ValueOf(di).Elem())
}

func (pd *ProviderDiskimage) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		d.decodeString(path, n, reflect.ValueOf(&pd.Name).Elem(), false)
		pd.set = map[string]bool{"name": true}
		return
	}
	pd.set = d.decodeStruct(path, n, reflect.ValueOf(pd).Elem())
}

// notInherited are the diskimage keys an image never takes from its parent
// (elements and env-vars are merged instead of replaced).
var notInherited = map[string]bool{"name": true, "abstract": true, "parent": true, "elements": true, "env-vars": true}

// resolveDiskimages applies parent inheritance: an image takes every key it
// does not set from its parent (recursively), adds its elements to the
// parent's and merges env-vars, its own winning.
func (c *Config) resolveDiskimages(d *decoder, root *yaml.Node) {
	byName := map[string]int{}
	for i, di := range c.Diskimages {
		if _, dup := byName[di.Name]; !dup {
			byName[di.Name] = i
		}
	}
	const (
		unresolved = iota
		resolving
		resolved
	)
	state := make([]int, len(c.Diskimages))
	var resolve func(i int, chain []string) bool
	resolve = func(i int, chain []string) bool {
		di := &c.Diskimages[i]
		switch state[i] {
		case resolved:
			return true
		case resolving:
			d.fail(indexPath("diskimages", i)+".parent", nodeAt(root, "diskimages", i, "parent"),
				"inheritance loop: %s", strings.Join(append(chain, di.Name), " -> "))
			return false
		}
		if di.Parent == "" {
			state[i] = resolved
			return true
		}
		pi, ok := byName[di.Parent]
		if !ok {
			d.fail(indexPath("diskimages", i)+".parent", nodeAt(root, "diskimages", i, "parent"),
				"parent %q is not defined; expected the name of another diskimage", di.Parent)
			state[i] = resolved
			return false
		}
		state[i] = resolving
		if !resolve(pi, append(chain, di.Name)) {
			state[i] = resolved
			return false
		}
		parent := &c.Diskimages[pi]
		own := reflect.ValueOf(di).Elem()
		from := reflect.ValueOf(parent).Elem()
		for _, f := range reflect.VisibleFields(own.Type()) {
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" || notInherited[key] || di.set[key] {
				continue
			}
			own.FieldByIndex(f.Index).Set(from.FieldByIndex(f.Index))
			if parent.set[key] {
				di.set[key] = true
			}
		}
		di.Elements = append(slices.Clone(parent.Elements), di.Elements...)
		env := map[string]string{}
		for k, v := range parent.EnvVars {
			env[k] = v
		}
		for k, v := range di.EnvVars {
			env[k] = v
		}
		if len(env) > 0 {
			di.EnvVars = env
		}
		state[i] = resolved
		return true
	}
	for i := range c.Diskimages {
		resolve(i, nil)
	}
}

func (c *Config) applyImageDefaults() {
	for i := range c.Diskimages {
		di := &c.Diskimages[i]
		// As in Nodepool, 0 (or nothing) means the default.
		if di.RebuildAge == 0 {
			di.RebuildAge = Duration(DefaultRebuildAge)
		}
		if di.BuildTimeout == 0 {
			di.BuildTimeout = Duration(DefaultBuildTimeout)
		}
		if strings.TrimSpace(di.DibCmd) == "" {
			di.DibCmd = DefaultDibCmd
		}
		if di.Username == "" {
			di.Username = DefaultImageUsername
		}
		if di.PythonPath == "" {
			di.PythonPath = DefaultPythonPath
		}
		if di.ShellType == "" {
			di.ShellType = DefaultShellType
		}
		if di.Metadata == nil {
			di.Metadata = Attributes{}
		}
	}
	for i := range c.Providers {
		p := &c.Providers[i]
		for j := range p.Diskimages {
			pd := &p.Diskimages[j]
			if !pd.set["connection-type"] {
				pd.ConnectionType = DefaultStaticConnectionType
			}
			if !pd.set["connection-port"] {
				pd.ConnectionPort = DefaultStaticSSHPort
				if pd.ConnectionType == "winrm" {
					pd.ConnectionPort = DefaultStaticWinRMPort
				}
			}
		}
	}
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateImages checks the diskimages, the providers' diskimages and the
// pool labels that name one.
func (c *Config) validateImages(v *validation) {
	if r := *c.BuildLogRetention; r < -1 {
		v.fail("build-log-retention", v.at("build-log-retention"), "expected -1 (keep every log) or a number of logs to keep, got %d", r)
	}
	uploaded := map[string]bool{}
	for _, p := range c.Providers {
		for _, pd := range p.Diskimages {
			uploaded[pd.Name] = true
		}
	}
	images := map[string]int{}
	for i, di := range c.Diskimages {
		path := indexPath("diskimages", i)
		at := func(rest ...any) *yaml.Node { return v.at(append([]any{"diskimages", i}, rest...)...) }
		if !validName(di.Name) {
			v.fail(path+".name", at("name"), "diskimage name %q is not valid; expected %s", di.Name, nameExpected)
		}
		if prev, dup := images[di.Name]; dup {
			v.fail(path+".name", at("name"), "diskimage %q is defined twice (also diskimages[%d])", di.Name, prev)
		}
		images[di.Name] = i
		for j, f := range di.Formats {
			if !slices.Contains(ImageFormats, f) {
				v.fail(indexPath(path+".formats", j), at("formats", j), "unknown format %q; expected one of: %s", f, strings.Join(ImageFormats, ", "))
			}
		}
		for j, f := range di.KeepFormats {
			if !slices.Contains(ImageFormats, f) {
				v.fail(indexPath(path+".keep-formats", j), at("keep-formats", j), "unknown format %q; expected one of: %s", f, strings.Join(ImageFormats, ", "))
			}
		}
		if len(di.KeepFormats) > 0 && !di.DeleteAfterUpload && !di.Abstract {
			v.warn(path+".keep-formats", at("keep-formats"), "keep-formats has an effect only with delete-after-upload: true; every format is kept")
		}
		if !di.Abstract && !uploaded[di.Name] && len(di.Formats) == 0 {
			v.warn(path+".name", at("name"), "diskimage %q is not in any provider's diskimages and has no formats, so it is not built", di.Name)
		}
		for j, e := range di.Elements {
			if strings.TrimSpace(e) == "" || strings.ContainsAny(e, " \t\n") {
				v.fail(indexPath(path+".elements", j), at("elements", j), "element %q is not valid; expected an element name without spaces", e)
			}
		}
		for k := range di.EnvVars {
			if !envNameRE.MatchString(k) {
				v.fail(path+".env-vars."+k, at("env-vars"), "%q is not a valid environment variable name; expected A-Z a-z 0-9 _, not starting with a digit", k)
			}
		}
		if strings.ContainsAny(di.DibCmd, `"'\`) {
			v.fail(path+".dib-cmd", at("dib-cmd"), "quoting is not supported; the command is split on whitespace (put a complex command in a script)")
		}
		if strings.ContainsAny(di.Username, " \t\n") {
			v.fail(path+".username", at("username"), "username %q is not valid; expected a user name without spaces", di.Username)
		}
		if strings.ContainsAny(di.ShellType, " \t\n") {
			v.fail(path+".shell-type", at("shell-type"), "shell-type %q is not valid; expected a shell name such as sh, csh or powershell", di.ShellType)
		}
	}
	for i, p := range c.Providers {
		if !driverSpecs[p.Driver].knows() {
			continue
		}
		path := indexPath("providers", i)
		at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
		if p.ImageFormat != "" && !slices.Contains(ImageFormats, p.ImageFormat) {
			v.fail(path+".image-format", at("image-format"), "unknown format %q; expected one of: %s", p.ImageFormat, strings.Join(ImageFormats, ", "))
		}
		listed := map[string]bool{}
		for j, pd := range p.Diskimages {
			dpath := indexPath(path+".diskimages", j)
			di, ok := c.Diskimage(pd.Name)
			switch {
			case !ok:
				v.fail(dpath, at("diskimages", j), "diskimage %q is not defined; expected one of the names under the top-level diskimages (%s)", pd.Name, nameList(c.DiskimageNames()))
			case di.Abstract:
				v.fail(dpath, at("diskimages", j), "diskimage %q is abstract; only images that are built can be uploaded", pd.Name)
			}
			if listed[pd.Name] {
				v.fail(dpath, at("diskimages", j), "diskimage %q is listed twice in this provider", pd.Name)
			}
			listed[pd.Name] = true
			if pd.ConnectionType == "" || strings.ContainsAny(pd.ConnectionType, " \t\n") {
				v.fail(dpath+".connection-type", at("diskimages", j, "connection-type"), "expected a connection type such as ssh or winrm, got %q", pd.ConnectionType)
			}
			if pd.ConnectionPort < 1 || pd.ConnectionPort > 65535 {
				v.fail(dpath+".connection-port", at("diskimages", j, "connection-port"), "expected a port from 1 to 65535, got %d", pd.ConnectionPort)
			}
		}
		for j, pool := range p.Pools {
			for k, pl := range pool.Labels {
				if pl.Diskimage == "" {
					continue
				}
				lpath := indexPath(indexPath(path+".pools", j)+".labels", k)
				lat := at("pools", j, "labels", k, "diskimage")
				if pl.CloudImage != "" {
					v.fail(lpath, lat, "a label boots from a diskimage or a cloud-image, not both")
				}
				switch di, ok := c.Diskimage(pl.Diskimage); {
				case !ok:
					v.fail(lpath+".diskimage", lat, "diskimage %q is not defined; expected one of the names under the top-level diskimages (%s)", pl.Diskimage, nameList(c.DiskimageNames()))
				case di.Abstract:
					v.warn(lpath+".diskimage", lat, "diskimage %q is abstract, so it is never built and this pool cannot launch label %q (Nodepool loads this too); expected one of: %s", pl.Diskimage, pl.Name, nameList(c.DiskimageNames()))
				case !listed[pl.Diskimage]:
					v.warn(lpath+".diskimage", lat, "diskimage %q is not in this provider's diskimages, so it is never uploaded to %s and this pool cannot launch label %q (Nodepool loads this too); add it to the provider's diskimages, or drop the label from this pool", pl.Diskimage, p.Name, pl.Name)
				}
			}
		}
	}
}

// DiskimageNames lists the defined diskimages that are built (not
// abstract), in file order.
func (c *Config) DiskimageNames() []string {
	var names []string
	for _, di := range c.Diskimages {
		if !di.Abstract {
			names = append(names, di.Name)
		}
	}
	return names
}

// Diskimage returns the diskimage of that name.
func (c *Config) Diskimage(name string) (*Diskimage, bool) {
	for i := range c.Diskimages {
		if c.Diskimages[i].Name == name {
			return &c.Diskimages[i], true
		}
	}
	return nil, false
}

// Diskimage returns the provider's entry for an image.
func (p *Provider) Diskimage(name string) (*ProviderDiskimage, bool) {
	for i := range p.Diskimages {
		if p.Diskimages[i].Name == name {
			return &p.Diskimages[i], true
		}
	}
	return nil, false
}

// ImageProviders lists the providers that list an image, in file order.
func (c *Config) ImageProviders(image string) []*Provider {
	var out []*Provider
	for i := range c.Providers {
		if _, ok := c.Providers[i].Diskimage(image); ok {
			out = append(out, &c.Providers[i])
		}
	}
	return out
}

// LoggedEnv is Env with the values of the secure file's variables hidden.
func (c *Config) LoggedEnv(di *Diskimage) []string {
	env := c.Env(di)
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); di.SecretEnv(k) {
			env[i] = k + "=<from the secure file>"
		}
	}
	return env
}

// Env is the environment of the image's build command besides the
// process's own: DIB_RELEASE, ELEMENTS_PATH and the image's env-vars (which
// win).
func (c *Config) Env(di *Diskimage) []string {
	env := map[string]string{}
	if di.Release != "" {
		env["DIB_RELEASE"] = di.Release
	}
	if c.ElementsDir != "" {
		env["ELEMENTS_PATH"] = c.ElementsDir
	}
	for k, v := range di.EnvVars {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, fmt.Sprintf("%s=%s", k, v))
	}
	slices.Sort(out)
	return out
}
