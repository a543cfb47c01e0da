package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	ebstypes "github.com/aws/aws-sdk-go-v2/service/ebs/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
	"github.com/aws/smithy-go"

	"github.com/nodepool-nats/nodepool/internal/awsbody"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

type clients struct {
	ec2 *ec2.Client
	sq  *servicequotas.Client
	s3  *s3.Client
	ebs *ebs.Client
}

func start(t *testing.T, k Knobs) (*Cloud, clients) {
	t.Helper()
	c := New(Options{Knobs: k})
	srv, err := Listen("127.0.0.1:0", c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := sdkaws.Config{
		Region:           "us-east-1",
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		BaseEndpoint:     sdkaws.String(srv.URL()),
		RetryMaxAttempts: 1,
		HTTPClient:       awsbody.Client(nil),
	}
	return c, clients{
		ec2: ec2.NewFromConfig(cfg),
		sq:  servicequotas.NewFromConfig(cfg),
		s3:  s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true }),
		ebs: ebs.NewFromConfig(cfg),
	}
}

func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func fast() Knobs {
	return Knobs{BootTime: Duration(50 * time.Millisecond), TerminateTime: Duration(20 * time.Millisecond), ImportTime: Duration(100 * time.Millisecond)}
}

func waitFor(t *testing.T, what string, fn func() bool) {
	t.Helper()
	waitfor.Until(t, 10*time.Second, what, fn, waitfor.Every(20*time.Millisecond))
}

func TestInstancesLifecycle(t *testing.T) {
	t.Parallel()
	k := fast()
	k.PageSize = 2
	_, cl := start(t, k)
	ctx := t.Context()
	imgs, err := cl.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{Filters: []types.Filter{{Name: sdkaws.String("name"), Values: []string{"debian-12-amd64-*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs.Images) != 1 {
		t.Fatalf("images: %+v", imgs.Images)
	}
	out, err := cl.ec2.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: imgs.Images[0].ImageId, InstanceType: types.InstanceTypeT3Medium, MinCount: sdkaws.Int32(3), MaxCount: sdkaws.Int32(3),
		ClientToken:       sdkaws.String("tok-1"),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: []types.Tag{{Key: sdkaws.String("nodepool_node_id"), Value: sdkaws.String("0000001")}}}},
		MetadataOptions:   &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired},
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{{DeviceIndex: sdkaws.Int32(0), AssociatePublicIpAddress: sdkaws.Bool(false), SubnetId: sdkaws.String("subnet-0123456789abcdef0")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Instances) != 3 || out.Instances[0].State.Name != types.InstanceStateNamePending {
		t.Fatalf("run: %+v", out.Instances)
	}
	again, err := cl.ec2.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: imgs.Images[0].ImageId, InstanceType: types.InstanceTypeT3Medium, MinCount: sdkaws.Int32(3), MaxCount: sdkaws.Int32(3), ClientToken: sdkaws.String("tok-1")})
	if err != nil || *again.ReservationId != *out.ReservationId {
		t.Fatalf("a repeated client token made a new reservation: %v", err)
	}
	// Paginated listing (page size 2), by tag.
	var ids []string
	p := ec2.NewDescribeInstancesPaginator(cl.ec2, &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: sdkaws.String("tag:nodepool_node_id"), Values: []string{"0000001"}}}})
	pages := 0
	for p.HasMorePages() {
		pg, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range pg.Reservations {
			for _, in := range r.Instances {
				ids = append(ids, *in.InstanceId)
				if in.PublicIpAddress != nil {
					t.Errorf("public address despite AssociatePublicIpAddress=false")
				}
				if in.MetadataOptions.HttpTokens != types.HttpTokensStateRequired || *in.SubnetId != "subnet-0123456789abcdef0" {
					t.Errorf("instance: %+v", in)
				}
			}
		}
	}
	if len(ids) != 3 || pages != 2 {
		t.Fatalf("listed %v in %d pages", ids, pages)
	}
	waitFor(t, "running", func() bool {
		d, err := cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: ids[:1]})
		return err == nil && d.Reservations[0].Instances[0].State.Name == types.InstanceStateNameRunning
	})
	term, err := cl.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids})
	if err != nil || len(term.TerminatingInstances) != 3 {
		t.Fatal(err)
	}
	waitFor(t, "terminated", func() bool {
		d, err := cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: ids[:1]})
		return err == nil && d.Reservations[0].Instances[0].State.Name == types.InstanceStateNameTerminated &&
			*d.Reservations[0].Instances[0].StateReason.Code == "Client.UserInitiatedShutdown"
	})
	vols, err := cl.ec2.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: []types.Filter{{Name: sdkaws.String("attachment.instance-id"), Values: ids}}})
	if err != nil || len(vols.Volumes) != 0 {
		t.Fatalf("volumes left attached: %v %v", vols, err)
	}
	_, err = cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{"i-0123456789abcdef0"}})
	if code(err) != "InvalidInstanceID.NotFound" {
		t.Fatalf("unknown instance: %v", err)
	}
	_, err = cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: sdkaws.String("bogus"), Values: []string{"x"}}}})
	if code(err) != "InvalidParameterValue" {
		t.Fatalf("bad filter: %v", err)
	}
}

