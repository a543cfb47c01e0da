package config

import (
	"errors"
	"os"
	"path/filepath"
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
			if !driverSpecs[p.Driver].available {
				t.Fatalf("provider %s loaded with driver %q, which is not available", p.Name, p.Driver)
			}
			for _, pool := range p.Pools {
				if pool.NodeAttributes == nil {
					t.Fatalf("pool %s/%s has no node-attributes map", p.Name, pool.Name)
				}
				for _, pl := range pool.Labels {
					if _, ok := cfg.Label(pl.Name); !ok {
						t.Fatalf("pool %s/%s serves label %q, which is not defined", p.Name, pool.Name, pl.Name)
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
