package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// clearSet zeroes the `set` fields (which keys a file wrote: used while
// loading only), everywhere in v.
func clearSet(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			clearSet(v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			clearSet(v.Index(i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Field(i)
			if v.Type().Field(i).Name == "set" {
				// Unexported: reached through its address.
				f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
				f.Set(reflect.Zero(f.Type()))
				continue
			}
			if v.Type().Field(i).IsExported() {
				clearSet(f)
			}
		}
	}
}

// Every provider of the examples and of the test configurations, each
// driver's keys, comes back from its remembered section as it was loaded
// (but for the labels' userdata, which is left out).
func TestProviderSectionRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("testdata/configs/*.yaml")
	examples, _ := filepath.Glob("../examples/*.yaml")
	drivers := map[string]bool{}
	for _, f := range append(files, examples...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(f, data)
		if err != nil {
			continue // a test of errors
		}
		for i := range c.Providers {
			p := &c.Providers[i]
			raw, err := ProviderSection(p)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			got, err := ProviderFromSection(raw)
			if !slices.Contains(Drivers(), p.Driver) {
				// Read and checked, but not runnable here: nothing can be
				// drained with it.
				if err == nil || !strings.Contains(err.Error(), "not available in this build") {
					t.Errorf("%s: provider %s of driver %s, which this build cannot run, read back: %v", f, p.Name, p.Driver, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			want := *p.clone()
			for j := range want.Pools {
				for k := range want.Pools[j].Labels {
					lb := &want.Pools[j].Labels[k]
					lb.Userdata, lb.EC2UserData, lb.Env, lb.Spec = "", "", nil, nil
				}
			}
			clearSet(reflect.ValueOf(&want))
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("%s: provider %s does not come back from its section:\n got %+v\nwant %+v", f, p.Name, *got, want)
			}
			drivers[p.Driver] = true
		}
	}
	for _, d := range Drivers() {
		if !drivers[d] {
			t.Errorf("no provider of driver %s was tried", d)
		}
	}
}

func TestProviderSectionLeavesSecretsOut(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`
labels: [{name: a}, {name: b}, {name: c}]
providers:
  - name: os
    driver: openstack
    cloud: c
    pools:
      - name: p
        labels:
          - name: a
            cloud-image: img
            flavor-name: f
            userdata: "secret-userdata"
    cloud-images: [{name: img}]
  - name: k8s
    driver: kubernetes
    context: ctx
    pools:
      - name: p
        labels:
          - name: b
            type: pod
            image: img
            env: [{name: TOKEN, value: secret-env}]
          - name: c
            type: pod
            spec:
              containers:
                - name: main
                  image: img
                  env: [{name: TOKEN, value: secret-spec}]
`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Providers {
		raw, err := ProviderSection(&c.Providers[i])
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{"secret-userdata", "secret-env", "secret-spec"} {
			if strings.Contains(string(raw), secret) {
				t.Errorf("the section of %s keeps %s: %s", c.Providers[i].Name, secret, raw)
			}
		}
		if _, err := ProviderFromSection(raw); err != nil {
			t.Errorf("the section of %s does not read back: %v", c.Providers[i].Name, err)
		}
	}
	if c.Providers[0].Pools[0].Labels[0].Userdata != "secret-userdata" || len(c.Providers[1].Pools[0].Labels[0].Env) != 1 || c.Providers[1].Pools[0].Labels[1].Spec == nil {
		t.Errorf("ProviderSection changed the configuration in force")
	}
	for _, bad := range []string{`{}`, `{"Name": "x", "Driver": "gce"}`, `{"Name": "x", "Driver": "nosuch"}`, `not json`} {
		if _, err := ProviderFromSection([]byte(bad)); err == nil {
			t.Errorf("ProviderFromSection(%s) took it", bad)
		}
	}
}