func TestCapacityQuotaThrottle(t *testing.T) {
	t.Parallel()
	k := fast()
	k.NoCapacity = map[string]int{"t3.large": 1, "spot/m5.large": -1}
	k.Quotas = map[string]float64{"L-1216C47A": 4}
	c, cl := start(t, k)
	ctx := t.Context()
	ami := sdkaws.String(DefaultImages[0].ID)
	run := func(typ types.InstanceType, n int32, spot bool) error {
		in := &ec2.RunInstancesInput{ImageId: ami, InstanceType: typ, MinCount: sdkaws.Int32(n), MaxCount: sdkaws.Int32(n)}
		if spot {
			in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot}
		}
		_, err := cl.ec2.RunInstances(ctx, in)
		return err
	}
	if err := run("t3.large", 1, false); code(err) != "InsufficientInstanceCapacity" {
		t.Fatalf("capacity: %v", err)
	}
	if err := run("t3.large", 1, false); err != nil {
		t.Fatalf("second try: %v", err)
	}
	if err := run("m5.large", 1, true); code(err) != "InsufficientInstanceCapacity" {
		t.Fatalf("spot capacity: %v", err)
	}
	if err := run("t3.large", 1, false); err != nil {
		t.Fatal(err)
	}
	if err := run("t3.large", 1, false); code(err) != "VcpuLimitExceeded" {
		t.Fatalf("quota: %v", err)
	}
	q, err := cl.sq.GetServiceQuota(ctx, &servicequotas.GetServiceQuotaInput{ServiceCode: sdkaws.String("ec2"), QuotaCode: sdkaws.String("L-1216C47A")})
	if err != nil || *q.Quota.Value != 4 {
		t.Fatalf("quota: %v %v", q, err)
	}
	_, err = cl.sq.GetServiceQuota(ctx, &servicequotas.GetServiceQuotaInput{ServiceCode: sdkaws.String("ec2"), QuotaCode: sdkaws.String("L-00000000")})
	if code(err) != "NoSuchResourceException" {
		t.Fatalf("unknown quota: %v", err)
	}
	lp := servicequotas.NewListServiceQuotasPaginator(cl.sq, &servicequotas.ListServiceQuotasInput{ServiceCode: sdkaws.String("ec2"), MaxResults: sdkaws.Int32(5)})
	n := 0
	for lp.HasMorePages() {
		pg, err := lp.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n += len(pg.Quotas)
	}
	if n < 10 {
		t.Fatalf("listed %d quotas", n)
	}
	c.SetKnobs(func(k *Knobs) { k.RateLimit = 1 })
	throttled := false
	for range 5 {
		if _, err := cl.ec2.DescribeRegions(ctx, &ec2.DescribeRegionsInput{}); code(err) == "RequestLimitExceeded" {
			throttled = true
		}
	}
	if !throttled {
		t.Fatal("no RequestLimitExceeded beyond the rate limit")
	}
}

