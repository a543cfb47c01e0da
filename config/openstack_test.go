package config

import (
	"strings"
	"testing"
	"time"
)

// Every key of Nodepool's openstack.rst, in the shape its examples use.
const openstackFull = `
labels:
  - name: trusty
  - name: precise
  - name: windows
diskimages:
  - name: trusty
  - name: precise
providers:
  - name: provider1
    cloud: example
    region-name: 'region1'
    rate: 0.5
    boot-timeout: 120
    launch-timeout: 900
    launch-retries: 3
    image-name-format: '{image_name}-{timestamp}'
    post-upload-hook: /usr/bin/custom-hook
    clean-floating-ips: false
    port-cleanup-interval: 0
    image-upload-timeout: 600
    nodepool-id: prod
    diskimages:
      - name: trusty
        meta:
          key: value
          key2: value
      - name: precise
        config-drive: true
        pause: false
    cloud-images:
      - name: windows-external
        image-id: "1234"
        config-drive: false
        username: Administrator
        python-path: /usr/bin/python3
        shell-type: powershell
        connection-type: winrm
      - name: trusty-external
        image-name: "Ubuntu 14.04"
    pools:
      - name: main
        max-servers: 96
        max-cores: 200
        max-ram: 400000
        max-volumes: 10
        max-volume-gb: 500
        ignore-provider-quota: true
        availability-zones: [az1]
        networks: [some-network-name]
        security-groups: [zuul-security-group]
        auto-floating-ip: False
        host-key-checking: True
        labels:
          - name: trusty
            min-ram: 8192
            diskimage: trusty
            console-log: True
            boot-from-volume: true
            volume-size: 80
            key-name: zuul
            userdata: "#cloud-config"
            instance-properties: {a: b}
            dynamic-instance-properties:
              request_info: "Created for request {request.id} by {request.requestor_data[job]}"
          - name: precise
            min-ram: 8192
            flavor-name: 'something to match'
            diskimage: precise
            host-key-checking: false
            networks: [public, private]
          - name: windows
            flavor-name: m1.large
            cloud-image: windows-external
`

func TestParseOpenStack(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(openstackFull))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := cfg.Provider("provider1")
	if p.Driver != "openstack" {
		t.Errorf("driver left out is %q, want openstack", p.Driver)
	}
	if p.Cloud != "example" || p.Region != "region1" || p.RateSeconds != 0.5 || p.CallsPerSecond() != 2 {
		t.Errorf("provider: cloud %q region %q rate %g (%g calls/s)", p.Cloud, p.Region, p.RateSeconds, p.CallsPerSecond())
	}
	if p.CleansFloatingIPs() || p.PortCleanupInterval != 0 || p.ImageUploadTimeout.D() != 10*time.Minute || p.NodepoolID != "prod" {
		t.Errorf("cleanup keys: %+v", p.OpenStackProvider)
	}
	if p.BootTimeout.D() != 2*time.Minute || p.LaunchTimeout.D() != 15*time.Minute || p.LaunchRetries != 3 {
		t.Errorf("timeouts: %+v", p)
	}
	trusty, _ := p.Diskimage("trusty")
	precise, _ := p.Diskimage("precise")
	if trusty.Meta["key2"] != "value" || precise.ConfigDrive == nil || !*precise.ConfigDrive || trusty.ConnectionPort != 22 {
		t.Errorf("diskimages: %+v %+v", trusty, precise)
	}
	win, ok := p.OpenStackCloudImage("windows-external")
	if !ok || win.Ref() != "1234" || win.ConnectionPort != 5986 || win.ShellType != "powershell" || *win.ConfigDrive {
		t.Errorf("cloud image: %+v", win)
	}
	ext, _ := p.OpenStackCloudImage("trusty-external")
	if ext.Ref() != "Ubuntu 14.04" || ext.Username != "zuul" || ext.PythonPath != "auto" || ext.ConnectionType != "ssh" {
		t.Errorf("cloud image defaults: %+v", ext)
	}
	pool, _ := p.Pool("main")
	if !pool.IgnoreProviderQuota || pool.MaxVolumes != 10 || pool.MaxVolumeGB != 500 || pool.AutoFloatingIPs() {
		t.Errorf("pool: %+v", pool.OpenStackPool)
	}
	tl, _ := pool.Label("trusty")
	pl, _ := pool.Label("precise")
	if !tl.BootFromVolume || tl.VolumeSize != 80 || tl.KeyName != "zuul" || !tl.ConsoleLog || tl.InstanceProperties["a"] != "b" {
		t.Errorf("label trusty: %+v", tl.OpenStackLabel)
	}
	if !pool.ChecksLabelHostKeys(&tl) || pool.ChecksLabelHostKeys(&pl) {
		t.Error("host-key-checking: the label's overrides the pool's")
	}
	if got := pool.LabelNetworks(&pl); strings.Join(got, ",") != "public,private" {
		t.Errorf("label networks: %v", got)
	}
	if got := pool.LabelNetworks(&tl); strings.Join(got, ",") != "some-network-name" {
		t.Errorf("pool networks: %v", got)
	}
	if pl.VolumeSize != DefaultVolumeSize {
		t.Errorf("volume-size default: %d", pl.VolumeSize)
	}
}

