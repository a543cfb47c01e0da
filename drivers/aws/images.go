package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	ebstypes "github.com/aws/aws-sdk-go-v2/service/ebs/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
)

// Sizes of the pieces an image travels in.
const (
	s3PartSize   = 32 << 20  // multipart upload parts
	ebsBlockSize = 512 << 10 // the EBS direct API's block
	gib          = 1 << 30
)

// objectPrefix is where a provider's image files wait in the bucket for
// their import.
func (p *Provider) objectPrefix() string { return "nodepool/" + p.cfg.Name + "/" }

// ImageFormat is the provider's image-format (raw by default).
func (p *Provider) ImageFormat() string { return p.cfg.DiskFormat }

func ec2Tags(m map[string]string) []ec2types.Tag {
	out := make([]ec2types.Tag, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, ec2types.Tag{Key: sdkaws.String(k), Value: sdkaws.String(m[k])})
	}
	return out
}

// UploadImage imports a build as an AMI, as its diskimages entry says:
// through S3 and ImportSnapshot (snapshot, the default) or ImportImage
// (image), or through the EBS direct API (ebs-direct); the AMI is
// registered with the entry's settings and tags and returned once it is
// available. With a post-upload-hook, the hook runs on it and a failure
// deletes it.
func (p *Provider) UploadImage(ctx context.Context, req drivers.ImageUpload) (drivers.Image, error) {
	pd, ok := p.cfg.Diskimage(req.Tags[drivers.TagImage])
	if !ok {
		return drivers.Image{}, fmt.Errorf("provider %s does not list diskimage %s", p.cfg.Name, req.Tags[drivers.TagImage])
	}
	ad := &pd.AWSDiskimage
	tags := map[string]string{}
	for k, v := range ad.ImageTags {
		tags[k] = v
	}
	for k, v := range req.Tags {
		tags[k] = v
	}
	data := req.Data
	var local *os.File
	if p.cfg.PostUploadHook != "" {
		// The hook is given the image file: keep a copy as it streams by.
		f, err := os.CreateTemp("", "nodepool-upload-*."+req.Format)
		if err != nil {
			return drivers.Image{}, fmt.Errorf("post-upload-hook: a local copy of the image: %w", err)
		}
		defer os.Remove(f.Name())
		defer f.Close()
		local, data = f, io.TeeReader(req.Data, f)
	}
	var (
		img drivers.Image
		err error
	)
	switch ad.ImportMethod {
	case "ebs-direct":
		img, err = p.importEBSDirect(ctx, req, data, ad, tags)
	case "image":
		img, err = p.importThroughS3(ctx, req, data, ad, tags, true)
	default:
		img, err = p.importThroughS3(ctx, req, data, ad, tags, false)
	}
	if err != nil {
		return drivers.Image{}, err
	}
	if local != nil {
		if err := p.runHook(ctx, img.ExternalID, local.Name()); err != nil {
			if derr := p.DeleteImage(context.WithoutCancel(ctx), img.ExternalID); derr != nil {
				p.log.Warn("could not delete the image the post-upload-hook refused", "image", img.ExternalID, "err", derr)
			}
			return drivers.Image{}, err
		}
	}
	return img, nil
}