func TestSpotInterruptionAndFleet(t *testing.T) {
	t.Parallel()
	k := fast()
	k.SpotNotice = Duration(100 * time.Millisecond)
	k.NoCapacity = map[string]int{"spot/t3.medium": -1}
	c, cl := start(t, k)
	ctx := t.Context()
	lt, err := cl.ec2.CreateLaunchTemplate(ctx, &ec2.CreateLaunchTemplateInput{LaunchTemplateName: sdkaws.String("nodepool-test"),
		LaunchTemplateData: &types.RequestLaunchTemplateData{ImageId: sdkaws.String(DefaultImages[0].ID), KeyName: sdkaws.String("zuul")}})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := cl.ec2.CreateFleet(ctx, &ec2.CreateFleetInput{
		Type: types.FleetTypeInstant,
		LaunchTemplateConfigs: []types.FleetLaunchTemplateConfigRequest{{
			LaunchTemplateSpecification: &types.FleetLaunchTemplateSpecificationRequest{LaunchTemplateId: lt.LaunchTemplate.LaunchTemplateId, Version: sdkaws.String("$Latest")},
			Overrides:                   []types.FleetLaunchTemplateOverridesRequest{{InstanceType: types.InstanceTypeT3Medium}, {InstanceType: types.InstanceTypeT3Large}},
		}},
		SpotOptions:                 &types.SpotOptionsRequest{AllocationStrategy: types.SpotAllocationStrategyPriceCapacityOptimized},
		TargetCapacitySpecification: &types.TargetCapacitySpecificationRequest{TotalTargetCapacity: sdkaws.Int32(1), DefaultTargetCapacityType: types.DefaultTargetCapacityTypeSpot},
		TagSpecifications:           []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: []types.Tag{{Key: sdkaws.String("k"), Value: sdkaws.String("v")}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fl.Errors) != 1 || *fl.Errors[0].ErrorCode != "InsufficientInstanceCapacity" || len(fl.Instances) != 1 || fl.Instances[0].InstanceType != types.InstanceTypeT3Large {
		t.Fatalf("fleet: errors %+v instances %+v", fl.Errors, fl.Instances)
	}
	id := fl.Instances[0].InstanceIds[0]
	if err := c.Interrupt(id, InterruptNotice); err != nil {
		t.Fatal(err)
	}
	sr, err := cl.ec2.DescribeSpotInstanceRequests(ctx, &ec2.DescribeSpotInstanceRequestsInput{Filters: []types.Filter{{Name: sdkaws.String("instance-id"), Values: []string{id}}}})
	if err != nil || len(sr.SpotInstanceRequests) != 1 || *sr.SpotInstanceRequests[0].Status.Code != "marked-for-termination" {
		t.Fatalf("spot request: %+v %v", sr, err)
	}
	waitFor(t, "the interruption", func() bool {
		d, err := cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		if err != nil {
			return false
		}
		in := d.Reservations[0].Instances[0]
		return in.StateReason != nil && *in.StateReason.Code == "Server.SpotInstanceTermination" && in.InstanceLifecycle == types.InstanceLifecycleTypeSpot
	})
}

func TestImports(t *testing.T) {
	t.Parallel()
	_, cl := start(t, fast())
	ctx := t.Context()
	if _, err := cl.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: sdkaws.String("images")}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{1}, 3<<20)
	if _, err := cl.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: sdkaws.String("images"), Key: sdkaws.String("disk.raw"), Body: bytes.NewReader(data)}); err != nil {
		t.Fatal(err)
	}
	imp, err := cl.ec2.ImportSnapshot(ctx, &ec2.ImportSnapshotInput{DiskContainer: &types.SnapshotDiskContainer{Format: sdkaws.String("raw"),
		UserBucket: &types.UserBucket{S3Bucket: sdkaws.String("images"), S3Key: sdkaws.String("disk.raw")}}})
	if err != nil {
		t.Fatal(err)
	}
	var snap string
	waitFor(t, "the snapshot import", func() bool {
		d, err := cl.ec2.DescribeImportSnapshotTasks(ctx, &ec2.DescribeImportSnapshotTasksInput{ImportTaskIds: []string{*imp.ImportTaskId}})
		if err != nil || len(d.ImportSnapshotTasks) != 1 {
			return false
		}
		det := d.ImportSnapshotTasks[0].SnapshotTaskDetail
		if *det.Status == "completed" {
			snap = *det.SnapshotId
			return true
		}
		return false
	})
	reg, err := cl.ec2.RegisterImage(ctx, &ec2.RegisterImageInput{Name: sdkaws.String("img-1"), Architecture: types.ArchitectureValuesX8664,
		RootDeviceName: sdkaws.String("/dev/sda1"), EnaSupport: sdkaws.Bool(true), ImdsSupport: types.ImdsSupportValuesV20,
		BlockDeviceMappings: []types.BlockDeviceMapping{{DeviceName: sdkaws.String("/dev/sda1"), Ebs: &types.EbsBlockDevice{SnapshotId: &snap, VolumeType: types.VolumeTypeGp3}}},
		TagSpecifications:   []types.TagSpecification{{ResourceType: types.ResourceTypeImage, Tags: []types.Tag{{Key: sdkaws.String("nodepool_provider_name"), Value: sdkaws.String("p")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ec2.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: &snap}); code(err) != "InvalidSnapshot.InUse" {
		t.Fatalf("deleting a snapshot in use: %v", err)
	}
	waitFor(t, "the image", func() bool {
		d, err := cl.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"self"}, Filters: []types.Filter{{Name: sdkaws.String("tag:nodepool_provider_name"), Values: []string{"p"}}}})
		return err == nil && len(d.Images) == 1 && d.Images[0].State == types.ImageStateAvailable && *d.Images[0].ImageId == *reg.ImageId
	})
	if _, err := cl.ec2.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: reg.ImageId}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ec2.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: &snap}); err != nil {
		t.Fatal(err)
	}
	// EBS direct.
	st, err := cl.ebs.StartSnapshot(ctx, &ebs.StartSnapshotInput{VolumeSize: sdkaws.Int64(1), Tags: []ebstypes.Tag{{Key: sdkaws.String("a"), Value: sdkaws.String("b")}}})
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{7}, ebsBlockSize)
	sum := sha256.Sum256(block)
	if _, err := cl.ebs.PutSnapshotBlock(ctx, &ebs.PutSnapshotBlockInput{SnapshotId: st.SnapshotId, BlockIndex: sdkaws.Int32(0), BlockData: bytes.NewReader(block),
		DataLength: sdkaws.Int32(ebsBlockSize), Checksum: sdkaws.String(base64.StdEncoding.EncodeToString(sum[:])), ChecksumAlgorithm: ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ebs.CompleteSnapshot(ctx, &ebs.CompleteSnapshotInput{SnapshotId: st.SnapshotId, ChangedBlocksCount: sdkaws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the EBS direct snapshot", func() bool {
		d, err := cl.ec2.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{*st.SnapshotId}})
		return err == nil && d.Snapshots[0].State == types.SnapshotStateCompleted
	})
	if _, err := cl.ec2.ImportSnapshot(ctx, &ec2.ImportSnapshotInput{DiskContainer: &types.SnapshotDiskContainer{Format: sdkaws.String("raw"),
		UserBucket: &types.UserBucket{S3Bucket: sdkaws.String("images"), S3Key: sdkaws.String("missing")}}}); !strings.Contains(code(err), "InvalidParameter") {
		t.Fatalf("import of a missing object: %v", err)
	}
	_ = context.Background
}

