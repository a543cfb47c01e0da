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
					want.Pools[j].Labels[k].Userdata, want.Pools[j].Labels[k].EC2UserData = "", ""
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

func TestProviderSectionLeavesUserdataOut(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`
labels: [{name: a}]
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
            userdata: "secret-ish"
    cloud-images: [{name: img}]
`))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ProviderSection(&c.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "secret-ish") {
		t.Errorf("the section keeps the userdata: %s", raw)
	}
	if c.Providers[0].Pools[0].Labels[0].Userdata != "secret-ish" {
		t.Errorf("ProviderSection changed the configuration in force")
	}
	for _, bad := range []string{`{}`, `{"Name": "x", "Driver": "gce"}`, `not json`} {
		if _, err := ProviderFromSection([]byte(bad)); err == nil {
			t.Errorf("ProviderFromSection(%s) took it", bad)
		}
	}
}
