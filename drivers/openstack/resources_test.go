package openstack

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/nodepool-nats/nodepool/drivers"
	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
)

const volumeConfig = `
labels: [{name: bfv}]
providers:
  - name: os
    cloud: dev
    rate: 0
    port-cleanup-interval: 0.2
    cloud-images: [{name: cirros, image-name: cirros-0.6.2-x86_64-disk}]
    pools:
      - name: main
        auto-floating-ip: false
        host-key-checking: false
        labels:
          - name: bfv
            cloud-image: cirros
            flavor-name: m1.small
            boot-from-volume: true
            volume-size: 30
`

func TestBootFromVolume(t *testing.T) {
	t.Parallel()
	q := devos.Quota{Instances: -1, Cores: -1, RAM: -1, Volumes: 3, Gigabytes: 100, FloatingIPs: -1}
	e := newEnv(t, volumeConfig, devos.Options{Quota: &q, VolumeTime: 50 * time.Millisecond})
	p := e.provider()
	if r, err := p.QuotaForLabel("main", "bfv"); err != nil || r.Other[drivers.ResourceVolumes] != 1 || r.Other[drivers.ResourceVolumeGB] != 30 {
		t.Errorf("QuotaForLabel: %+v, %v", r, err)
	}
	sm, _ := p.Create(request("v1", "bfv", 1), nil)
	step, err := advance(t, sm)
	if err != nil {
		t.Fatal(err)
	}
	vols := e.cloud.Volumes()
	if len(vols) != 1 || vols[0].Size != 30 || vols[0].Server != step.Instance.ExternalID || vols[0].Metadata[drivers.TagNode] != "v1" {
		t.Fatalf("volumes: %+v", vols)
	}
	if s := e.cloud.Servers()[0]; s.ImageID != "" || len(s.Volumes) != 1 || len(e.cloud.FloatingIPs()) != 0 {
		t.Errorf("server %+v booted from its volume, floating IPs %+v", s, e.cloud.FloatingIPs())
	}
	if r := step.Instance.Resources; r.Other[drivers.ResourceVolumes] != 1 || r.Other[drivers.ResourceVolumeGB] != 30 {
		t.Errorf("instance resources: %+v", r)
	}
	// Cinder's quota: what this provider's volumes hold is not taken off
	// (the launcher counts its nodes itself); another volume is.
	if _, err := volumes.Create(t.Context(), e.clients().volume, volumes.CreateOpts{Size: 10, Name: "someone-elses"}, nil).Extract(); err != nil {
		t.Fatal(err)
	}
	lim, err := p.QuotaLimits(t.Context())
	if err != nil || lim.Other[drivers.ResourceVolumes] != 2 || lim.Other[drivers.ResourceVolumeGB] != 90 {
		t.Errorf("QuotaLimits: %+v, %v", lim, err)
	}
	// The volume goes with its server.
	dm, _ := p.Delete(step.Instance.ExternalID, nil)
	if _, err := advance(t, dm); err != nil {
		t.Fatal(err)
	}
	until(t, "the boot volume is gone", func() bool { return len(e.cloud.Volumes()) == 1 })
	// Over Cinder's quota, the launcher waits.
	e.cloud.SetQuota(devos.Quota{Instances: -1, Cores: -1, RAM: -1, Volumes: 1, Gigabytes: 100, FloatingIPs: -1})
	sm, _ = p.Create(request("v2", "bfv", 1), nil)
	if _, err := advance(t, sm); !errors.Is(err, drivers.ErrQuotaExceeded) || !strings.Contains(err.Error(), "VolumeLimitExceeded") {
		t.Errorf("over the volume quota: %v", err)
	}
}

// A failed attempt's volume is dropped by the next attempt; leaked volumes
// (a node without a record) are deleted by the sweep, on second sight.
func TestVolumeLeaks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, volumeConfig, devos.Options{})
	p := e.provider()
	sm, _ := p.Create(request("v1", "bfv", 1), nil)
	advanceTo(t, sm, stepServer) // the attempt dies with its volume made
	sm2, _ := p.Create(request("v1", "bfv", 2), nil)
	if _, err := advance(t, sm2); err != nil {
		t.Fatal(err)
	}
	vols := e.cloud.Volumes()
	if len(vols) != 1 || vols[0].Metadata[TagAttempt] != "2" {
		t.Errorf("volumes after the second attempt: %+v", vols)
	}
	// A volume of a node that has no record, attached to nothing.
	cl := e.clients()
	v, err := volumes.Create(t.Context(), cl.volume, volumes.CreateOpts{Size: 1, Metadata: map[string]string{
		drivers.TagProvider: "os", drivers.TagNode: "gone"}}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	known := func(id string) bool { return id == "v1" }
	for range 2 {
		if err := p.Sweep(t.Context(), known); err != nil {
			t.Fatal(err)
		}
	}
	for _, vi := range e.cloud.Volumes() {
		if vi.ID == v.ID {
			t.Errorf("leaked volume %s still there", v.ID)
		}
	}
	if len(e.cloud.Volumes()) != 1 {
		t.Errorf("the known node's volume went too: %+v", e.cloud.Volumes())
	}
}