// StopInstances and StartInstances move an instance as EC2 does (running,
// stopping, stopped, pending, running), with the state changes and the
// state reason EC2 gives, and refuse what EC2 refuses: an instance still
// pending, a spot instance of a one-time request, an unknown id, one that
// is terminated; a refused call changes nothing.
func TestStopAndStartInstances(t *testing.T) {
	t.Parallel()
	// Instances boot for an hour at first, so that one is surely pending
	// when the test stops it (a boot of 50 ms can be over before the
	// stop arrives on a busy machine); the others boot fast.
	slow := fast()
	slow.BootTime = Duration(time.Hour)
	c, cl := start(t, slow)
	ctx := t.Context()
	run := func(spot bool) string {
		t.Helper()
		in := &ec2.RunInstancesInput{ImageId: sdkaws.String("ami-0a1b2c3d4e5f60001"), InstanceType: types.InstanceTypeT3Micro, MinCount: sdkaws.Int32(1), MaxCount: sdkaws.Int32(1)}
		if spot {
			in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot}
		}
		out, err := cl.ec2.RunInstances(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return *out.Instances[0].InstanceId
	}
	state := func(id string) types.Instance {
		t.Helper()
		d, err := cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		if err != nil {
			t.Fatal(err)
		}
		return d.Reservations[0].Instances[0]
	}
	pending := run(false)
	if _, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{pending}}); code(err) != "IncorrectInstanceState" {
		t.Errorf("stopping a pending instance: %v", err)
	}
	if st := state(pending).State.Name; st != types.InstanceStateNamePending {
		t.Errorf("a refused stop changed a pending instance: %s", st)
	}
	c.SetKnobs(func(k *Knobs) { k.BootTime = fast().BootTime })
	id, spot := run(false), run(true)
	waitFor(t, "running", func() bool {
		return state(id).State.Name == types.InstanceStateNameRunning && state(spot).State.Name == types.InstanceStateNameRunning
	})
	for _, ids := range [][]string{{id, spot}, {id, "i-0123456789abcdef0"}} {
		if _, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: ids}); err == nil {
			t.Errorf("stopping %v: no error", ids)
		}
	}
	if st := state(id).State.Name; st != types.InstanceStateNameRunning {
		t.Fatalf("a refused stop changed the instance: %s", st)
	}
	if _, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{spot}}); code(err) != "UnsupportedOperation" {
		t.Errorf("stopping a one-time spot instance: %v", err)
	}
	out, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if ch := out.StoppingInstances[0]; ch.PreviousState.Name != types.InstanceStateNameRunning || ch.CurrentState.Name != types.InstanceStateNameStopping {
		t.Errorf("stop: %s -> %s", ch.PreviousState.Name, ch.CurrentState.Name)
	}
	waitFor(t, "stopped", func() bool { return state(id).State.Name == types.InstanceStateNameStopped })
	if in := state(id); in.StateReason == nil || *in.StateReason.Code != "Client.UserInitiatedShutdown" || in.PublicIpAddress != nil {
		t.Errorf("stopped instance: reason %+v, public address %v", in.StateReason, in.PublicIpAddress)
	}
	// Stopped, it is not live for a listing filtered on running.
	live, err := cl.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: sdkaws.String("instance-state-name"), Values: []string{"running"}}}})
	if err != nil || len(live.Reservations) != 1 {
		t.Errorf("running instances: %+v, %v", live.Reservations, err)
	}
	again, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}})
	if err != nil || again.StoppingInstances[0].CurrentState.Name != types.InstanceStateNameStopped {
		t.Errorf("stopping a stopped instance again: %+v, %v", again, err)
	}
	started, err := cl.ec2.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if ch := started.StartingInstances[0]; ch.PreviousState.Name != types.InstanceStateNameStopped || ch.CurrentState.Name != types.InstanceStateNamePending {
		t.Errorf("start: %s -> %s", ch.PreviousState.Name, ch.CurrentState.Name)
	}
	waitFor(t, "running again", func() bool { return state(id).State.Name == types.InstanceStateNameRunning })
	if _, err := cl.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "terminated", func() bool { return state(id).State.Name == types.InstanceStateNameTerminated })
	if _, err := cl.ec2.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{id}}); code(err) != "IncorrectInstanceState" {
		t.Errorf("starting a terminated instance: %v", err)
	}
	if _, err := cl.ec2.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}}); code(err) != "IncorrectInstanceState" {
		t.Errorf("stopping a terminated instance: %v", err)
	}
}
