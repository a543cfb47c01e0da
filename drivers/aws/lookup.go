package aws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
)

// amiCacheTime is how long an AMI found by filters is used before they
// are asked again (a newer image may have been published).
const amiCacheTime = 5 * time.Minute

// findImage finds the newest AMI a cloud image's filters match.
func (p *Provider) findImage(ctx context.Context, ci *config.AWSCloudImage) (string, error) {
	p.mu.Lock()
	c, ok := p.amis[ci.Name]
	p.mu.Unlock()
	if ok && time.Since(c.at) < amiCacheTime {
		return c.id, nil
	}
	in := &ec2.DescribeImagesInput{}
	for _, f := range ci.ImageFilters {
		in.Filters = append(in.Filters, ec2types.Filter{Name: sdkaws.String(f.Name), Values: f.Values})
	}
	var images []ec2types.Image
	pg := ec2.NewDescribeImagesPaginator(p.ec2, in)
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return "", fmt.Errorf("finding cloud image %s: %w", ci.Name, classify(err))
		}
		images = append(images, out.Images...)
	}
	if len(images) == 0 {
		return "", fmt.Errorf("%w: cloud image %s: no AMI matches its image-filters", drivers.ErrFatal, ci.Name)
	}
	sort.Slice(images, func(i, j int) bool {
		return sdkaws.ToString(images[i].CreationDate) > sdkaws.ToString(images[j].CreationDate)
	})
	id := sdkaws.ToString(images[0].ImageId)
	p.mu.Lock()
	p.amis[ci.Name] = cachedAMI{id: id, at: time.Now()}
	p.mu.Unlock()
	return id, nil
}

// rootDeviceName is the root device of an AMI (where a label's volume
// settings apply).
func (p *Provider) rootDeviceName(ctx context.Context, imageID string) (string, error) {
	out, err := p.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{imageID}})
	if err != nil {
		return "", fmt.Errorf("describing image %s: %w", imageID, classify(err))
	}
	if len(out.Images) == 0 || out.Images[0].RootDeviceName == nil {
		return "/dev/xvda", nil
	}
	return *out.Images[0].RootDeviceName, nil
}

// ensureTemplate makes the launch template a fleet label launches with:
// everything of the label but the instance type, image and subnet, which
// each fleet call gives in its overrides. Its name holds a digest of its
// content, so a changed label gets a new template.
func (p *Provider) ensureTemplate(ctx context.Context, pool *config.Pool, l *config.PoolLabel) (string, error) {
	data := &ec2types.RequestLaunchTemplateData{KeyName: sdkaws.String(l.EC2KeyName), EbsOptimized: sdkaws.Bool(l.EBSOptimized)}
	ni := ec2types.LaunchTemplateInstanceNetworkInterfaceSpecificationRequest{DeviceIndex: sdkaws.Int32(0),
		AssociatePublicIpAddress: sdkaws.Bool(pool.AssignsPublicIPv4())}
	if pool.SecurityGroupID != "" {
		ni.Groups = []string{pool.SecurityGroupID}
	}
	if pool.PublicIPv6 != nil && *pool.PublicIPv6 {
		ni.Ipv6AddressCount = sdkaws.Int32(1)
	}
	data.NetworkInterfaces = []ec2types.LaunchTemplateInstanceNetworkInterfaceSpecificationRequest{ni}
	if ip := l.IAMInstanceProfile; ip != nil {
		data.IamInstanceProfile = &ec2types.LaunchTemplateIamInstanceProfileSpecificationRequest{Name: nonEmpty(ip.Name), Arn: nonEmpty(ip.Arn)}
	}
	if l.IMDSv2 != "" {
		data.MetadataOptions = &ec2types.LaunchTemplateInstanceMetadataOptionsRequest{HttpTokens: ec2types.LaunchTemplateHttpTokensState(l.IMDSv2),
			HttpEndpoint: ec2types.LaunchTemplateInstanceMetadataEndpointStateEnabled}
	}
	if l.EC2UserData != "" {
		data.UserData = sdkaws.String(base64.StdEncoding.EncodeToString([]byte(l.EC2UserData)))
	}
	if root := rootDevice(l); root != nil {
		e := &ec2types.LaunchTemplateEbsBlockDeviceRequest{DeleteOnTermination: root.DeleteOnTermination,
			VolumeType: root.VolumeType, VolumeSize: root.VolumeSize, Iops: root.Iops, Throughput: root.Throughput}
		// Fleet images are diskimage uploads or cloud images: nodepool's
		// uploads and most public AMIs boot from /dev/xvda or /dev/sda1;
		// the template names the first, as Nodepool does.
		data.BlockDeviceMappings = []ec2types.LaunchTemplateBlockDeviceMappingRequest{{DeviceName: sdkaws.String("/dev/xvda"), Ebs: e}}
	}
	raw, _ := json.Marshal(data)
	sum := sha256.Sum256(append([]byte(p.cfg.Name+"\x00"), raw...))
	name := "nodepool-" + hex.EncodeToString(sum[:])[:20]
	p.mu.Lock()
	known := p.templates[name]
	p.mu.Unlock()
	if known {
		return name, nil
	}
	_, err := p.ec2.CreateLaunchTemplate(ctx, &ec2.CreateLaunchTemplateInput{
		LaunchTemplateName: sdkaws.String(name), LaunchTemplateData: data, ClientToken: sdkaws.String(name),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeLaunchTemplate,
			Tags: []ec2types.Tag{{Key: sdkaws.String(drivers.TagProvider), Value: sdkaws.String(p.cfg.Name)}}}},
	})
	if err != nil && code(err) != "InvalidLaunchTemplateName.AlreadyExistsException" {
		return "", fmt.Errorf("creating launch template %s: %w", name, classify(err))
	}
	p.mu.Lock()
	p.templates[name] = true
	p.mu.Unlock()
	return name, nil
}
