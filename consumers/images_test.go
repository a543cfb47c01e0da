package consumers_test

import (
	"maps"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

const withDiskimage = `
diskimages:
  - name: debian
    username: debian-config
labels:
  - name: debian
  - name: ubuntu
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.05
    diskimages:
      - name: debian
        connection-type: winrm
    pools:
      - name: main
        node-attributes: {executor-zone: east, gpu: 1}
        labels:
          - {name: debian, diskimage: debian}
          - {name: ubuntu, cloud-image: ubuntu-noble}
`

// A request for a label that boots from a diskimage waits, neither declined
// nor failed, until an upload of the image to the provider is ready; the
// node then boots from the newest ready upload, and its record says how to
// reach it as the upload's build was made (username, python-path,
// shell-type) and as the provider's entry for the image says (connection
// type and port); the pool's node-attributes are its attributes.
func TestLaunchWaitsForImage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, withDiskimage)
	h.startLauncher("l1")
	// Recorded first (concurrent intake workers may record two requests
	// in either order): once the pool served the other request, it has
	// seen this one too.
	waiting := h.submitRecorded(events.RequestMessage{Labels: []string{"debian"}})
	other := h.submit(events.RequestMessage{Labels: []string{"ubuntu"}})
	h.waitDone(10*time.Second, other)
	if r, _ := h.request(waiting); r.State != kv.RequestRequested || len(r.DeclinedBy) != 0 {
		t.Fatalf("request for an image not uploaded yet: %s, declined by %v (%s)", r.State, r.DeclinedBy, r.Reason)
	}

	// Uploads appear, as the builder would make them: an image in the
	// cloud and a ready upload record naming it; the newest first (the
	// request may be served as soon as one exists), then an older one.
	drv, err := fake.New(t.Context(), h.js, &h.cfg.Providers[0], fake.Options{Replicas: 1}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Close)
	images := kv.NewImageStores(h.b.Images)
	var newest string
	for i, build := range []string{"0000000002", "0000000001"} {
		id, err := drv.InjectImage(t.Context(), "debian-"+build, map[string]string{drivers.TagProvider: "cloud1"})
		if err != nil {
			t.Fatal(err)
		}
		u := kv.ImageUpload{Image: "debian", BuildID: build, Provider: "cloud1", ID: kv.ImageSeqID(uint64(i + 1)),
			State: kv.ImageReady, StateTime: time.Now().UTC(), ExternalID: id, Format: "qcow2",
			Username: "debian-" + build, PythonPath: "/usr/bin/python3", ShellType: "csh"}
		if _, err := images.Uploads.Create(t.Context(), u.Key(), &u); err != nil {
			t.Fatal(err)
		}
		if newest == "" {
			newest = id
		}
	}
	h.waitDone(10*time.Second, waiting)
	r, _ := h.request(waiting)
	if r.State != kv.RequestFulfilled {
		t.Fatalf("request %s: %s", r.State, r.Reason)
	}
	n, _ := h.node(r.Nodes[0])
	if n.ImageID != newest {
		t.Errorf("node booted from %q, want the newest upload %q", n.ImageID, newest)
	}
	if n.Username != "debian-0000000002" || n.PythonPath != "/usr/bin/python3" || n.ShellType != "csh" ||
		n.ConnectionType != "winrm" || n.ConnectionPort != 5986 {
		t.Errorf("diskimage node access: username %q python_path %q shell_type %q connection %s:%d",
			n.Username, n.PythonPath, n.ShellType, n.ConnectionType, n.ConnectionPort)
	}
	if want := map[string]string{"executor-zone": "east", "gpu": "1"}; !maps.Equal(n.Attributes, want) {
		t.Errorf("attributes = %v, want %v", n.Attributes, want)
	}
	inst, ok := h.instances["cloud1"].Get(n.ExternalID)
	if !ok || inst.Value.Image != newest {
		t.Errorf("instance image = %q", inst.Value.Image)
	}
	// The label without a diskimage boots its cloud image as before.
	o, _ := h.request(other)
	on, _ := h.node(o.Nodes[0])
	if on.ImageID != "ubuntu-noble" {
		t.Errorf("cloud-image node booted from %q", on.ImageID)
	}
	// Nothing says otherwise: Nodepool's defaults.
	if on.Username != "zuul" || on.PythonPath != "auto" || on.ShellType != "sh" || on.ConnectionType != "ssh" || on.ConnectionPort != 22 ||
		on.Attributes["executor-zone"] != "east" {
		t.Errorf("cloud-image node access: %+v", on)
	}
}
