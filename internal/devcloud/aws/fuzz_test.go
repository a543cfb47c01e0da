package aws

import (
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Any Query request, however malformed, gets an answer in EC2's terms:
// a response or an error envelope, never a panic.
func FuzzEC2Request(f *testing.F) {
	for _, s := range []string{
		"Action=DescribeInstances&Version=2016-11-15",
		"Action=RunInstances&ImageId=ami-0a1b2c3d4e5f60001&MinCount=1&MaxCount=1&InstanceType=t3.micro",
		"Action=RunInstances&ImageId=ami-x&MinCount=a&MaxCount=1",
		"Action=DescribeInstances&Filter.1.Name=tag:x&Filter.1.Value.1=*&MaxResults=5&NextToken=tok-%ff",
		"Action=CreateFleet&Type=instant&TargetCapacitySpecification.TotalTargetCapacity=1&TargetCapacitySpecification.DefaultTargetCapacityType=spot&LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateName=x",
		"Action=CreateTags&ResourceId.1=i-0&Tag.1.Key=aws:x",
		"Action=ImportSnapshot&DiskContainer.Format=RAW&DiskContainer.UserBucket.S3Bucket=b&DiskContainer.UserBucket.S3Key=k",
		"Action=RegisterImage&Name=abc&RootDeviceName=/dev/sda1&BlockDeviceMapping.1.DeviceName=/dev/sda1&BlockDeviceMapping.1.Ebs.VolumeSize=-1",
		"Action=Nope", "%%%", "",
	} {
		f.Add(s)
	}
	c := New(Options{})
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKID/20250101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0")
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		if rec.Code == 0 {
			t.Fatal("no status")
		}
		var v struct{ XMLName xml.Name }
		if err := xml.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("response is not XML: %v\n%s", err, rec.Body.String())
		}
	})
}
