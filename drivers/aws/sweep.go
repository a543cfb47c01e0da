package aws

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/nodepool-nats/nodepool/drivers"
)

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Sweep removes what this provider's instances and imports left behind,
// once per SweepInterval: volumes tagged as ours that are no longer
// attached, dedicated hosts of nodes that are gone, snapshots of ours that
// no AMI uses and image files in the bucket, once older than LeakAge, and
// launch templates the configuration no longer makes. (Leaked instances
// are the launcher's; leaked AMIs the builder's.)
func (p *Provider) Sweep(ctx context.Context, known func(nodeID string) bool) error {
	p.mu.Lock()
	due := time.Since(p.lastSweep) >= p.opts.SweepInterval
	if due {
		p.lastSweep = time.Now()
	}
	p.mu.Unlock()
	if !due {
		return nil
	}
	ours := ec2types.Filter{Name: sdkaws.String("tag:" + drivers.TagProvider), Values: []string{p.cfg.Name}}
	return errors.Join(p.sweepVolumes(ctx, ours), p.sweepHosts(ctx, ours, known), p.sweepSnapshots(ctx, ours),
		p.sweepObjects(ctx), p.sweepTemplates(ctx, ours))
}

func (p *Provider) sweepVolumes(ctx context.Context, ours ec2types.Filter) error {
	pg := ec2.NewDescribeVolumesPaginator(p.ec2, &ec2.DescribeVolumesInput{Filters: []ec2types.Filter{ours,
		{Name: sdkaws.String("status"), Values: []string{"available"}}}})
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("describing volumes: %w", classify(err))
		}
		for _, v := range out.Volumes {
			p.log.Info("deleting a leaked volume", "volume", sdkaws.ToString(v.VolumeId), "node", tagMap(v.Tags)[drivers.TagNode])
			if _, err := p.ec2.DeleteVolume(ctx, &ec2.DeleteVolumeInput{VolumeId: v.VolumeId}); err != nil && code(err) != "InvalidVolume.NotFound" {
				return fmt.Errorf("deleting volume %s: %w", sdkaws.ToString(v.VolumeId), classify(err))
			}
		}
	}
	return nil
}

func (p *Provider) sweepHosts(ctx context.Context, ours ec2types.Filter, known func(string) bool) error {
	if !p.usesHosts() {
		return nil
	}
	out, err := p.ec2.DescribeHosts(ctx, &ec2.DescribeHostsInput{Filter: []ec2types.Filter{ours,
		{Name: sdkaws.String("state"), Values: []string{"available"}}}})
	if err != nil {
		return fmt.Errorf("describing dedicated hosts: %w", classify(err))
	}
	var idle []string
	for _, h := range out.Hosts {
		if len(h.Instances) == 0 && !known(tagMap(h.Tags)[drivers.TagNode]) {
			idle = append(idle, sdkaws.ToString(h.HostId))
		}
	}
	if len(idle) == 0 {
		return nil
	}
	p.log.Info("releasing leaked dedicated hosts", "hosts", idle)
	if _, err := p.ec2.ReleaseHosts(ctx, &ec2.ReleaseHostsInput{HostIds: idle}); err != nil {
		return fmt.Errorf("releasing dedicated hosts: %w", classify(err))
	}
	return nil
}

func (p *Provider) usesHosts() bool {
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			if pl.DedicatedHost {
				return true
			}
		}
	}
	return false
}

