package aws

import (
	"time"

	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// InstanceType is an entry of the cloud's catalogue.
type InstanceType struct {
	Name      string
	VCPUs     int
	MemoryMiB int
	Arch      string // x86_64 or arm64
}

// DefaultInstanceTypes is a small catalogue of common types, with their
// real sizes.
var DefaultInstanceTypes = []InstanceType{
	{"t3.micro", 2, 1024, "x86_64"},
	{"t3.small", 2, 2048, "x86_64"},
	{"t3.medium", 2, 4096, "x86_64"},
	{"t3.large", 2, 8192, "x86_64"},
	{"t3.xlarge", 4, 16384, "x86_64"},
	{"t4g.medium", 2, 4096, "arm64"},
	{"m5.large", 2, 8192, "x86_64"},
	{"m5.xlarge", 4, 16384, "x86_64"},
	{"m5.2xlarge", 8, 32768, "x86_64"},
	{"m6i.large", 2, 8192, "x86_64"},
	{"m6g.large", 2, 8192, "arm64"},
	{"c5.large", 2, 4096, "x86_64"},
	{"c5.xlarge", 4, 8192, "x86_64"},
	{"c6i.large", 2, 4096, "x86_64"},
	{"r5.large", 2, 16384, "x86_64"},
	{"g4dn.xlarge", 4, 16384, "x86_64"},
	{"p3.2xlarge", 8, 62464, "x86_64"},
	{"x1e.xlarge", 4, 124928, "x86_64"},
	{"inf1.xlarge", 4, 8192, "x86_64"},
	{"u-6tb1.56xlarge", 224, 6291456, "x86_64"},
}

// DefaultQuotas are the vCPU quotas of a fresh cloud: every code of
// awsquota, generous enough for a demo, small enough to reach.
func DefaultQuotas() map[string]float64 {
	q := map[string]float64{}
	for _, qu := range awsquota.Quotas {
		q[qu.Code] = 64
	}
	q["L-1216C47A"] = 256
	q["L-34B43A08"] = 256
	return q
}

// hostQuotas are EC2's quotas of running dedicated hosts for the families
// of DefaultInstanceTypes, with AWS's values (Nodepool's aws driver reads
// them for dedicated-host labels); they are reported, not enforced.
var hostQuotas = []struct {
	family, code string
	value        float64
}{
	{"c5", "L-81657574", 2}, {"c6i", "L-5FA3355A", 2}, {"g4dn", "L-CAE24619", 0}, {"inf", "L-5480EFD2", 2},
	{"m5", "L-8B7BF662", 2}, {"m6g", "L-D50A37FA", 2}, {"m6i", "L-D269BEFD", 2}, {"p3", "L-A0A19F79", 0},
	{"r5", "L-EA4FD6CF", 2}, {"t3", "L-1586174D", 2}, {"u-6tb1", "L-89870E8E", 1}, {"x1e", "L-DEF8E115", 1},
}

// ebsStorageTiB and ebsIOPS are AWS's default EBS quotas per volume type
// (awsquota.VolumeQuotas names them): the storage of all volumes of the
// type, in TiB, and their provisioned IOPS. They are reported, not
// enforced.
var (
	ebsStorageTiB = map[string]float64{"gp2": 50, "gp3": 50, "io1": 50, "io2": 20, "st1": 50, "sc1": 50, "standard": 50}
	ebsIOPS       = map[string]float64{"io1": 300000, "io2": 100000}
)

// SeedImage is an AMI the cloud has from the start (a public image, such
// as the Debian project publishes).
type SeedImage struct {
	ID      string
	Name    string
	Owner   string
	Arch    string
	Created time.Time
}

// DefaultImages are the AMIs of a fresh cloud.
var DefaultImages = []SeedImage{
	{ID: "ami-0a1b2c3d4e5f60001", Name: "debian-12-amd64-20250101-1980", Owner: "136693071363", Arch: "x86_64", Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)},
	{ID: "ami-0a1b2c3d4e5f60002", Name: "debian-12-arm64-20250101-1980", Owner: "136693071363", Arch: "arm64", Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)},
	{ID: "ami-0a1b2c3d4e5f60003", Name: "ubuntu-noble-24.04-amd64-server-20250115", Owner: "099720109477", Arch: "x86_64", Created: time.Date(2025, 1, 15, 0, 0, 0, 0, time.UTC)},
	{ID: "ami-0a1b2c3d4e5f60004", Name: "ubuntu-noble-24.04-amd64-server-20250301", Owner: "099720109477", Arch: "x86_64", Created: time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)},
}