func (p *Provider) runHook(ctx context.Context, imageID, file string) error {
	cmd := exec.CommandContext(ctx, p.cfg.PostUploadHook, p.cfg.Name, imageID, file)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("post-upload-hook %s failed on %s (the image is deleted): %w: %s", p.cfg.PostUploadHook, imageID, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// importThroughS3 puts the file in the bucket, imports it as a snapshot
// (or an image), and removes the object.
func (p *Provider) importThroughS3(ctx context.Context, req drivers.ImageUpload, data io.Reader, ad *config.AWSDiskimage, tags map[string]string, asImage bool) (drivers.Image, error) {
	if p.cfg.ObjectStorage == nil || p.cfg.ObjectStorage.BucketName == "" {
		return drivers.Image{}, fmt.Errorf("provider %s has no object-storage bucket-name to import %s through (import-method %s)", p.cfg.Name, req.Name, ad.ImportMethod)
	}
	bucket := p.cfg.ObjectStorage.BucketName
	key := p.objectPrefix() + req.Name + "." + req.Format
	if err := p.putObject(ctx, bucket, key, data, req.Size); err != nil {
		return drivers.Image{}, err
	}
	defer func() {
		if _, err := p.s3.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
			p.log.Warn("could not delete the imported object; a sweep will", "bucket", bucket, "key", key, "err", err)
		}
	}()
	if asImage {
		return p.importImage(ctx, req, bucket, key, ad, tags)
	}
	snap, err := p.importSnapshot(ctx, req, bucket, key, tags)
	if err != nil {
		return drivers.Image{}, err
	}
	return p.register(ctx, req, snap, ad, tags)
}

// putObject uploads a file of size bytes, in parts when it is large (each
// part read into memory: requests over plain HTTP need a body the SDK can
// read twice).
func (p *Provider) putObject(ctx context.Context, bucket, key string, data io.Reader, size int64) error {
	if size <= s3PartSize {
		buf, err := io.ReadAll(io.LimitReader(data, s3PartSize+1))
		if err != nil {
			return fmt.Errorf("reading the image: %w", err)
		}
		if _, err := p.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(buf)}); err != nil {
			return fmt.Errorf("uploading s3://%s/%s: %w", bucket, key, classify(err))
		}
		return nil
	}
	mp, err := p.s3.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return fmt.Errorf("uploading s3://%s/%s: %w", bucket, key, classify(err))
	}
	abort := func() {
		_, _ = p.s3.AbortMultipartUpload(context.WithoutCancel(ctx), &s3.AbortMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: mp.UploadId})
	}
	var parts []s3types.CompletedPart
	buf := make([]byte, s3PartSize)
	for n := int32(1); ; n++ {
		got, rerr := io.ReadFull(data, buf)
		if got > 0 {
			out, err := p.s3.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &key, UploadId: mp.UploadId,
				PartNumber: sdkaws.Int32(n), Body: bytes.NewReader(buf[:got])})
			if err != nil {
				abort()
				return fmt.Errorf("uploading part %d of s3://%s/%s: %w", n, bucket, key, classify(err))
			}
			parts = append(parts, s3types.CompletedPart{ETag: out.ETag, PartNumber: sdkaws.Int32(n)})
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			abort()
			return fmt.Errorf("reading the image: %w", rerr)
		}
	}
	if _, err := p.s3.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: mp.UploadId,
		MultipartUpload: &s3types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		abort()
		return fmt.Errorf("uploading s3://%s/%s: %w", bucket, key, classify(err))
	}
	return nil
}

// importToken is the client token of an import: one per upload attempt.
func importToken(req drivers.ImageUpload) string {
	sum := sha256.Sum256([]byte(req.Tags[drivers.TagUpload] + "|" + req.Name + "|" + req.SHA256))
	return "np-" + hex.EncodeToString(sum[:])[:40]
}

// withImportRetry calls start until AWS takes the import: while it refuses
// for lack of resources (ResourceCountLimitExceeded and such), it is asked
// again until the image-import-timeout; without one, the first refusal
// fails the upload, as in Nodepool.
func (p *Provider) withImportRetry(ctx context.Context, start func() error) error {
	deadline := time.Now().Add(p.cfg.ImageImportTimeout.D())
	for {
		err := start()
		if err == nil || !errors.Is(err, drivers.ErrQuotaExceeded) && !errors.Is(err, drivers.ErrRateLimited) || time.Now().After(deadline) {
			return err
		}
		p.log.Info("AWS refuses the import for now; trying again", "err", err)
		if !sleep(ctx, p.opts.PollInterval) {
			return ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *Provider) importSnapshot(ctx context.Context, req drivers.ImageUpload, bucket, key string, tags map[string]string) (string, error) {
	var task string
	err := p.withImportRetry(ctx, func() error {
		out, err := p.ec2.ImportSnapshot(ctx, &ec2.ImportSnapshotInput{
			ClientToken: sdkaws.String(importToken(req)), Description: sdkaws.String(req.Name),
			DiskContainer: &ec2types.SnapshotDiskContainer{Format: sdkaws.String(strings.ToUpper(req.Format)),
				UserBucket: &ec2types.UserBucket{S3Bucket: &bucket, S3Key: &key}},
			TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeImportSnapshotTask, Tags: ec2Tags(tags)}},
		})
		if err != nil {
			return fmt.Errorf("importing %s as a snapshot: %w", req.Name, classify(err))
		}
		task = sdkaws.ToString(out.ImportTaskId)
		return nil
	})
	if err != nil {
		return "", err
	}
	for {
		out, err := p.ec2.DescribeImportSnapshotTasks(ctx, &ec2.DescribeImportSnapshotTasksInput{ImportTaskIds: []string{task}})
		if err != nil {
			return "", fmt.Errorf("watching import %s: %w", task, classify(err))
		}
		if len(out.ImportSnapshotTasks) == 1 && out.ImportSnapshotTasks[0].SnapshotTaskDetail != nil {
			d := out.ImportSnapshotTasks[0].SnapshotTaskDetail
			switch sdkaws.ToString(d.Status) {
			case "completed":
				snap := sdkaws.ToString(d.SnapshotId)
				if _, err := p.ec2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{snap}, Tags: ec2Tags(tags)}); err != nil {
					return "", fmt.Errorf("tagging snapshot %s: %w", snap, classify(err))
				}
				return snap, nil
			case "deleted", "deleting":
				return "", fmt.Errorf("import %s of %s failed: %s", task, req.Name, sdkaws.ToString(d.StatusMessage))
			}
		}
		if !sleep(ctx, p.opts.PollInterval) {
			return "", ctx.Err()
		}
	}
}

