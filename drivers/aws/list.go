package aws

import (
	"context"
	"fmt"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/drivers"
)

// liveStates are the states of instances that hold quota or may still run.
var liveStates = []string{"pending", "running", "shutting-down", "stopping", "stopped"}

// RebalanceTag is the tag that, on a spot instance, says EC2 recommends
// rebalancing it away. AWS tells rebalance recommendations only inside
// the instance (instance metadata) and on EventBridge, so a relay (an
// EventBridge rule, an agent on the node) writes this tag for a driver
// that polls.
const RebalanceTag = "nodepool_rebalance_recommendation"

func tagMap(tags []ec2types.Tag) map[string]string {
	m := make(map[string]string, len(tags))
	for _, t := range tags {
		m[sdkaws.ToString(t.Key)] = sdkaws.ToString(t.Value)
	}
	return m
}

// ListInstances lists every live instance of the account in the region,
// ours (tagged) and others, with what each holds against quota.
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	var raw []ec2types.Instance
	pg := ec2.NewDescribeInstancesPaginator(p.ec2, &ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{{Name: sdkaws.String("instance-state-name"), Values: liveStates}}})
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("describing instances: %w", classify(err))
		}
		for _, r := range out.Reservations {
			raw = append(raw, r.Instances...)
		}
	}
	var unknown []string
	for _, in := range raw {
		if _, ok := p.typeOf(string(in.InstanceType)); !ok {
			unknown = append(unknown, string(in.InstanceType))
		}
	}
	if len(unknown) > 0 {
		if err := p.loadTypes(ctx, unknown); err != nil {
			p.log.Warn("could not read the sizes of some instance types; they count as one instance only", "types", unknown, "err", err)
		}
	}
	out := make([]drivers.Instance, 0, len(raw))
	for i := range raw {
		out = append(out, p.instance(&raw[i], nil))
	}
	return out, nil
}

// instance converts an EC2 instance; pool, when known, says which
// addresses nodes use.
func (p *Provider) instance(in *ec2types.Instance, poolUseInternal *bool) drivers.Instance {
	inst := drivers.Instance{
		ExternalID:  sdkaws.ToString(in.InstanceId),
		Tags:        tagMap(in.Tags),
		Region:      p.cfg.RegionName,
		PrivateIPv4: sdkaws.ToString(in.PrivateIpAddress),
		PublicIPv4:  sdkaws.ToString(in.PublicIpAddress),
		PublicIPv6:  sdkaws.ToString(in.Ipv6Address),
		ImageID:     sdkaws.ToString(in.ImageId),
	}
	if inst.PublicIPv6 == "" {
		for _, ni := range in.NetworkInterfaces {
			for _, a := range ni.Ipv6Addresses {
				if inst.PublicIPv6 == "" {
					inst.PublicIPv6 = sdkaws.ToString(a.Ipv6Address)
				}
			}
		}
	}
	if in.Placement != nil {
		inst.AZ = sdkaws.ToString(in.Placement.AvailabilityZone)
	}
	inst.Name = inst.Tags["Name"]
	useInternal := false
	if poolUseInternal != nil {
		useInternal = *poolUseInternal
	} else if pool, ok := p.cfg.Pool(inst.Tags[drivers.TagPool]); ok && inst.Tags[drivers.TagProvider] == p.cfg.Name {
		useInternal = pool.UseInternalIP
	}
	switch {
	case useInternal:
		inst.InterfaceIP = inst.PrivateIPv4
	case inst.PublicIPv4 != "":
		inst.InterfaceIP = inst.PublicIPv4
	case inst.PublicIPv6 != "":
		inst.InterfaceIP = inst.PublicIPv6
	default:
		inst.InterfaceIP = inst.PrivateIPv4
	}
	inst.Resources, _ = p.resources(string(in.InstanceType), in.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot)
	if in.State != nil {
		inst.Status = string(in.State.Name)
	}
	inst.Run = runState(inst.Status)
	return inst
}

// runState is whether an instance in an EC2 state runs: running runs,
// pending is on its way (booting, or starting again), stopping, stopped,
// shutting-down and terminated are down. (ListInstances lists no
// terminated instance: one is gone from the listing.)
func runState(state string) drivers.RunState {
	switch ec2types.InstanceStateName(state) {
	case ec2types.InstanceStateNameRunning:
		return drivers.Running
	case ec2types.InstanceStateNamePending:
		return drivers.Changing
	case ec2types.InstanceStateNameStopping, ec2types.InstanceStateNameStopped, ec2types.InstanceStateNameShuttingDown, ec2types.InstanceStateNameTerminated:
		return drivers.Down
	}
	return drivers.RunUnknown
}

var _ drivers.Liveness = (*Provider)(nil)

// ListingAge is 0: ListInstances describes the instances when called.
func (p *Provider) ListingAge() time.Duration { return 0 }

