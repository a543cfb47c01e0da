package kv_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

func validImageData() kv.ImageData {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return kv.ImageData{Format: kv.ImageDataFormat, Version: kv.ImageDataVersion, Exported: now,
		Images: []kv.DiskImage{{Name: "debian", BuildSeq: 3, UploadSeq: 5}},
		Builds: []kv.ImageBuild{{Image: "debian", ID: "0000000003", State: kv.ImageReady, StateTime: now}},
		Uploads: []kv.ImageUpload{{Image: "debian", BuildID: "0000000003", Provider: "cloud1", ID: "0000000005",
			State: kv.ImageReady, ExternalID: "img-1", StateTime: now}},
	}
}

func TestParseImageData(t *testing.T) {
	t.Parallel()
	good, err := json.Marshal(validImageData())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := kv.ParseImageData(good); err != nil || len(d.Uploads) != 1 || d.Uploads[0].ExternalID != "img-1" {
		t.Fatalf("a valid file: %v %+v", err, d)
	}
	edit := func(fn func(*kv.ImageData)) string {
		d := validImageData()
		fn(&d)
		data, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	for _, c := range []struct {
		name, data, want string
	}{
		{"not JSON", "{", "not an image data file"},
		{"two documents", string(good) + string(good), "more than one JSON document"},
		{"unknown key", `{"format": "nodepool-image-data", "version": 1, "nodes": []}`, `unknown field "nodes"`},
		{"other format", edit(func(d *kv.ImageData) { d.Format = "zk-dump" }), `format "zk-dump" version 1; expected "nodepool-image-data" version 1`},
		{"newer version", edit(func(d *kv.ImageData) { d.Version = 2 }), "expected \"nodepool-image-data\" version 1"},
		{"bad image name", edit(func(d *kv.ImageData) { d.Builds[0].Image = "de bian" }), `builds[0]: image "de bian": expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots`},
		{"empty name part", edit(func(d *kv.ImageData) { d.Images[0].Name = "de..bian" }), `images[0]: name "de..bian": expected`},
		{"bad build id", edit(func(d *kv.ImageData) { d.Uploads[0].BuildID = "x1" }), `uploads[0]: build_id "x1": expected a numeric id`},
		{"bad provider", edit(func(d *kv.ImageData) { d.Uploads[0].Provider = "" }), `uploads[0]: provider "": expected`},
		{"bad state", edit(func(d *kv.ImageData) { d.Builds[0].State = "baking" }), `builds[0]: state "baking"`},
		{"duplicate", edit(func(d *kv.ImageData) { d.Builds = append(d.Builds, d.Builds[0]) }), "record debian.0000000003 appears twice"},
	} {
		_, err := kv.ParseImageData([]byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v; want it to say %q", c.name, err, c.want)
		}
	}
}

// A file from outside never panics the parser, and what it accepts has
// keys the bucket can hold.
func FuzzParseImageData(f *testing.F) {
	good, _ := json.Marshal(validImageData())
	f.Add(good)
	f.Add([]byte(`{"format":"nodepool-image-data","version":1,"images":[{"name":"a"}],"builds":null,"uploads":[]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"format":"nodepool-image-data","version":1,"builds":[{"image":"debian.12","id":"1","state":"ready"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := kv.ParseImageData(data)
		if err != nil {
			return
		}
		for _, b := range d.Builds {
			if strings.ContainsAny(b.Key(), " *>") || strings.Count(b.Key(), ".") != 1 {
				t.Fatalf("accepted build key %q", b.Key())
			}
		}
		for _, u := range d.Uploads {
			if strings.ContainsAny(u.Key(), " *>") || strings.Count(u.Key(), ".") != 3 {
				t.Fatalf("accepted upload key %q", u.Key())
			}
		}
	})
}