func (p *Provider) importImage(ctx context.Context, req drivers.ImageUpload, bucket, key string, ad *config.AWSDiskimage, tags map[string]string) (drivers.Image, error) {
	var task string
	err := p.withImportRetry(ctx, func() error {
		out, err := p.ec2.ImportImage(ctx, &ec2.ImportImageInput{
			ClientToken: sdkaws.String(importToken(req)), Description: sdkaws.String(req.Name),
			Architecture: sdkaws.String(ad.Architecture), Platform: sdkaws.String("Linux"),
			DiskContainers: []ec2types.ImageDiskContainer{{Format: sdkaws.String(strings.ToUpper(req.Format)),
				UserBucket: &ec2types.UserBucket{S3Bucket: &bucket, S3Key: &key}}},
			TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeImportImageTask, Tags: ec2Tags(tags)}},
		})
		if err != nil {
			return fmt.Errorf("importing %s as an image: %w", req.Name, classify(err))
		}
		task = sdkaws.ToString(out.ImportTaskId)
		return nil
	})
	if err != nil {
		return drivers.Image{}, err
	}
	for {
		out, err := p.ec2.DescribeImportImageTasks(ctx, &ec2.DescribeImportImageTasksInput{ImportTaskIds: []string{task}})
		if err != nil {
			return drivers.Image{}, fmt.Errorf("watching import %s: %w", task, classify(err))
		}
		if len(out.ImportImageTasks) == 1 {
			t := out.ImportImageTasks[0]
			switch sdkaws.ToString(t.Status) {
			case "completed":
				id := sdkaws.ToString(t.ImageId)
				ids := []string{id}
				for _, s := range t.SnapshotDetails {
					if s.SnapshotId != nil {
						ids = append(ids, *s.SnapshotId)
					}
				}
				if _, err := p.ec2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: ids, Tags: ec2Tags(tags)}); err != nil {
					return drivers.Image{}, fmt.Errorf("tagging image %s: %w", id, classify(err))
				}
				return drivers.Image{ExternalID: id, Name: req.Name, Format: req.Format, Size: req.Size, Tags: tags, Created: time.Now().UTC()}, nil
			case "deleted", "deleting":
				return drivers.Image{}, fmt.Errorf("import %s of %s failed: %s", task, req.Name, sdkaws.ToString(t.StatusMessage))
			}
		}
		if !sleep(ctx, p.opts.PollInterval) {
			return drivers.Image{}, ctx.Err()
		}
	}
}