// spotNotices are the spot request status codes of an interruption to
// come; spotTaken, of one done.
var (
	spotNotices = []string{"marked-for-termination", "marked-for-stop", "marked-for-hibernation"}
	spotTaken   = []string{"instance-terminated-no-capacity", "instance-terminated-by-price", "instance-terminated-capacity-oversubscribed",
		"instance-stopped-no-capacity", "instance-stopped-by-price", "instance-hibernated-no-capacity"}
)

// usesSpot reports whether any label of the provider launches spot
// instances.
func (p *Provider) usesSpot() bool {
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			if pl.UseSpot {
				return true
			}
		}
	}
	return false
}

// Interruptions lists this provider's spot instances that EC2 is taking
// back or took (its spot request says so, or the instance's state reason),
// and those with a rebalance recommendation (RebalanceTag). A provider
// without spot labels makes no call.
func (p *Provider) Interruptions(ctx context.Context) ([]drivers.Interruption, error) {
	if !p.usesSpot() {
		return nil, nil
	}
	spot, err := p.spotInstances(ctx)
	if err != nil {
		return nil, err
	}
	if len(spot) == 0 {
		return nil, nil
	}
	requests, err := p.interruptedRequests(ctx, spot)
	if err != nil {
		return nil, err
	}
	var out []drivers.Interruption
	for _, in := range spot {
		if reason := interruptionReason(&in, requests); reason != "" {
			out = append(out, drivers.Interruption{ExternalID: sdkaws.ToString(in.InstanceId), NodeID: tagMap(in.Tags)[drivers.TagNode], Reason: reason})
		}
	}
	return out, nil
}

// spotInstances are this provider's spot instances.
func (p *Provider) spotInstances(ctx context.Context) ([]ec2types.Instance, error) {
	var spot []ec2types.Instance
	pg := ec2.NewDescribeInstancesPaginator(p.ec2, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: sdkaws.String("tag:" + drivers.TagProvider), Values: []string{p.cfg.Name}},
		{Name: sdkaws.String("instance-lifecycle"), Values: []string{"spot"}},
	}})
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("describing spot instances: %w", classify(err))
		}
		for _, r := range out.Reservations {
			spot = append(spot, r.Instances...)
		}
	}
	return spot, nil
}

// interruptedRequests are the spot requests of spot instances whose status
// says EC2 is taking them back or took them, by id (asked for 200 at a
// time).
func (p *Provider) interruptedRequests(ctx context.Context, spot []ec2types.Instance) (map[string]ec2types.SpotInstanceRequest, error) {
	requests := map[string]ec2types.SpotInstanceRequest{}
	var ids []string
	for _, in := range spot {
		if id := sdkaws.ToString(in.SpotInstanceRequestId); id != "" {
			ids = append(ids, id)
		}
	}
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 200)]
		ids = ids[len(batch):]
		rp := ec2.NewDescribeSpotInstanceRequestsPaginator(p.ec2, &ec2.DescribeSpotInstanceRequestsInput{Filters: []ec2types.Filter{
			{Name: sdkaws.String("spot-instance-request-id"), Values: batch},
			{Name: sdkaws.String("status-code"), Values: append(append([]string{}, spotNotices...), spotTaken...)},
		}})
		for rp.HasMorePages() {
			out, err := rp.NextPage(ctx)
			if err != nil {
				return nil, fmt.Errorf("describing spot requests: %w", classify(err))
			}
			for _, r := range out.SpotInstanceRequests {
				requests[sdkaws.ToString(r.SpotInstanceRequestId)] = r
			}
		}
	}
	return requests, nil
}

// interruptionReason says why a spot instance is interrupted, or may be
// soon: its state reason, the status of its spot request (among
// requests), or its RebalanceTag; "" when it is not.
func interruptionReason(in *ec2types.Instance, requests map[string]ec2types.SpotInstanceRequest) string {
	var code, msg string
	if r, ok := requests[sdkaws.ToString(in.SpotInstanceRequestId)]; ok && r.Status != nil {
		code, msg = sdkaws.ToString(r.Status.Code), sdkaws.ToString(r.Status.Message)
	}
	tags := tagMap(in.Tags)
	switch {
	case in.StateReason != nil && strings.HasPrefix(sdkaws.ToString(in.StateReason.Code), "Server.Spot"):
		return "spot instance interrupted by EC2: " + sdkaws.ToString(in.StateReason.Message)
	case contains(spotTaken, code):
		return "spot instance interrupted by EC2: " + code + ": " + msg
	case contains(spotNotices, code):
		return "spot interruption notice: " + code + ": " + msg
	case tags[RebalanceTag] != "":
		return "spot rebalance recommendation (" + tags[RebalanceTag] + "): EC2 may interrupt this instance soon"
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