func (p *Provider) sweepSnapshots(ctx context.Context, ours ec2types.Filter) error {
	used, err := p.imageSnapshots(ctx)
	if err != nil {
		return err
	}
	spg := ec2.NewDescribeSnapshotsPaginator(p.ec2, &ec2.DescribeSnapshotsInput{OwnerIds: []string{"self"}, Filters: []ec2types.Filter{ours}})
	for spg.HasMorePages() {
		out, err := spg.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("describing snapshots: %w", classify(err))
		}
		for _, s := range out.Snapshots {
			id := sdkaws.ToString(s.SnapshotId)
			if used[id] || s.StartTime == nil || time.Since(*s.StartTime) < p.opts.LeakAge {
				continue
			}
			p.log.Info("deleting a leaked snapshot", "snapshot", id)
			if _, err := p.ec2.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: s.SnapshotId}); err != nil &&
				code(err) != "InvalidSnapshot.NotFound" && code(err) != "InvalidSnapshot.InUse" {
				return fmt.Errorf("deleting snapshot %s: %w", id, classify(err))
			}
		}
	}
	return nil
}

// imageSnapshots is the set of snapshots that the account's images are
// made of.
func (p *Provider) imageSnapshots(ctx context.Context) (map[string]bool, error) {
	used := map[string]bool{}
	ipg := ec2.NewDescribeImagesPaginator(p.ec2, &ec2.DescribeImagesInput{Owners: []string{"self"}})
	for ipg.HasMorePages() {
		out, err := ipg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("describing images: %w", classify(err))
		}
		for _, im := range out.Images {
			for _, bd := range im.BlockDeviceMappings {
				if bd.Ebs != nil && bd.Ebs.SnapshotId != nil {
					used[*bd.Ebs.SnapshotId] = true
				}
			}
		}
	}
	return used, nil
}

func (p *Provider) sweepObjects(ctx context.Context) error {
	if p.cfg.ObjectStorage == nil || p.cfg.ObjectStorage.BucketName == "" {
		return nil
	}
	bucket := p.cfg.ObjectStorage.BucketName
	pg := s3.NewListObjectsV2Paginator(p.s3, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: sdkaws.String(p.objectPrefix())})
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("listing s3://%s/%s: %w", bucket, p.objectPrefix(), classify(err))
		}
		for _, o := range out.Contents {
			if o.LastModified == nil || time.Since(*o.LastModified) < p.opts.LeakAge {
				continue
			}
			p.log.Info("deleting a leaked image file", "bucket", bucket, "key", sdkaws.ToString(o.Key))
			if _, err := p.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key}); err != nil {
				return fmt.Errorf("deleting s3://%s/%s: %w", bucket, sdkaws.ToString(o.Key), classify(err))
			}
		}
	}
	return nil
}

// sweepTemplates deletes this provider's launch templates that its fleet
// labels no longer use (made before a change of the configuration).
func (p *Provider) sweepTemplates(ctx context.Context, ours ec2types.Filter) error {
	if !p.usesFleets() {
		return nil
	}
	current := map[string]bool{}
	for _, pool := range p.cfg.Pools {
		for i := range pool.Labels {
			if pool.Labels[i].Fleet == nil {
				continue
			}
			// ensureTemplate makes no call for a template it knows.
			name, err := p.ensureTemplate(ctx, &pool, &pool.Labels[i])
			if err != nil {
				return err
			}
			current[name] = true
		}
	}
	out, err := p.ec2.DescribeLaunchTemplates(ctx, &ec2.DescribeLaunchTemplatesInput{Filters: []ec2types.Filter{ours}})
	if err != nil {
		return fmt.Errorf("describing launch templates: %w", classify(err))
	}
	for _, t := range out.LaunchTemplates {
		name := sdkaws.ToString(t.LaunchTemplateName)
		if current[name] || !strings.HasPrefix(name, "nodepool-") {
			continue
		}
		p.log.Info("deleting an unused launch template", "template", name)
		if _, err := p.ec2.DeleteLaunchTemplate(ctx, &ec2.DeleteLaunchTemplateInput{LaunchTemplateId: t.LaunchTemplateId}); err != nil {
			return fmt.Errorf("deleting launch template %s: %w", name, classify(err))
		}
	}
	return nil
}

func (p *Provider) usesFleets() bool {
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			if pl.Fleet != nil {
				return true
			}
		}
	}
	return false
}
