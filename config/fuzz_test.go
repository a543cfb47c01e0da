package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzParse feeds the loader arbitrary nodepool.yaml and secure files: it
// must never panic or hang, a failure must be config.Errors that each
// name the file, and a configuration it loads must have its defaults
// applied. The corpus is the files of testdata/configs and
// testdata/fuzz/FuzzParse.
//
//	go test ./config -run '^$' -fuzz '^FuzzParse$' -fuzztime 30s -fuzzminimizetime 5s
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "configs", "*.yaml"))
	for _, file := range files {
		if strings.HasSuffix(file, ".secure.yaml") {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		secure, _ := os.ReadFile(strings.TrimSuffix(file, ".yaml") + ".secure.yaml")
		f.Add(data, secure)
	}
	// Nodepool's own fixtures, of every driver and era.
	upstream, _ := filepath.Glob(filepath.Join("testdata", "upstream", "*.yaml"))
	more, _ := filepath.Glob(filepath.Join("testdata", "upstream", "*", "*.yaml"))
	for _, file := range append(upstream, more...) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(formatFieldRE.ReplaceAll(data, []byte("x")), []byte(nil))
	}
	f.Fuzz(func(t *testing.T, data, secure []byte) {
		in := Input{File: "nodepool.yaml", Data: data, Env: []string{"NODEPOOL_X=1", "NODEPOOL_Y=a: b"}}
		if len(secure) > 0 {
			in.SecureFile, in.SecureData = "secure.yaml", secure
		}
		cfg, err := Decode(in)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is not config.Errors: %T %v", err, err)
			}
			for _, e := range es {
				if (e.File != "nodepool.yaml" && e.File != "secure.yaml") || e.Msg == "" || e.Line < 0 {
					t.Fatalf("malformed error %#v", e)
				}
			}
			return
		}
		if cfg.BuildLogRetention == nil {
			t.Fatal("build-log-retention has no default")
		}
		for _, p := range cfg.Providers {
			switch spec := driverSpecs[p.Driver]; {
			case !spec.knows():
				t.Fatalf("provider %s loaded with driver %q, whose keys are not known", p.Name, p.Driver)
			case !spec.available && (cfg.Runnable() == nil || !slices.ContainsFunc(cfg.Unavailable(), func(u *Provider) bool { return u.Name == p.Name })):
				t.Fatalf("provider %s of driver %q, which this build cannot run, is not refused: %v", p.Name, p.Driver, cfg.Runnable())
			}
			for _, pool := range p.Pools {
				if pool.NodeAttributes == nil {
					t.Fatalf("pool %s/%s has no node-attributes map", p.Name, pool.Name)
				}
				for _, pl := range pool.Labels {
					if _, ok := cfg.Label(pl.Name); !ok {
						t.Fatalf("pool %s/%s serves label %q, which is not defined", p.Name, pool.Name, pl.Name)
					}
					if kl := pl.KubernetesLabel; p.Driver == "kubernetes" && (kl.KubePythonPath == "" || (kl.Type == "pod" && kl.Spec == nil && kl.ImagePull == "")) {
						t.Fatalf("kubernetes label %s/%s/%s lacks defaults: %+v", p.Name, pool.Name, pl.Name, kl)
					}
				}
			}
		}
		for _, di := range cfg.Diskimages {
			if di.Username == "" || di.PythonPath == "" || di.DibCmd == "" || di.RebuildAge <= 0 {
				t.Fatalf("diskimage %s lacks defaults: %+v", di.Name, di)
			}
		}
		for _, w := range cfg.Warnings {
			if w.Msg == "" {
				t.Fatalf("empty warning %#v", w)
			}
		}
	})
}
