package config

import (
	"cmp"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// nameRE is what provider, pool and diskimage names may hold: they become
// parts of lease keys, record keys and subjects (a dot is written "=" in a
// subject token; see kv.Token).
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

const nameExpected = "1 to 64 of A-Z a-z 0-9 _ - and inner dots"

// labelRE is what label names may hold: they travel in request messages and
// subjects.
var labelRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

func validName(s string) bool { return len(s) <= 64 && nameRE.MatchString(s) }

// validation is one pass of checks over a decoded file: what the types
// alone cannot say (names, references between sections, ranges).
type validation struct {
	d    *decoder
	root *yaml.Node
	// labels: defined label -> index; provided: labels some pool serves;
	// metaLabels: labels served by metastatic pools -> provider/pool;
	// staticHosts: static host identity -> path of its first entry.
	labels      map[string]int
	provided    map[string]bool
	metaLabels  map[string]string
	staticHosts map[string]string
	// duplicates are pool labels listed again later in their pool,
	// dropped once the checks are done.
	duplicates []poolLabelAt
}

func (v *validation) at(path ...any) *yaml.Node { return nodeAt(v.root, path...) }

func (v *validation) fail(path string, n *yaml.Node, format string, args ...any) {
	v.d.fail(path, n, format, args...)
}

func (v *validation) warn(path string, n *yaml.Node, format string, args ...any) {
	v.d.warn(path, n, format, args...)
}

// labelDefined checks that a label a pool names is a top-level label.
func (v *validation) labelDefined(path string, at *yaml.Node, name string) {
	if _, ok := v.labels[name]; !ok {
		v.fail(path, at, "label %q is not defined; expected one of the names under the top-level labels (%s)", name, nameList(v.labelNames()))
	}
}

func (v *validation) labelNames() []string {
	names := make([]string, len(v.labels))
	for n, i := range v.labels {
		names[i] = n
	}
	return names
}

// validate checks the file; problems go to d (errors and warnings).
func (c *Config) validate(d *decoder, root *yaml.Node) {
	v := &validation{d: d, root: root, labels: map[string]int{}, provided: map[string]bool{}, metaLabels: map[string]string{}, staticHosts: map[string]string{}}
	if w := c.Webapp; w != nil {
		if w.Port < 0 || w.Port > 65535 {
			v.fail("webapp.port", v.at("webapp", "port"), "expected a port from 0 to 65535, got %d", w.Port)
		}
		if w.ListenAddress == "" || strings.ContainsAny(w.ListenAddress, " \t\n/") {
			v.fail("webapp.listen_address", v.at("webapp", "listen_address"), "expected an address to listen on such as 0.0.0.0 or 127.0.0.1, got %q", w.ListenAddress)
		}
	}
	for i, l := range c.Labels {
		path := indexPath("labels", i)
		if !labelRE.MatchString(l.Name) || len(l.Name) > 128 {
			v.fail(path+".name", v.at("labels", i, "name"), "label name %q is not valid; expected 1 to 128 of A-Z a-z 0-9 _ - and inner dots", l.Name)
		}
		if prev, dup := v.labels[l.Name]; dup {
			v.fail(path+".name", v.at("labels", i, "name"), "label %q is defined twice (also labels[%d])", l.Name, prev)
			continue
		}
		v.labels[l.Name] = i
	}
	for _, p := range c.Providers {
		if p.Driver != "metastatic" {
			continue
		}
		for _, pool := range p.Pools {
			for _, pl := range pool.Labels {
				v.metaLabels[pl.Name] = p.Name + "/" + pool.Name
			}
		}
	}
	providers := map[string]int{}
	for i := range c.Providers {
		p := &c.Providers[i]
		path := indexPath("providers", i)
		at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
		if !validName(p.Name) {
			v.fail(path+".name", at("name"), "provider name %q is not valid; expected %s", p.Name, nameExpected)
		}
		if prev, dup := providers[p.Name]; dup {
			v.fail(path+".name", at("name"), "provider %q is defined twice (also providers[%d])", p.Name, prev)
		}
		providers[p.Name] = i
		spec := driverSpecs[p.Driver]
		if !spec.knows() {
			// Its keys are not known: count its labels as provided and
			// check nothing more (the driver error says what to do).
			for _, pool := range p.Pools {
				for _, pl := range pool.Labels {
					v.provided[pl.Name] = true
				}
			}
			continue
		}
		if p.Rate < 0 {
			v.fail(path+".rate", at("rate"), "expected 0 (no limit) or more calls per second, got %g", p.Rate)
		}
		c.validatePools(v, i)
		if spec.validate != nil {
			spec.validate(c, v, i)
		}
	}
	tenants := map[string]bool{}
	for i, tl := range c.TenantResourceLimits {
		path := indexPath("tenant-resource-limits", i)
		if tenants[tl.TenantName] {
			v.fail(path+".tenant-name", v.at("tenant-resource-limits", i, "tenant-name"), "tenant %q is listed twice", tl.TenantName)
		}
		tenants[tl.TenantName] = true
	}
	for i, l := range c.Labels {
		if !v.provided[l.Name] {
			v.warn(indexPath("labels", i)+".name", v.at("labels", i, "name"), "label %q is not provided by any pool of this file (fine for a launcher that serves other pools; otherwise add it to a pool's labels)", l.Name)
		}
	}
	c.validateImages(v)
	c.validateZooKeeper(v)
	c.dropDuplicates(v.duplicates)
}

// validatePools checks what every driver's pools have in common.
func (c *Config) validatePools(v *validation, i int) {
	p := &c.Providers[i]
	path := indexPath("providers", i)
	pools := map[string]int{}
	for j := range p.Pools {
		pool := &p.Pools[j]
		ppath := indexPath(path+".pools", j)
		pat := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i, "pools", j}, rest...)...) }
		if !validName(pool.Name) {
			v.fail(ppath+".name", pat("name"), "pool name %q is not valid; expected %s", pool.Name, nameExpected)
		}
		if prev, dup := pools[pool.Name]; dup {
			v.fail(ppath+".name", pat("name"), "pool %q is defined twice in provider %q (also pools[%d])", pool.Name, p.Name, prev)
		}
		pools[pool.Name] = j
		seen := map[string]int{}
		for k, pl := range pool.Labels {
			lpath := indexPath(ppath+".labels", k)
			v.labelDefined(lpath, pat("labels", k), pl.Name)
			if prev, dup := seen[pl.Name]; dup {
				v.warn(lpath, pat("labels", k), "label %q is listed twice in this pool (also labels[%d], line %d); this entry is used and the earlier one ignored, as Nodepool does", pl.Name, prev, lineOf(pat("labels", prev)))
				v.duplicates = append(v.duplicates, poolLabelAt{i, j, prev})
			}
			seen[pl.Name] = k
			v.provided[pl.Name] = true
		}
	}
}