// importEBSDirect writes the file into a new snapshot block by block
// (blocks of zeros are left out: a new snapshot reads as zeros).
func (p *Provider) importEBSDirect(ctx context.Context, req drivers.ImageUpload, data io.Reader, ad *config.AWSDiskimage, tags map[string]string) (drivers.Image, error) {
	size := max(1, (req.Size+gib-1)/gib)
	var etags []ebstypes.Tag
	for _, k := range sortedKeys(tags) {
		etags = append(etags, ebstypes.Tag{Key: sdkaws.String(k), Value: sdkaws.String(tags[k])})
	}
	st, err := p.ebs.StartSnapshot(ctx, &ebs.StartSnapshotInput{VolumeSize: sdkaws.Int64(size), Description: sdkaws.String(req.Name),
		Tags: etags, ClientToken: sdkaws.String(importToken(req)), Timeout: sdkaws.Int32(60)})
	if err != nil {
		return drivers.Image{}, fmt.Errorf("starting snapshot of %s: %w", req.Name, classify(err))
	}
	snap := sdkaws.ToString(st.SnapshotId)
	written, err := p.writeBlocks(ctx, snap, data)
	if err != nil {
		return drivers.Image{}, err
	}
	if _, err := p.ebs.CompleteSnapshot(ctx, &ebs.CompleteSnapshotInput{SnapshotId: &snap, ChangedBlocksCount: sdkaws.Int32(written)}); err != nil {
		return drivers.Image{}, fmt.Errorf("completing snapshot %s: %w", snap, classify(err))
	}
	if err := p.waitSnapshot(ctx, snap, req.Name); err != nil {
		return drivers.Image{}, err
	}
	return p.register(ctx, req, snap, ad, tags)
}

// writeBlocks writes the file into a snapshot, block by block, leaving out
// blocks of zeros; it returns how many blocks it wrote.
func (p *Provider) writeBlocks(ctx context.Context, snap string, data io.Reader) (int32, error) {
	block := make([]byte, ebsBlockSize)
	var written int32
	for idx := int32(0); ; idx++ {
		got, rerr := io.ReadFull(data, block)
		if got > 0 {
			clear(block[got:])
			if !allZero(block) {
				if err := p.putBlock(ctx, snap, idx, block); err != nil {
					return written, err
				}
				written++
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return written, nil
		}
		if rerr != nil {
			return written, fmt.Errorf("reading the image: %w", rerr)
		}
	}
}

// putBlock writes one block of a snapshot, with its checksum.
func (p *Provider) putBlock(ctx context.Context, snap string, idx int32, block []byte) error {
	sum := sha256.Sum256(block)
	if _, err := p.ebs.PutSnapshotBlock(ctx, &ebs.PutSnapshotBlockInput{SnapshotId: &snap, BlockIndex: sdkaws.Int32(idx),
		BlockData: bytes.NewReader(block), DataLength: sdkaws.Int32(ebsBlockSize),
		Checksum: sdkaws.String(base64.StdEncoding.EncodeToString(sum[:])), ChecksumAlgorithm: ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256}); err != nil {
		return fmt.Errorf("writing block %d of snapshot %s: %w", idx, snap, classify(err))
	}
	return nil
}

// waitSnapshot waits until EC2 has completed a snapshot of image name;
// one in error fails the upload.
func (p *Provider) waitSnapshot(ctx context.Context, snap, name string) error {
	for {
		out, err := p.ec2.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snap}})
		if err != nil {
			return fmt.Errorf("watching snapshot %s: %w", snap, classify(err))
		}
		if len(out.Snapshots) == 1 {
			switch out.Snapshots[0].State {
			case ec2types.SnapshotStateCompleted:
				return nil
			case ec2types.SnapshotStateError:
				return fmt.Errorf("snapshot %s of %s failed: %s", snap, name, sdkaws.ToString(out.Snapshots[0].StateMessage))
			}
		}
		if !sleep(ctx, p.opts.PollInterval) {
			return ctx.Err()
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// register makes an AMI of a snapshot with the diskimage's settings and
// waits until it is available.
func (p *Provider) register(ctx context.Context, req drivers.ImageUpload, snap string, ad *config.AWSDiskimage, tags map[string]string) (drivers.Image, error) {
	ebsDev := &ec2types.EbsBlockDevice{SnapshotId: &snap, VolumeType: ec2types.VolumeType(ad.ImageVolumeType), DeleteOnTermination: sdkaws.Bool(true)}
	if ad.ImageVolumeSize > 0 {
		ebsDev.VolumeSize = sdkaws.Int32(int32(ad.ImageVolumeSize))
	}
	if ad.ImageIops > 0 {
		ebsDev.Iops = sdkaws.Int32(int32(ad.ImageIops))
	}
	if ad.ImageThroughput > 0 {
		ebsDev.Throughput = sdkaws.Int32(int32(ad.ImageThroughput))
	}
	in := &ec2.RegisterImageInput{Name: sdkaws.String(req.Name), Description: sdkaws.String(req.Name),
		Architecture: ec2types.ArchitectureValues(ad.Architecture), RootDeviceName: sdkaws.String("/dev/xvda"),
		VirtualizationType: sdkaws.String("hvm"), EnaSupport: sdkaws.Bool(ad.HasENASupport()),
		BlockDeviceMappings: []ec2types.BlockDeviceMapping{{DeviceName: sdkaws.String("/dev/xvda"), Ebs: ebsDev}},
		TagSpecifications:   []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeImage, Tags: ec2Tags(tags)}}}
	if ad.IMDSSupport != "" {
		in.ImdsSupport = ec2types.ImdsSupportValues(ad.IMDSSupport)
	}
	out, err := p.ec2.RegisterImage(ctx, in)
	if err != nil {
		return drivers.Image{}, fmt.Errorf("registering %s: %w", req.Name, classify(err))
	}
	id := sdkaws.ToString(out.ImageId)
	for {
		d, err := p.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{id}})
		if err != nil && code(err) != "InvalidAMIID.NotFound" {
			return drivers.Image{}, fmt.Errorf("watching image %s: %w", id, classify(err))
		}
		if err == nil && len(d.Images) == 1 {
			switch d.Images[0].State {
			case ec2types.ImageStateAvailable:
				return drivers.Image{ExternalID: id, Name: req.Name, Format: req.Format, Size: req.Size, SHA256: req.SHA256, Tags: tags, Created: time.Now().UTC()}, nil
			case ec2types.ImageStateFailed, ec2types.ImageStateError, ec2types.ImageStateInvalid:
				return drivers.Image{}, fmt.Errorf("image %s of %s is %s", id, req.Name, d.Images[0].State)
			}
		}
		if !sleep(ctx, p.opts.PollInterval) {
			return drivers.Image{}, ctx.Err()
		}
	}
}

