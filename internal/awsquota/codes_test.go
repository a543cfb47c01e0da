package awsquota

import "testing"

func TestCode(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		spot bool
		want string
	}{
		{"t3.medium", false, "L-1216C47A"},
		{"m5.large", true, "L-34B43A08"},
		{"im4gn.large", false, "L-1216C47A"},
		{"c7gn.xlarge", false, "L-1216C47A"},
		{"g4dn.xlarge", false, "L-DB2E81BA"},
		{"vt1.3xlarge", true, "L-3819A6DF"},
		{"inf1.xlarge", false, "L-1945791B"},
		{"p3.2xlarge", true, "L-7212CCBC"},
		{"x1e.xlarge", false, "L-7295265B"},
		{"u-6tb1.metal", false, "L-43DA4232"},
		{"u-6tb1.metal", true, ""},
		{"dl1.24xlarge", false, "L-6E869C2A"},
		{"trn1.2xlarge", true, "L-6B0D517C"},
		{"hpc6a.48xlarge", false, "L-F7808C92"},
		{"f1.2xlarge", false, "L-74FC7D96"},
		{"mac1.metal", false, ""},
		{"", false, ""},
	} {
		if got := Code(tc.typ, tc.spot); got != tc.want {
			t.Errorf("Code(%q, %v) = %q, want %q", tc.typ, tc.spot, got, tc.want)
		}
	}
	for _, q := range Quotas {
		if _, ok := Lookup(q.Code); !ok {
			t.Errorf("Lookup(%s) failed", q.Code)
		}
	}
}

// Every volume type EBS has is in the table, each quota code once.
func TestVolumeQuotas(t *testing.T) {
	seen := map[string]string{}
	for _, typ := range []string{"gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"} {
		q, ok := VolumeQuotas[typ]
		if !ok || q.Storage == "" || q.StorageName == "" {
			t.Errorf("%s: %+v", typ, q)
			continue
		}
		if (q.IOPS != "") != (typ == "io1" || typ == "io2") || (q.IOPS == "") != (q.IOPSName == "") {
			t.Errorf("%s: IOPS quota %q %q", typ, q.IOPS, q.IOPSName)
		}
		for _, c := range []string{q.Storage, q.IOPS} {
			if c == "" {
				continue
			}
			if other, dup := seen[c]; dup {
				t.Errorf("%s is the code of %s and %s", c, other, typ)
			}
			if _, ec2 := Lookup(c); ec2 {
				t.Errorf("%s is an EC2 code too", c)
			}
			seen[c] = typ
		}
	}
	if len(VolumeQuotas) != 7 {
		t.Errorf("%d volume types", len(VolumeQuotas))
	}
}