// poolLabelAt is an entry of a pool's labels: providers[p].pools[pool].labels[label].
type poolLabelAt struct{ p, pool, label int }

// dropDuplicates removes the pool labels listed again later in their pool
// (the later entry wins, as in Nodepool, whose pools keep their labels in
// a dict). It runs after every check, whose paths count the entries as
// written.
func (c *Config) dropDuplicates(dups []poolLabelAt) {
	slices.SortFunc(dups, func(a, b poolLabelAt) int {
		return cmp.Or(cmp.Compare(b.p, a.p), cmp.Compare(b.pool, a.pool), cmp.Compare(b.label, a.label))
	})
	for _, d := range dups {
		pool := &c.Providers[d.p].Pools[d.pool]
		later := pool.Labels[d.label+1:]
		if k := slices.IndexFunc(later, func(pl PoolLabel) bool { return pl.Name == pool.Labels[d.label].Name }); k >= 0 {
			// The later entry takes the earlier one's place (a dict's
			// order is the first insertion's).
			pool.Labels[d.label] = later[k]
			pool.Labels = slices.Delete(pool.Labels, d.label+1+k, d.label+2+k)
		}
	}
}

// lineOf is a node's line (0 if there is none).
func lineOf(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// nodeAt finds the node at a path of keys (string) and indexes (int), for
// line numbers; it returns nil when the path is not there.
func nodeAt(n *yaml.Node, path ...any) *yaml.Node {
	for _, p := range path {
		n = resolveAlias(n)
		if n == nil {
			return nil
		}
		switch p := p.(type) {
		case string:
			n = mappingValue(n, p)
		case int:
			if n.Kind != yaml.SequenceNode || p >= len(n.Content) {
				return nil
			}
			n = n.Content[p]
		}
	}
	return n
}