// DeleteImage deregisters an AMI and deletes its snapshots; an AMI that is
// gone is not an error.
func (p *Provider) DeleteImage(ctx context.Context, externalID string) error {
	out, err := p.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{externalID}})
	if code(err) == "InvalidAMIID.NotFound" || code(err) == "InvalidAMIID.Malformed" || (err == nil && len(out.Images) == 0) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("describing image %s: %w", externalID, classify(err))
	}
	var snaps []string
	for _, bd := range out.Images[0].BlockDeviceMappings {
		if bd.Ebs != nil && bd.Ebs.SnapshotId != nil {
			snaps = append(snaps, *bd.Ebs.SnapshotId)
		}
	}
	if _, err := p.ec2.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: &externalID}); err != nil && code(err) != "InvalidAMIID.NotFound" {
		return fmt.Errorf("deregistering image %s: %w", externalID, classify(err))
	}
	for _, s := range snaps {
		if _, err := p.ec2.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: sdkaws.String(s)}); err != nil && code(err) != "InvalidSnapshot.NotFound" {
			return fmt.Errorf("deleting snapshot %s of image %s: %w", s, externalID, classify(err))
		}
	}
	return nil
}

// ListImages lists the account's own AMIs, with their tags.
func (p *Provider) ListImages(ctx context.Context) ([]drivers.Image, error) {
	var out []drivers.Image
	pg := ec2.NewDescribeImagesPaginator(p.ec2, &ec2.DescribeImagesInput{Owners: []string{"self"}})
	for pg.HasMorePages() {
		page, err := pg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("describing images: %w", classify(err))
		}
		for _, im := range page.Images {
			created, _ := time.Parse(time.RFC3339, sdkaws.ToString(im.CreationDate))
			out = append(out, drivers.Image{ExternalID: sdkaws.ToString(im.ImageId), Name: sdkaws.ToString(im.Name),
				Format: p.cfg.DiskFormat, Tags: tagMap(im.Tags), Created: created})
		}
	}
	return out, nil
}
