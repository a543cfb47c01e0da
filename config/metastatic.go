package config

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of the metastatic driver's keys, as metastatic.rst gives them.
const (
	DefaultMetastaticMaxParallelJobs = 1
	DefaultMetastaticGraceTime       = 60 * time.Second
)

// MetastaticPool holds the keys of a metastatic pool.
type MetastaticPool struct {
	// HostKeyChecking is the default of the pool's labels (false: the
	// backing node was checked when it booted).
	HostKeyChecking *bool `yaml:"host-key-checking" drivers:"metastatic"`
}

// MetastaticLabel holds the keys of a metastatic pool's label: which label
// backs it and how backing nodes are shared and given back. Labels of one
// provider with the same backing-label share backing nodes, so their
// backing settings (max-parallel-jobs, grace-time, min-retention-time,
// max-age) must agree.
type MetastaticLabel struct {
	BackingLabel     string   `yaml:"backing-label" drivers:"metastatic"`
	MaxParallelJobs  int      `yaml:"max-parallel-jobs" drivers:"metastatic"`
	GraceTime        Duration `yaml:"grace-time" drivers:"metastatic"`
	MinRetentionTime Duration `yaml:"min-retention-time" drivers:"metastatic"`
	MaxAge           Duration `yaml:"max-age" drivers:"metastatic"`
	// HostKeyChecking: whether a carved node's connection is checked each
	// time a slot is allocated on its backing node. Defaults to the pool's.
	HostKeyChecking *bool `yaml:"host-key-checking" drivers:"metastatic"`
}

// ChecksHostKey reports whether a carved node of this label is checked
// when it gets a slot.
func (ml *MetastaticLabel) ChecksHostKey() bool {
	return ml.HostKeyChecking != nil && *ml.HostKeyChecking
}

func metastaticDefaults(p *Provider) {
	for j := range p.Pools {
		pool := &p.Pools[j]
		if pool.HostKeyChecking == nil {
			f := false
			pool.HostKeyChecking = &f
		}
		for i := range pool.Labels {
			pl := &pool.Labels[i]
			if !pl.set["max-parallel-jobs"] {
				pl.MaxParallelJobs = DefaultMetastaticMaxParallelJobs
			}
			if !pl.set["grace-time"] {
				pl.GraceTime = Duration(DefaultMetastaticGraceTime)
			}
			if pl.HostKeyChecking == nil {
				hkc := *pool.HostKeyChecking
				pl.HostKeyChecking = &hkc
			}
		}
	}
}

// validateMetastatic checks a metastatic provider: pools and their labels
// are required, a backing label must exist and come from a pool of
// another driver, and labels sharing a backing label agree on how backing
// nodes are shared (Nodepool refuses the file otherwise).
func validateMetastatic(c *Config, v *validation, i int) {
	p := &c.Providers[i]
	path := indexPath("providers", i)
	if !p.set["pools"] {
		v.fail(path, v.at("providers", i), "missing required key \"pools\": a metastatic provider needs at least one pool")
	}
	type first struct {
		path string
		pl   *PoolLabel
	}
	byBacking := map[string]first{}
	for j := range p.Pools {
		pool := &p.Pools[j]
		ppath := indexPath(path+".pools", j)
		if !pool.set["labels"] {
			v.fail(ppath, v.at("providers", i, "pools", j), "missing required key \"labels\": a metastatic pool needs labels (name, backing-label)")
		}
		for k := range pool.Labels {
			pl := &pool.Labels[k]
			lpath := indexPath(ppath+".labels", k)
			at := func(rest ...any) *yaml.Node {
				return v.at(append([]any{"providers", i, "pools", j, "labels", k}, rest...)...)
			}
			switch _, defined := c.Label(pl.BackingLabel); {
			case pl.BackingLabel == "":
				v.fail(lpath, at(), "missing required key \"backing-label\": the label of the nodes this label is carved out of")
			case !defined:
				v.fail(lpath+".backing-label", at("backing-label"), "label %q is not defined; expected one of the names under the top-level labels (%s)", pl.BackingLabel, nameList(c.LabelNames()))
			case v.metaLabels[pl.BackingLabel] != "":
				v.fail(lpath+".backing-label", at("backing-label"), "label %q is itself served by metastatic pool %s; expected a label that another driver provides", pl.BackingLabel, v.metaLabels[pl.BackingLabel])
			}
			if pl.MaxParallelJobs < 1 {
				v.fail(lpath+".max-parallel-jobs", at("max-parallel-jobs"), "expected 1 or more, got %d", pl.MaxParallelJobs)
			}
			if pl.MaxAge > 0 && pl.MaxAge < pl.MinRetentionTime {
				v.fail(lpath+".max-age", at("max-age"), "max-age (%s) must be at least min-retention-time (%s)", pl.MaxAge.D(), pl.MinRetentionTime.D())
			}
			if pl.BackingLabel == "" {
				continue
			}
			f, ok := byBacking[pl.BackingLabel]
			if !ok {
				byBacking[pl.BackingLabel] = first{lpath, pl}
				continue
			}
			if diff := backingDifferences(f.pl, pl); diff != "" {
				v.fail(lpath, at(), "label %q shares backing label %q with label %q (%s), so their backing settings must be the same, as in Nodepool; they differ in %s",
					pl.Name, pl.BackingLabel, f.pl.Name, f.path, diff)
			}
		}
	}
}

// backingDifferences names the backing settings in which two labels
// differ ("" if none).
func backingDifferences(a, b *PoolLabel) string {
	var diff []string
	if a.MaxParallelJobs != b.MaxParallelJobs {
		diff = append(diff, fmt.Sprintf("max-parallel-jobs (%d, %d)", a.MaxParallelJobs, b.MaxParallelJobs))
	}
	if a.GraceTime != b.GraceTime {
		diff = append(diff, fmt.Sprintf("grace-time (%s, %s)", a.GraceTime.D(), b.GraceTime.D()))
	}
	if a.MinRetentionTime != b.MinRetentionTime {
		diff = append(diff, fmt.Sprintf("min-retention-time (%s, %s)", a.MinRetentionTime.D(), b.MinRetentionTime.D()))
	}
	if a.MaxAge != b.MaxAge {
		diff = append(diff, fmt.Sprintf("max-age (%s, %s)", a.MaxAge.D(), b.MaxAge.D()))
	}
	return strings.Join(diff, ", ")
}
