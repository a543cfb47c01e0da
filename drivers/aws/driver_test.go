package aws

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/nodepool-nats/nodepool/drivers"
	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
	"github.com/nodepool-nats/nodepool/internal/sshtest"
)

// conf is a configuration with an aws provider "ec2"; port is the SSH
// port of its cloud image (an sshtest server's), 0 for no host-key
// checking.
func conf(port int, extra string) string {
	check := "false"
	if port > 0 {
		check = "true"
	}
	return fmt.Sprintf(`
labels:
  - name: small
  - name: spot
  - name: fleet
  - name: spot-fleet
  - name: host
  - name: built
diskimages:
  - name: built
    elements: [debian-minimal]
providers:
  - name: ec2
    driver: aws
    region-name: us-east-1
    rate: 1000
    object-storage: {bucket-name: images}
    cloud-images:
      - name: debian
        image-id: %s
        username: admin
        connection-port: %d
      - name: ubuntu
        image-filters:
          - name: name
            values: ["ubuntu-noble-24.04-amd64-*"]
    diskimages:
      - name: built
        tags: {team: ci}
%s
    pools:
      - name: main
        host-key-checking: %s
        availability-zone: us-east-1a
        labels:
          - name: small
            cloud-image: debian
            instance-type: t3.medium
            key-name: zuul
            tags: {team: ci}
            dynamic-tags: {req: "for {request.id} of {request.requestor}"}
            volume-type: gp3
            volume-size: 20
            imdsv2: required
            iam-instance-profile: {name: builder}
            userdata: "#cloud-config"
          - name: spot
            cloud-image: ubuntu
            instance-type: t3.large
            key-name: zuul
            use-spot: true
            on-demand-fallback: 2
          - name: fleet
            cloud-image: debian
            key-name: zuul
            fleet:
              instance-types: [t3.medium, t3.large]
              allocation-strategy: prioritized
          - name: spot-fleet
            cloud-image: debian
            key-name: zuul
            use-spot: true
            fleet:
              instance-types: [t3.medium, m5.large]
              allocation-strategy: price-capacity-optimized
          - name: host
            cloud-image: debian
            instance-type: m5.large
            key-name: zuul
            dedicated-host: true
          - name: built
            diskimage: built
            instance-type: t3.micro
            key-name: zuul
`, devaws.DefaultImages[0].ID, max(port, 22), extra, check)
}

