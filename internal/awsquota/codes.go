// Package awsquota knows how AWS counts machines against Service Quotas:
// EC2's running instances are limited in vCPUs per instance family, each
// family group with a quota code of its own (L-1216C47A for the standard
// families, L-34B43A08 for their spot instances, ...), and EBS volumes in
// storage (TiB) and provisioned IOPS per volume type. The AWS driver and
// the AWS dev cloud both need these tables.
package awsquota

import "strings"

// ServiceCode is the Service Quotas service code of EC2.
const ServiceCode = "ec2"

// Quota is one vCPU quota of EC2.
type Quota struct {
	Code string
	Name string
	Spot bool
}

// Quotas lists EC2's vCPU quotas of running instances.
var Quotas = []Quota{
	{"L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", false},
	{"L-74FC7D96", "Running On-Demand F instances", false},
	{"L-DB2E81BA", "Running On-Demand G and VT instances", false},
	{"L-1945791B", "Running On-Demand Inf instances", false},
	{"L-417A185B", "Running On-Demand P instances", false},
	{"L-7295265B", "Running On-Demand X instances", false},
	{"L-43DA4232", "Running On-Demand High Memory instances", false},
	{"L-6E869C2A", "Running On-Demand DL instances", false},
	{"L-2C3B7624", "Running On-Demand Trn instances", false},
	{"L-F7808C92", "Running On-Demand HPC instances", false},
	{"L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", true},
	{"L-88CF9481", "All F Spot Instance Requests", true},
	{"L-3819A6DF", "All G and VT Spot Instance Requests", true},
	{"L-B5D1601B", "All Inf Spot Instance Requests", true},
	{"L-7212CCBC", "All P Spot Instance Requests", true},
	{"L-E3A00192", "All X Spot Instance Requests", true},
	{"L-85EED4F7", "All DL Spot Instance Requests", true},
	{"L-6B0D517C", "All Trn Spot Instance Requests", true},
}

// groups maps a family group to its on-demand and spot quota codes ("" where
// the group has no spot instances).
var groups = map[string][2]string{
	"standard": {"L-1216C47A", "L-34B43A08"},
	"f":        {"L-74FC7D96", "L-88CF9481"},
	"g":        {"L-DB2E81BA", "L-3819A6DF"},
	"inf":      {"L-1945791B", "L-B5D1601B"},
	"p":        {"L-417A185B", "L-7212CCBC"},
	"x":        {"L-7295265B", "L-E3A00192"},
	"u":        {"L-43DA4232", ""},
	"dl":       {"L-6E869C2A", "L-85EED4F7"},
	"trn":      {"L-2C3B7624", "L-6B0D517C"},
	"hpc":      {"L-F7808C92", ""},
}

// Family is the family of an instance type: the letters before its
// generation digit ("m" for m5.large, "inf" for inf1.xlarge, "u" for
// u-6tb1.metal).
func Family(instanceType string) string {
	name, _, _ := strings.Cut(instanceType, ".")
	name = strings.TrimSuffix(strings.SplitN(name, "-", 2)[0], "-")
	i := strings.IndexFunc(name, func(r rune) bool { return r >= '0' && r <= '9' })
	if i < 0 {
		return name
	}
	return name[:i]
}

// group is the quota group of a family.
func group(family string) string {
	switch family {
	case "inf", "dl", "trn", "hpc", "u":
		return family
	case "vt":
		return "g"
	case "":
		return ""
	}
	switch family[0] {
	case 'f', 'g', 'p', 'x':
		return family[:1]
	}
	return "standard"
}

// Code is the quota code an instance of the type counts against (its
// vCPUs), on demand or spot; "" if EC2 has no vCPU quota for it (mac
// instances on dedicated hosts, for one).
func Code(instanceType string, spot bool) string {
	f := Family(instanceType)
	if f == "mac" {
		return ""
	}
	codes, ok := groups[group(f)]
	if !ok {
		return ""
	}
	if spot {
		return codes[1]
	}
	return codes[0]
}

// EBSServiceCode is the Service Quotas service code of EBS.
const EBSServiceCode = "ebs"

// VolumeQuota names the EBS quotas the volumes of one type count against,
// all volumes of the type in the region together: their size, in TiB, and
// (for provisioned IOPS types) their IOPS. Nodepool's aws driver reads
// them for labels with a volume-type.
type VolumeQuota struct {
	Storage, StorageName string
	IOPS, IOPSName       string // "" for types without provisioned IOPS
}

// VolumeQuotas are EBS's quotas by volume type.
var VolumeQuotas = map[string]VolumeQuota{
	"gp2":      {"L-D18FCD1D", "Storage for General Purpose SSD (gp2) volumes, in TiB", "", ""},
	"gp3":      {"L-7A658B76", "Storage for General Purpose SSD (gp3) volumes, in TiB", "", ""},
	"io1":      {"L-FD252861", "Storage for Provisioned IOPS SSD (io1) volumes, in TiB", "L-B3A130E6", "IOPS for Provisioned IOPS SSD (io1) volumes"},
	"io2":      {"L-09BD8365", "Storage for Provisioned IOPS SSD (io2) volumes, in TiB", "L-8D977E7E", "IOPS for Provisioned IOPS SSD (io2) volumes"},
	"st1":      {"L-82ACEF56", "Storage for Throughput Optimized HDD (st1) volumes, in TiB", "", ""},
	"sc1":      {"L-17AF77E8", "Storage for Cold HDD (sc1) volumes, in TiB", "", ""},
	"standard": {"L-9CF3C2EB", "Storage for Magnetic (standard) volumes, in TiB", "", ""},
}

// Lookup returns the quota of a code.
func Lookup(code string) (Quota, bool) {
	for _, q := range Quotas {
		if q.Code == code {
			return q, true
		}
	}
	return Quota{}, false
}