func TestOpenStackDefaults(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(`
labels: [{name: small}]
providers:
  - name: cloud
    cloud: devcloud
    cloud-images: [{name: cirros}]
    pools:
      - name: main
        labels: [{name: small, cloud-image: cirros, min-ram: 1024}]
`))
	if err != nil {
		t.Fatal(err)
	}
	p := &cfg.Providers[0]
	if p.RateSeconds != 1 || p.CallsPerSecond() != 1 {
		t.Errorf("rate defaults to one second between calls: %g, %g", p.RateSeconds, p.CallsPerSecond())
	}
	if p.ImageNameFormat != "{image_name}-{timestamp}" || !p.CleansFloatingIPs() || p.PortCleanupInterval.D() != 10*time.Minute || p.ImageUploadTimeout.D() != time.Hour {
		t.Errorf("defaults: %+v", p.OpenStackProvider)
	}
	pool := &p.Pools[0]
	if !pool.AutoFloatingIPs() || !pool.ChecksLabelHostKeys(&pool.Labels[0]) {
		t.Error("auto-floating-ip and host-key-checking default to true")
	}
	// rate: 0 turns pacing off.
	cfg, err = Parse("nodepool.yaml", []byte(strings.Replace(`
labels: [{name: small}]
providers:
  - name: cloud
    cloud: devcloud
    rate: 0
    cloud-images: [{name: cirros}]
    pools:
      - name: main
        labels: [{name: small, cloud-image: cirros, flavor-name: m1.small}]
`, "\t", "", -1)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Providers[0].CallsPerSecond() != 0 {
		t.Errorf("rate 0: %g calls per second", cfg.Providers[0].CallsPerSecond())
	}
}

func TestOpenStackErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown cloud image", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `providers[0].pools[0].labels[0].cloud-image: cloud image "c" is not in this provider's cloud-images`},
		{"no image", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    pools: [{name: main, labels: [{name: a, flavor-name: f}]}]
`, `needs "cloud-image"`},
		{"no flavor", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    cloud-images: [{name: c}]
    pools: [{name: main, labels: [{name: a, cloud-image: c}]}]
`, `needs "flavor-name" or "min-ram"`},
		{"image id and name", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    cloud-images: [{name: c, image-id: i, image-name: n}]
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `nodepool.yaml:6: providers[0].cloud-images[0]: image-id and image-name are mutually exclusive`},
		{"negative rate", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    rate: -1
    cloud-images: [{name: c}]
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `nodepool.yaml:6: providers[0].rate: expected 0 (no pacing) or more seconds between API calls`},
		{"bad connection type", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    cloud-images: [{name: c, connection-type: telnet}]
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `providers[0].cloud-images[0].connection-type: expected one of ssh, winrm or network_cli, got "telnet"`},
		{"bad dynamic property", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    cloud-images: [{name: c}]
    pools:
      - name: main
        labels:
          - name: a
            cloud-image: c
            flavor-name: f
            dynamic-instance-properties: {x: "{request.nope}"}
`, `dynamic-instance-properties.x: "{request.nope}": unknown field {request.nope}`},
		{"bad image name format", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    image-name-format: "{image}-{stamp}"
    cloud-images: [{name: c}]
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `providers[0].image-name-format: image-name-format "{image}-{stamp}": unknown field {image}`},
		{"fake key on openstack", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    boot-delay: 1
    cloud-images: [{name: c}]
    pools: [{name: main, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `nodepool.yaml:6: providers[0].boot-delay: the openstack driver has no such key (it is a key of the fake driver)`},
		{"wrong type", `
labels: [{name: a}]
providers:
  - name: p
    cloud: x
    cloud-images: [{name: c}]
    pools: [{name: main, max-volumes: many, labels: [{name: a, cloud-image: c, flavor-name: f}]}]
`, `providers[0].pools[0].max-volumes: expected an integer, got "many"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("nodepool.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v\nwant an error containing %q", err, tc.want)
			}
		})
	}
}

func TestExpandRequestTemplate(t *testing.T) {
	fields := map[string]string{"id": "0000000042", "requestor": "zuul", "requestor_data.job": "tox"}
	got, err := ExpandRequestTemplate("{{literal}} {request.id} by {request.requestor} for {request.requestor_data[job]}", func(f, k string) (string, bool) {
		if k != "" {
			f += "." + k
		}
		v, ok := fields[f]
		return v, ok
	})
	if err != nil || got != "{literal} 0000000042 by zuul for tox" {
		t.Errorf("got %q, %v", got, err)
	}
	if _, err := ExpandRequestTemplate("{request.id", func(string, string) (string, bool) { return "", true }); err == nil {
		t.Error("an unclosed brace is an error")
	}
	name, err := FormatImageName("{image_name}-{timestamp}", "debian", time.Unix(1700000000, 0))
	if err != nil || name != "debian-1700000000" {
		t.Errorf("image name: %q, %v", name, err)
	}
}