func TestLaunchScanAndDelete(t *testing.T) {
	t.Parallel()
	ssh := sshtest.Start(t)
	cloud, url := startCloud(t, fastKnobs())
	p := newProvider(t, url, conf(ssh.Port, ""))
	req := request("node1", "main", "small", 1)
	req.Request = &drivers.RequestInfo{ID: "req-1", Requestor: "zuul"}
	sm, err := p.Create(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	inst := mustAdvance(t, sm)
	if inst.ExternalID == "" || inst.InterfaceIP != "127.0.0.1" || inst.Username != "admin" || inst.AZ != "us-east-1a" {
		t.Fatalf("instance: %+v", inst)
	}
	if !slices.Equal(inst.HostKeys, ssh.HostKeys()) {
		t.Fatalf("host keys %v, want %v", inst.HostKeys, ssh.HostKeys())
	}
	if inst.Resources.Cores != 2 || inst.Resources.RAM != 4096 || inst.Resources.Other["L-1216C47A"] != 2 {
		t.Fatalf("resources: %+v", inst.Resources)
	}
	d := describe(t, p, inst.ExternalID)
	tags := tagMap(d.Tags)
	if tags[drivers.TagNode] != "node1" || tags["team"] != "ci" || tags["req"] != "for req-1 of zuul" || tags["Name"] != "npnode1" {
		t.Fatalf("tags: %v", tags)
	}
	if d.MetadataOptions.HttpTokens != ec2types.HttpTokensStateRequired || d.IamInstanceProfile == nil || !strings.HasSuffix(*d.IamInstanceProfile.Arn, "/builder") {
		t.Fatalf("instance settings: %+v", d)
	}
	vols, err := p.ec2.DescribeVolumes(t.Context(), &ec2.DescribeVolumesInput{VolumeIds: []string{*d.BlockDeviceMappings[0].Ebs.VolumeId}})
	if err != nil || *vols.Volumes[0].Size != 20 || vols.Volumes[0].VolumeType != ec2types.VolumeTypeGp3 || tagMap(vols.Volumes[0].Tags)[drivers.TagNode] != "node1" {
		t.Fatalf("root volume: %+v %v", vols, err)
	}
	all, err := p.ListInstances(t.Context())
	if err != nil || len(all) != 1 || all[0].NodeID() != "node1" {
		t.Fatalf("list: %+v %v", all, err)
	}
	del, err := p.Delete(inst.ExternalID, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustAdvance(t, del)
	if all, _ := p.ListInstances(t.Context()); len(all) != 0 {
		t.Fatalf("after delete: %+v", all)
	}
	// Deleting what is gone is done at once.
	del, _ = p.Delete(inst.ExternalID, nil)
	mustAdvance(t, del)
	if cloud.Calls()["RunInstances"] != 1 {
		t.Fatalf("calls: %v", cloud.Calls())
	}
}

func describe(t *testing.T, p *Provider, id string) ec2types.Instance {
	t.Helper()
	out, err := p.ec2.DescribeInstances(t.Context(), &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Reservations[0].Instances[0]
}

// A machine stopped after its launch resumes in another process from its
// driver_data, and a launch call repeated with the attempt's client token
// makes no second instance.
func TestResumeAndIdempotency(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.BootTime = devaws.Duration(300 * time.Millisecond)
	cloud, url := startCloud(t, k)
	p1 := newProvider(t, url, conf(0, ""))
	sm, _ := p1.Create(request("node2", "main", "small", 1), nil)
	for sm.ExternalID() == "" {
		if _, err := sm.Advance(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	state := sm.State()
	var st createState
	if err := json.Unmarshal(state, &st); err != nil || st.Step != stepWait || st.InstanceID == "" {
		t.Fatalf("state: %s", state)
	}
	p2 := newProvider(t, url, conf(0, ""))
	resumed, err := p2.Create(request("node2", "main", "small", 1), state)
	if err != nil {
		t.Fatal(err)
	}
	if inst := mustAdvance(t, resumed); inst.ExternalID != st.InstanceID {
		t.Fatalf("resumed to %s, want %s", inst.ExternalID, st.InstanceID)
	}
	// A process that died before it recorded the launch starts afresh:
	// the client token finds the instance.
	again, _ := p2.Create(request("node2", "main", "small", 1), nil)
	if inst := mustAdvance(t, again); inst.ExternalID != st.InstanceID {
		t.Fatalf("a repeated launch made %s, want %s", inst.ExternalID, st.InstanceID)
	}
	if n := cloud.Calls()["RunInstances"]; n != 2 {
		t.Fatalf("RunInstances calls: %d", n)
	}
	if all, _ := p2.ListInstances(t.Context()); len(all) != 1 {
		t.Fatalf("instances: %d", len(all))
	}
	// A next attempt makes a new instance.
	next, _ := p2.Create(request("node2", "main", "small", 2), nil)
	if inst := mustAdvance(t, next); inst.ExternalID == st.InstanceID {
		t.Fatal("attempt 2 took attempt 1's instance")
	}
	for _, bad := range []string{`{"step":"fly"}`, `{"step":"wait","instance_id":"vol-1"}`, `[1]`} {
		if _, err := p2.Create(request("node2", "main", "small", 1), json.RawMessage(bad)); err == nil {
			t.Errorf("driver_data %s taken", bad)
		}
	}
}

// Spot capacity errors are waits; after on-demand-fallback of them the
// node is launched on demand. A cloud image given by filters boots the
// newest matching AMI.
func TestSpotFallback(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.NoCapacity = map[string]int{"spot/t3.large": -1}
	_, url := startCloud(t, k)
	p := newProvider(t, url, conf(0, ""))
	sm, _ := p.Create(request("node3", "main", "spot", 1), nil)
	for i := range 2 {
		_, err := advance(t.Context(), sm)
		if !isKind(err, drivers.ErrCapacity) {
			t.Fatalf("try %d: %v", i, err)
		}
	}
	inst := mustAdvance(t, sm)
	d := describe(t, p, inst.ExternalID)
	if d.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot || *d.ImageId != devaws.DefaultImages[3].ID {
		t.Fatalf("instance: lifecycle %q image %s", d.InstanceLifecycle, *d.ImageId)
	}
	if inst.Resources.Other["L-1216C47A"] != 2 {
		t.Fatalf("an on-demand fallback counts as on-demand: %+v", inst.Resources)
	}
}

// A fleet takes the next instance type when one has no capacity; with no
// capacity at all, it waits.
func TestFleetCapacity(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.NoCapacity = map[string]int{"t3.medium": -1, "spot/t3.medium": -1, "spot/m5.large": 1}
	cloud, url := startCloud(t, k)
	p := newProvider(t, url, conf(0, ""))
	sm, _ := p.Create(request("node4", "main", "fleet", 1), nil)
	inst := mustAdvance(t, sm)
	if d := describe(t, p, inst.ExternalID); d.InstanceType != "t3.large" || tagMap(d.Tags)[drivers.TagNode] != "node4" {
		t.Fatalf("fleet instance: %s %v", d.InstanceType, tagMap(d.Tags))
	}
	spot, _ := p.Create(request("node5", "main", "spot-fleet", 1), nil)
	if _, err := advance(t.Context(), spot); !isKind(err, drivers.ErrCapacity) || !strings.Contains(err.Error(), "m5.large: InsufficientInstanceCapacity") {
		t.Fatalf("spot fleet without capacity: %v", err)
	}
	inst = mustAdvance(t, spot)
	if d := describe(t, p, inst.ExternalID); d.InstanceType != "m5.large" || d.InstanceLifecycle != ec2types.InstanceLifecycleTypeSpot {
		t.Fatalf("spot fleet instance: %s %s", d.InstanceType, d.InstanceLifecycle)
	}
	if n := cloud.Calls()["CreateLaunchTemplate"]; n != 1 { // both labels have the same template
		t.Fatalf("launch templates made: %d", n)
	}
}

func TestQuota(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.Quotas = map[string]float64{"L-1216C47A": 4, "L-34B43A08": 6}
	cloud, url := startCloud(t, k)
	p := newProvider(t, url, conf(0, ""))
	lim, err := p.QuotaLimits(t.Context())
	if err != nil || lim.Other["L-1216C47A"] != 4 || lim.Other["L-34B43A08"] != 6 || lim.Instances != drivers.Unlimited {
		t.Fatalf("limits: %+v %v", lim, err)
	}
	calls := cloud.Calls()["servicequotas.GetServiceQuota"]
	if _, err := p.QuotaLimits(t.Context()); err != nil || cloud.Calls()["servicequotas.GetServiceQuota"] != calls {
		t.Fatal("quotas are not kept between reads")
	}
	for label, want := range map[string]int{"small": 2, "fleet": 2} {
		r, err := p.QuotaForLabel("main", label)
		if err != nil || r.Other["L-1216C47A"] != want || r.Instances != 1 {
			t.Fatalf("%s: %+v %v", label, r, err)
		}
	}
	if r, _ := p.QuotaForLabel("main", "spot"); r.Other["L-34B43A08"] != 2 || r.RAM != 8192 {
		t.Fatalf("spot: %+v", r)
	}
	for i := range 2 {
		sm, _ := p.Create(request(fmt.Sprintf("q%d", i), "main", "small", 1), nil)
		mustAdvance(t, sm)
	}
	sm, _ := p.Create(request("q3", "main", "small", 1), nil)
	if _, err := advance(t.Context(), sm); !isKind(err, drivers.ErrQuotaExceeded) || !strings.Contains(err.Error(), "VcpuLimitExceeded") {
		t.Fatalf("over quota: %v", err)
	}
}

// Throttling is the launcher's to wait out: the SDK does not retry it.
// Every call waits for the provider's limiter.
func TestThrottleAndPacing(t *testing.T) {
	t.Parallel()
	cloud, url := startCloud(t, fastKnobs())
	p := newProvider(t, url, conf(0, ""))
	var waits atomic.Int64
	p.Pace(limiterFunc(func(ctx context.Context) error { waits.Add(1); return nil }))
	before := total(cloud.Calls())
	sm, _ := p.Create(request("node6", "main", "small", 1), nil)
	mustAdvance(t, sm)
	if _, err := p.ListInstances(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := waits.Load(), int64(total(cloud.Calls())-before); got != want {
		t.Fatalf("%d calls waited for the limiter, %d calls made", got, want)
	}
	cloud.SetKnobs(func(k *devaws.Knobs) { k.RateLimit = 0.001 })
	_, _ = p.ListInstances(t.Context()) // takes the one token
	n := cloud.Calls()["DescribeInstances"]
	_, err := p.ListInstances(t.Context())
	if !isKind(err, drivers.ErrRateLimited) {
		t.Fatalf("throttled: %v", err)
	}
	if cloud.Calls()["DescribeInstances"] != n+1 {
		t.Fatal("the SDK retried a throttled call")
	}
}

type limiterFunc func(context.Context) error

func (f limiterFunc) Wait(ctx context.Context) error { return f(ctx) }

func total(m map[string]int) int {
	n := 0
	for k, v := range m {
		if !strings.HasPrefix(k, "s3.") && !strings.HasPrefix(k, "ebs.") {
			n += v
		}
	}
	return n
}

func TestInterruptions(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.SpotNotice = devaws.Duration(time.Hour)
	cloud, url := startCloud(t, k)
	p := newProvider(t, url, conf(0, ""))
	var ids []string
	for i := range 3 {
		sm, _ := p.Create(request(fmt.Sprintf("s%d", i), "main", "spot", 1), nil)
		ids = append(ids, mustAdvance(t, sm).ExternalID)
	}
	if got, err := p.Interruptions(t.Context()); err != nil || len(got) != 0 {
		t.Fatalf("before: %+v %v", got, err)
	}
	for i, kind := range []string{devaws.InterruptNotice, devaws.InterruptNow, devaws.InterruptRebalance} {
		if err := cloud.Interrupt(ids[i], kind); err != nil {
			t.Fatal(err)
		}
	}
	got, err := p.Interruptions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"s0": "spot interruption notice: marked-for-termination", "s1": "spot instance interrupted by EC2", "s2": "spot rebalance recommendation"}
	if len(got) != 3 {
		t.Fatalf("interruptions: %+v", got)
	}
	for _, in := range got {
		if !strings.HasPrefix(in.Reason, want[in.NodeID]) {
			t.Errorf("%s: %q, want %q...", in.NodeID, in.Reason, want[in.NodeID])
		}
	}
}

func TestDedicatedHostAndSweep(t *testing.T) {
	t.Parallel()
	cloud, url := startCloud(t, fastKnobs())
	p := newProvider(t, url, conf(0, ""))
	sm, _ := p.Create(request("h1", "main", "host", 1), nil)
	inst := mustAdvance(t, sm)
	d := describe(t, p, inst.ExternalID)
	if d.Placement.HostId == nil || d.Placement.Tenancy != ec2types.TenancyHost {
		t.Fatalf("placement: %+v", d.Placement)
	}
	del, _ := p.Delete(inst.ExternalID, nil)
	mustAdvance(t, del)
	hosts, _ := p.ec2.DescribeHosts(t.Context(), &ec2.DescribeHostsInput{HostIds: []string{*d.Placement.HostId}})
	if hosts.Hosts[0].State != ec2types.AllocationStateReleased {
		t.Fatalf("host after delete: %s", hosts.Hosts[0].State)
	}
	// Leaks: a host whose node is gone, a detached volume, a snapshot
	// no image uses, a file in the bucket.
	ctx := t.Context()
	hs, err := p.ec2.AllocateHosts(ctx, &ec2.AllocateHostsInput{InstanceType: sdkaws.String("m5.large"), AvailabilityZone: sdkaws.String("us-east-1a"), Quantity: sdkaws.Int32(1),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeDedicatedHost, Tags: ec2Tags(map[string]string{drivers.TagProvider: "ec2", drivers.TagNode: "gone"})}}})
	if err != nil {
		t.Fatal(err)
	}
	run, err := p.ec2.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: sdkaws.String(devaws.DefaultImages[0].ID), InstanceType: "t3.micro", MinCount: sdkaws.Int32(1), MaxCount: sdkaws.Int32(1),
		BlockDeviceMappings: []ec2types.BlockDeviceMapping{{DeviceName: sdkaws.String("/dev/xvda"), Ebs: &ec2types.EbsBlockDevice{DeleteOnTermination: sdkaws.Bool(false)}}},
		TagSpecifications:   []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeVolume, Tags: ec2Tags(map[string]string{drivers.TagProvider: "ec2"})}}})
	if err != nil {
		t.Fatal(err)
	}
	del, _ = p.Delete(*run.Instances[0].InstanceId, nil)
	mustAdvance(t, del)
	if _, err := p.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: sdkaws.String("images")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: sdkaws.String("images"), Key: sdkaws.String(p.objectPrefix() + "x.raw"), Body: bytes.NewReader([]byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: sdkaws.String("images"), Key: sdkaws.String("not-ours.raw"), Body: bytes.NewReader([]byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if err := p.Sweep(ctx, func(id string) bool { return id != "gone" }); err != nil {
		t.Fatal(err)
	}
	hosts, _ = p.ec2.DescribeHosts(ctx, &ec2.DescribeHostsInput{HostIds: hs.HostIds})
	if hosts.Hosts[0].State != ec2types.AllocationStateReleased {
		t.Fatalf("leaked host: %s", hosts.Hosts[0].State)
	}
	vols, _ := p.ec2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: []ec2types.Filter{{Name: sdkaws.String("status"), Values: []string{"available"}}}})
	if len(vols.Volumes) != 0 {
		t.Fatalf("leaked volumes left: %d", len(vols.Volumes))
	}
	objs, _ := p.s3.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: sdkaws.String("images")})
	if len(objs.Contents) != 1 || *objs.Contents[0].Key != "not-ours.raw" {
		t.Fatalf("objects: %+v", objs.Contents)
	}
	_ = cloud
}

