package config

import (
	"strings"
	"testing"
	"time"
)

// awsDoc is aws.rst's example provider, with the labels it names and a
// diskimage, as an operator's file would have them.
const awsDoc = `
labels:
  - name: debian9
  - name: debian9-large
  - name: fleet-label
  - name: built
diskimages:
  - name: debian-built
    elements: [debian-minimal]
providers:
  - name: ec2-us-west-2
    driver: aws
    region-name: us-west-2
    max-servers: 7
    max-resources:
      'L-43DA4232': 448
    object-storage:
      bucket-name: nodepool-images
    cloud-images:
      - name: debian9
        image-id: ami-09c308526d9534717
        username: admin
      - name: by-filters
        image-filters:
          - name: name
            values:
             - named-ami
        username: ubuntu
    diskimages:
      - name: debian-built
        import-method: ebs-direct
        imds-support: v2.0
        tags: {team: ci}
    pools:
      - name: main
        max-servers: 5
        subnet-id: subnet-0123456789abcdef0
        security-group-id: sg-01234567890abcdef
        node-attributes: {key: value}
        labels:
          - name: debian9
            cloud-image: debian9
            instance-type: t3.medium
            iam-instance-profile:
              arn: arn:aws:iam::123456789012:instance-profile/s3-read-only
            key-name: zuul
            tags:
              key1: value1
          - name: debian9-large
            cloud-image: debian9
            instance-type: t3.large
            key-name: zuul
            use-spot: True
            on-demand-fallback: 3
            dynamic-tags:
              request_info: "Created for request {request.id} of {request.requestor_data[project]}"
            tags:
              key1: value1
              key2: value2
      - name: fleets
        public-ip-address: false
        use-internal-ip: true
        labels:
          - name: fleet-label
            cloud-image: by-filters
            fleet:
              instance-types: [t3.medium, t3.large]
              allocation-strategy: prioritized
            key-name: zuul
          - name: built
            diskimage: debian-built
            instance-type: m5.large
            key-name: zuul
            volume-type: gp3
            throughput: 250
            imdsv2: required
`

func TestAWSKeys(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(awsDoc))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Providers[0]
	if p.Rate != 2 || p.BootTimeout.D() != 180*time.Second || p.LaunchTimeout.D() != time.Hour || p.LaunchRetries != 3 {
		t.Errorf("provider defaults: rate %g boot-timeout %s launch-timeout %s launch-retries %d", p.Rate, p.BootTimeout.D(), p.LaunchTimeout.D(), p.LaunchRetries)
	}
	if p.RegionName != "us-west-2" || p.DiskFormat != "raw" || p.ObjectStorage.BucketName != "nodepool-images" {
		t.Errorf("provider keys: %+v", p.AWSProvider)
	}
	main, fleets := p.Pools[0], p.Pools[1]
	if main.MaxServers != 5 || fleets.MaxServers != 7 || fleets.MaxCores != Unlimited {
		t.Errorf("pool limits: main %d, fleets %d (cores %d)", main.MaxServers, fleets.MaxServers, fleets.MaxCores)
	}
	if main.AWSPool.MaxResources["L-43DA4232"] != 448 || fleets.AWSPool.MaxResources["L-43DA4232"] != 448 {
		t.Errorf("max-resources not inherited: %v %v", main.AWSPool.MaxResources, fleets.AWSPool.MaxResources)
	}
	if !main.AssignsPublicIPv4() || fleets.AssignsPublicIPv4() || !fleets.UseInternalIP || !main.ChecksHostKeys() || !main.AssignsPublicIPv6() {
		t.Errorf("pool network keys: %+v %+v", main.AWSPool, fleets.AWSPool)
	}
	l := main.Labels[1]
	if !l.UseSpot || l.OnDemandFallback != 3 || l.EC2KeyName != "zuul" || l.Tags["key2"] != "value2" {
		t.Errorf("label: %+v", l.AWSLabel)
	}
	if main.Labels[0].IAMInstanceProfile.Arn == "" {
		t.Errorf("iam-instance-profile: %+v", main.Labels[0].IAMInstanceProfile)
	}
	if f := fleets.Labels[0].Fleet; f == nil || len(f.InstanceTypes) != 2 || f.AllocationStrategy != "prioritized" {
		t.Errorf("fleet: %+v", f)
	}
	pd := p.Diskimages[0]
	if pd.Architecture != "x86_64" || !pd.HasENASupport() || pd.ImageVolumeType != "gp3" || pd.ImportMethod != "ebs-direct" || pd.ImageTags["team"] != "ci" {
		t.Errorf("diskimage: %+v", pd.AWSDiskimage)
	}
	ci, _ := p.AWSCloudImage("by-filters")
	if ci.ImageRef() != "" || len(ci.ImageFilters) != 1 || ci.ImageFilters[0].Values[0] != "named-ami" {
		t.Errorf("cloud image: %+v", ci)
	}
}

func TestAWSErrors(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"no region", "    region-name: us-west-2\n", "", `missing required key "region-name"`},
		{"bad image format", "    max-servers: 7\n", "    max-servers: 7\n    image-format: qcow2\n", "image-format: expected one of ova, vhd, vhdx, vmdk, raw"},
		{"unknown cloud image", "            cloud-image: debian9\n            instance-type: t3.medium", "            cloud-image: nope\n            instance-type: t3.medium", `cloud image "nope" is not in this provider's cloud-images`},
		{"no instance type", "            instance-type: t3.medium\n", "", "needs instance-type or fleet"},
		{"both", "              allocation-strategy: prioritized\n", "              allocation-strategy: prioritized\n            instance-type: t3.small\n", "instance-type and fleet exclude each other"},
		{"spot strategy", "              allocation-strategy: prioritized\n", "              allocation-strategy: prioritized\n            use-spot: true\n", `expected one of price-capacity-optimized, capacity-optimized, diversified, lowest-price for spot instances, got "prioritized"`},
		{"profile both", "              arn: arn", "              name: x\n              arn: arn", "expected name or arn (one of them)"},
		{"imdsv2", "            imdsv2: required", "            imdsv2: always", `imdsv2: expected optional or required, got "always"`},
		{"key-name", "            instance-type: m5.large\n            key-name: zuul\n", "            instance-type: m5.large\n", `missing required key "key-name"`},
		{"import method", "        import-method: ebs-direct", "        import-method: magic", "import-method: expected one of snapshot, image, ebs-direct"},
		{"dedicated host", "            instance-type: t3.large\n", "            instance-type: t3.large\n            dedicated-host: true\n", "dedicated-host and use-spot exclude each other"},
		{"dynamic tag", "{request.id}", "{request.nope}", "unknown field {request.nope}"},
		{"both image refs", "        image-id: ami-09c308526d9534717\n", "        image-id: ami-09c308526d9534717\n        image-filters: [{name: a, values: [b]}]\n", "give image-id or image-filters, not both"},
		{"unknown key", "        use-internal-ip: true\n", "        use-internal-ip: true\n        flavor-name: x\n", "flavor-name: unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(awsDoc, tc.old, tc.new, 1)
			if doc == awsDoc {
				t.Fatalf("the case changes nothing")
			}
			_, err := Parse("nodepool.yaml", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v does not contain %q", err, tc.want)
			}
		})
	}
}