func TestSweepFloatingIPsAndPorts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, volumeConfig, devos.Options{})
	p := e.provider()
	cl := e.clients()
	ext, err := p.resolve(t.Context(), "external-network", "", p.findExternalNetwork(cl))
	if err != nil {
		t.Fatal(err)
	}
	loose, err := floatingips.Create(t.Context(), cl.network, floatingips.CreateOpts{FloatingNetworkID: ext}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := p.resolve(t.Context(), "network", "private", p.findNetwork(cl))
	down, err := ports.Create(t.Context(), cl.network, ports.CreateOpts{NetworkID: priv, Name: "leaked"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	owner := "network:router_interface"
	router, err := ports.Create(t.Context(), cl.network, ports.CreateOpts{NetworkID: priv, DeviceOwner: owner}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	// First sight: nothing goes.
	if err := p.Sweep(t.Context(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if len(e.cloud.FloatingIPs()) != 1 || len(e.cloud.Ports()) != 2 {
		t.Fatalf("first sweep deleted: %+v %+v", e.cloud.FloatingIPs(), e.cloud.Ports())
	}
	// Once the port has been DOWN for port-cleanup-interval (0.2 s), and
	// the floating IP seen twice, they go; router ports stay.
	until(t, "the DOWN port and the floating IP are swept", func() bool {
		if err := p.Sweep(t.Context(), func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		return len(e.cloud.FloatingIPs()) == 0 && len(e.cloud.Ports()) == 1
	})
	if left := e.cloud.Ports(); left[0].ID != router.ID {
		t.Errorf("port left: %+v (loose was %s, DOWN %s)", left, loose.ID, down.ID)
	}
}

const imageConfig = `
labels: [{name: debian}]
diskimages:
  - name: debian
    username: debian
    shell-type: bash
providers:
  - name: os
    cloud: dev
    rate: 0
    image-name-format: "nodepool-{image_name}-{timestamp}"
    post-upload-hook: %s
    diskimages:
      - name: debian
        meta: {os_distro: debian, hw_disk_bus: scsi}
        connection-port: 2222
    pools:
      - name: main
        auto-floating-ip: false
        host-key-checking: false
        labels: [{name: debian, diskimage: debian, flavor-name: m1.tiny}]
`

func TestImages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook.sh")
	// The hook records its arguments and the image file's content; it
	// fails for the second upload.
	script := "#!/bin/sh\nn=$(ls " + dir + "/call-* 2>/dev/null | wc -l)\necho \"$1 $2\" > " + dir + "/call-$n\ncat \"$3\" >> " + dir + "/call-$n\n[ \"$n\" = 0 ]\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, strings.Replace(imageConfig, "%s", hook, 1), devos.Options{})
	p := e.provider()
	if p.ImageFormat() != "qcow2" {
		t.Errorf("format %s", p.ImageFormat())
	}
	tags := map[string]string{drivers.TagProvider: "os", drivers.TagImage: "debian", drivers.TagBuild: "0000000001", drivers.TagUpload: "debian.0000000001.os.0000000001"}
	data := bytes.Repeat([]byte("qcow"), 4096)
	img, err := p.UploadImage(t.Context(), drivers.ImageUpload{Name: "debian-0000000001", Format: "qcow2", Size: int64(len(data)), Tags: tags, Data: bytes.NewReader(data)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(img.Name, "nodepool-debian-") || img.Size != int64(len(data)) || img.Tags[drivers.TagUpload] != tags[drivers.TagUpload] || img.Tags["os_distro"] != "debian" {
		t.Errorf("uploaded image: %+v", img)
	}
	call, err := os.ReadFile(filepath.Join(dir, "call-0"))
	if err != nil || !bytes.Equal(call, append([]byte("os "+img.ExternalID+"\n"), data...)) {
		t.Errorf("hook call: %q..., %v", call[:min(len(call), 60)], err)
	}
	all, err := p.ListImages(t.Context())
	if err != nil || len(all) != 2 {
		t.Fatalf("images: %+v, %v", all, err)
	}
	// A node boots from the upload (the launcher fills in how to reach
	// it from the upload and the provider's entry for the image).
	req := request("d1", "debian", 1)
	req.ImageID = img.ExternalID
	sm, _ := p.Create(req, nil)
	step, err := advance(t, sm)
	if err != nil {
		t.Fatal(err)
	}
	inst := step.Instance
	if inst.ImageID != img.ExternalID || inst.Username != "" || inst.ConnectionPort != 0 || e.cloud.Servers()[0].ImageID != img.ExternalID {
		t.Errorf("node from the upload: %+v", inst)
	}
	// A label whose diskimage has no upload yet cannot boot.
	if sm, _ := p.Create(request("d2", "debian", 1), nil); sm != nil {
		if _, err := advance(t, sm); err == nil || !strings.Contains(err.Error(), "no ready upload") {
			t.Errorf("no upload: %v", err)
		}
	}
	// The hook fails the second upload: its image is deleted.
	_, err = p.UploadImage(t.Context(), drivers.ImageUpload{Format: "qcow2", Tags: tags, Data: bytes.NewReader(data)})
	if err == nil || !strings.Contains(err.Error(), "post-upload-hook") {
		t.Errorf("failing hook: %v", err)
	}
	if n := len(e.cloud.Images()); n != 2 {
		t.Errorf("%d images after the failed upload, want 2", n)
	}
	if err := p.DeleteImage(t.Context(), img.ExternalID); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteImage(t.Context(), img.ExternalID); err != nil {
		t.Errorf("deleting a gone image: %v", err)
	}
}