// Imports by every method: the AMI has the diskimage's settings and tags
// and is listed; deleting it deletes its snapshot; a post-upload-hook that
// fails deletes the image.
func TestUploadImages(t *testing.T) {
	t.Parallel()
	_, url := startCloud(t, fastKnobs())
	dir := t.TempDir()
	hook := filepath.Join(dir, "hook")
	seen := filepath.Join(dir, "seen")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho \"$1 $2 $(wc -c < $3)\" >> "+seen+"\n[ ! -e "+dir+"/refuse ]\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := append(bytes.Repeat([]byte{0}, 1<<20), bytes.Repeat([]byte{9}, 100_000)...) // a block of zeros, then data
	for _, method := range []string{"snapshot", "image", "ebs-direct"} {
		t.Run(method, func(t *testing.T) {
			p := newProvider(t, url, strings.Replace(conf(0, "        import-method: "+method+"\n        volume-size: 4\n        imds-support: v2.0\n"), "    rate: 1000\n", "    rate: 1000\n    post-upload-hook: "+hook+"\n", 1))
			ctx := t.Context()
			if _, err := p.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: sdkaws.String("images")}); err != nil && !strings.Contains(err.Error(), "BucketAlready") {
				t.Fatal(err)
			}
			key := "built.0000000001.ec2." + method
			img, err := p.UploadImage(ctx, drivers.ImageUpload{Name: "built-" + method, Format: "raw", Size: int64(len(data)), Data: bytes.NewReader(data),
				Tags: map[string]string{drivers.TagProvider: "ec2", drivers.TagImage: "built", drivers.TagBuild: "0000000001", drivers.TagUpload: key}})
			if err != nil {
				t.Fatal(err)
			}
			imgs, err := p.ListImages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(imgs, func(x drivers.Image) bool { return x.ExternalID == img.ExternalID })
			if i < 0 || imgs[i].Tags[drivers.TagUpload] != key || imgs[i].Tags["team"] != "ci" {
				t.Fatalf("listed: %+v", imgs)
			}
			out, err := p.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{img.ExternalID}})
			if err != nil {
				t.Fatal(err)
			}
			snap := *out.Images[0].BlockDeviceMappings[0].Ebs.SnapshotId
			if method != "image" && (out.Images[0].ImdsSupport != ec2types.ImdsSupportValuesV20 || *out.Images[0].BlockDeviceMappings[0].Ebs.VolumeSize != 4) {
				t.Fatalf("image settings: %+v", out.Images[0])
			}
			if hooked, _ := os.ReadFile(seen); !strings.Contains(string(hooked), "ec2 "+img.ExternalID+" "+fmt.Sprint(len(data))) {
				t.Fatalf("hook saw: %s", hooked)
			}
			// A node boots from it.
			req := request("b-"+method, "main", "built", 1)
			req.ImageID = img.ExternalID
			sm, _ := p.Create(req, nil)
			inst := mustAdvance(t, sm)
			if inst.ImageID != img.ExternalID {
				t.Fatalf("booted %s", inst.ImageID)
			}
			if err := p.DeleteImage(ctx, img.ExternalID); err != nil {
				t.Fatal(err)
			}
			if err := p.DeleteImage(ctx, img.ExternalID); err != nil {
				t.Fatalf("deleting a deleted image: %v", err)
			}
			if _, err := p.ec2.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snap}}); code(err) != "InvalidSnapshot.NotFound" {
				t.Fatalf("snapshot left: %v", err)
			}
		})
	}
	p := newProvider(t, url, strings.Replace(conf(0, ""), "    rate: 1000\n", "    rate: 1000\n    post-upload-hook: "+hook+"\n", 1))
	if err := os.WriteFile(filepath.Join(dir, "refuse"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := p.UploadImage(t.Context(), drivers.ImageUpload{Name: "refused", Format: "raw", Size: 10, Data: bytes.NewReader(make([]byte, 10)),
		Tags: map[string]string{drivers.TagProvider: "ec2", drivers.TagImage: "built", drivers.TagUpload: "refused"}})
	if err == nil || !strings.Contains(err.Error(), "post-upload-hook") {
		t.Fatalf("a refusing hook: %v", err)
	}
	imgs, _ := p.ListImages(t.Context())
	for _, im := range imgs {
		if im.Name == "refused" {
			t.Fatal("the image the hook refused is still there")
		}
	}
}

func TestErrorKinds(t *testing.T) {
	for code, want := range map[string]error{
		"RequestLimitExceeded": drivers.ErrRateLimited, "ThrottlingException": drivers.ErrRateLimited,
		"InsufficientInstanceCapacity": drivers.ErrCapacity, "InsufficientHostCapacity": drivers.ErrCapacity,
		"VcpuLimitExceeded": drivers.ErrQuotaExceeded, "InstanceLimitExceeded": drivers.ErrQuotaExceeded,
		"MaxSpotInstanceCountExceeded": drivers.ErrQuotaExceeded, "ResourceCountLimitExceeded": drivers.ErrQuotaExceeded,
		"InvalidInstanceID.NotFound": drivers.ErrNotFound, "InvalidParameterValue": nil,
	} {
		if got := kindOf(code); got != want {
			t.Errorf("%s: %v, want %v", code, got, want)
		}
	}
	var st createState
	_ = st
}

// Whatever a node's driver_data holds, Create and Delete answer with a
// machine or an error, never a panic.
func FuzzResume(f *testing.F) {
	for _, s := range []string{`{"step":"wait","instance_id":"i-0123456789abcdef0"}`, `{"step":"host","host_id":"h-1"}`, `{"step":"gone","host_id":"h"}`, `null`, `{}`, `"x"`, `{"step":1}`} {
		f.Add([]byte(s))
	}
	cfgText := conf(0, "")
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &Provider{cfg: mustConfig(t, cfgText), types: map[string]instanceType{}, amis: map[string]cachedAMI{}, templates: map[string]bool{}}
		if sm, err := p.Create(request("n", "main", "small", 1), data); err == nil && sm.State() == nil {
			t.Fatal("no state")
		}
		if _, err := p.Delete("i-0123456789abcdef0", data); err != nil {
			t.Fatal(err)
		}
	})
}

// Instances booting together are polled together: one DescribeInstances
// per poll (per 200 ids, EC2's filter limit), not one per instance.
func TestBootsPolledTogether(t *testing.T) {
	t.Parallel()
	k := fastKnobs()
	k.PageSize = 1000
	k.BootTime = devaws.Duration(300 * time.Millisecond)
	k.Quotas["L-1216C47A"] = 10000
	cloud, url := startCloud(t, k)
	p := newProvider(t, url, conf(0, ""))
	// together runs a machine per item at once and returns how many
	// DescribeInstances calls they made and how many polls their time
	// allows.
	together := func(items []string, machine func(string) (drivers.StateMachine, error)) (calls, polls int) {
		before, start := cloud.Calls()["DescribeInstances"], time.Now()
		errs := make(chan error, len(items))
		for _, it := range items {
			go func() {
				sm, err := machine(it)
				if err == nil {
					_, err = advance(t.Context(), sm)
				}
				errs <- err
			}()
		}
		for range items {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		return cloud.Calls()["DescribeInstances"] - before, int(time.Since(start)/pollInterval) + 2
	}
	var nodes []string
	for i := range 210 {
		nodes = append(nodes, fmt.Sprintf("w%04d", i))
	}
	calls, polls := together(nodes, func(node string) (drivers.StateMachine, error) {
		return p.Create(request(node, "main", "small", 1), nil)
	})
	if calls > 2*polls {
		t.Fatalf("%d DescribeInstances calls for %d instances booting together; at most %d (2 per poll) expected", calls, len(nodes), 2*polls)
	}
	// Deleting them polls together too.
	all, err := p.ListInstances(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range all {
		ids = append(ids, in.ExternalID)
	}
	calls, polls = together(ids, func(id string) (drivers.StateMachine, error) { return p.Delete(id, nil) })
	if calls > 2*polls {
		t.Fatalf("%d DescribeInstances calls for %d instances deleted together; at most %d expected", calls, len(ids), 2*polls)
	}
}

// dropAnswer is a proxy in front of the cloud that forwards a call and
// then closes the connection without its answer, once per action named
// (an action named n times loses its first n answers).
func dropAnswer(t *testing.T, cloudURL string, actions ...string) string {
	target, err := url.Parse(cloudURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	pending := map[string]int{}
	for _, a := range actions {
		pending[a]++
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		drop := ""
		for a, p := range pending {
			if p > 0 && drop == "" && strings.Contains(string(body), "Action="+a+"&") {
				drop = a
				pending[a]--
			}
		}
		mu.Unlock()
		if drop == "" {
			proxy.ServeHTTP(w, r)
			return
		}
		proxy.ServeHTTP(httptest.NewRecorder(), r) // the cloud does it
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // and the answer is lost
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A RunInstances whose answer is lost may have started the instance: the
// step is uncertain, and made again it finds that instance by its client
// token instead of starting a second one.
func TestLostAnswerIsUncertain(t *testing.T) {
	t.Parallel()
	cloud, cloudURL := startCloud(t, fastKnobs())
	opts := testOptions(dropAnswer(t, cloudURL, "RunInstances"))
	opts.RetryMaxAttempts = 1 // the driver sees the lost answer, not the SDK's retry
	p, err := New(t.Context(), mustConfig(t, conf(0, "")), opts)
	if err != nil {
		t.Fatal(err)
	}
	sm, _ := p.Create(request("node9", "main", "small", 1), nil)
	var lost error
	for lost == nil {
		step, err := sm.Advance(t.Context())
		if step.Done {
			t.Fatal("launched without losing an answer")
		}
		lost = err
	}
	if !errors.Is(lost, drivers.ErrUncertain) {
		t.Fatalf("a lost answer: %v; want drivers.ErrUncertain", lost)
	}
	if cloud.Calls()["RunInstances"] != 1 {
		t.Fatalf("RunInstances calls: %d", cloud.Calls()["RunInstances"])
	}
	inst := mustAdvance(t, sm)
	all, err := p.ListInstances(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].ExternalID != inst.ExternalID {
		t.Fatalf("instances after the step was made again: %v, launched %s", all, inst.ExternalID)
	}
	// An answer that came, even an error, is not uncertain.
	cloud.SetKnobs(func(k *devaws.Knobs) { k.RateLimit = 0.001 })
	_, _ = p.ListInstances(t.Context())
	again, _ := p.Create(request("node10", "main", "small", 1), nil)
	if _, err := advance(t.Context(), again); err == nil || errors.Is(err, drivers.ErrUncertain) {
		t.Fatalf("a throttled call: %v; want an error that is not uncertain", err)
	}
}

// A poll whose answer is lost is a read that says nothing about the
// instance: the machine polls again, up to maxLostPolls in a row, instead
// of failing its launch or delete.
func TestLostPollIsPolledAgain(t *testing.T) {
	t.Parallel()
	cloud, cloudURL := startCloud(t, fastKnobs())
	provider := func(url string) *Provider {
		opts := testOptions(url)
		opts.RetryMaxAttempts = 1 // the driver sees the lost answer, not the SDK's retry
		p, err := New(t.Context(), mustConfig(t, conf(0, "")), opts)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	polls := func(n int) []string { return slices.Repeat([]string{"DescribeInstances"}, n) }
	for _, c := range []struct {
		name string
		lost int
		fail bool
	}{
		{"one lost", 1, false},
		{"as many as may be lost", maxLostPolls, false},
		{"one more than may be lost", maxLostPolls + 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := provider(dropAnswer(t, cloudURL, polls(c.lost)...))
			before := cloud.Calls()["DescribeInstances"]
			sm, err := p.Create(request(fmt.Sprint("lost", c.lost), "main", "small", 1), nil)
			if err != nil {
				t.Fatal(err)
			}
			step, err := advance(t.Context(), sm)
			if calls := cloud.Calls()["DescribeInstances"] - before; calls < c.lost {
				t.Fatalf("%d DescribeInstances calls; at least the %d lost expected", calls, c.lost)
			}
			if c.fail {
				if err == nil || !unanswered(err) {
					t.Fatalf("a launch whose %d polls in a row were lost: %v; want the lost answer", c.lost, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("a launch whose %d polls in a row were lost: %v", c.lost, err)
			}
			d := provider(dropAnswer(t, cloudURL, polls(c.lost)...))
			dm, err := d.Delete(step.Instance.ExternalID, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := advance(t.Context(), dm); err != nil {
				t.Fatalf("a delete whose %d polls in a row were lost: %v", c.lost, err)
			}
		})
	}
}

// Owns tells the instance of a node from others by its tags.
func TestOwns(t *testing.T) {
	t.Parallel()
	_, url := startCloud(t, fastKnobs())
	p := newProvider(t, url, conf(0, ""))
	sm, _ := p.Create(request("node11", "main", "small", 1), nil)
	inst := mustAdvance(t, sm)
	for _, c := range []struct {
		id, node string
		owned    bool
		gone     bool
	}{
		{inst.ExternalID, "node11", true, false},
		{inst.ExternalID, "node12", false, false},
		{"i-0123456789abcdef0", "node11", false, true},
	} {
		owned, err := p.Owns(t.Context(), c.id, c.node)
		if owned != c.owned || errors.Is(err, drivers.ErrNotFound) != c.gone || (err != nil && !c.gone) {
			t.Errorf("Owns(%s, %s) = %v, %v; want %v (gone %v)", c.id, c.node, owned, err, c.owned, c.gone)
		}
	}
}
