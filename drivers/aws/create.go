package aws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/hostkeys"
)

// Steps of the create machine.
const (
	stepImage    = "image"    // find the AMI of a cloud image given by filters
	stepHost     = "host"     // allocate the dedicated host
	stepTemplate = "template" // make the fleet's launch template
	stepLaunch   = "launch"   // RunInstances or CreateFleet
	stepWait     = "wait"     // until the instance runs
	stepScan     = "scan"     // until its SSH host keys are read
)

// createState is the create machine's progress, kept in the node's
// driver_data. Every call it makes carries a client token made from the
// node and attempt, so a machine resumed by another process after a crash
// finds what the first one made instead of making it twice.
type createState struct {
	Step       string `json:"step"`
	ImageID    string `json:"image_id,omitempty"`
	HostID     string `json:"host_id,omitempty"`
	Template   string `json:"template,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// OnDemand: a spot label's node falls back to on-demand after
	// SpotErrors capacity errors (on-demand-fallback).
	OnDemand   bool `json:"on_demand,omitempty"`
	SpotErrors int  `json:"spot_errors,omitempty"`
	// FleetTries counts fleets that launched nothing: an instant fleet
	// is made even when it launches nothing, so the next try needs a
	// client token of its own.
	FleetTries int `json:"fleet_tries,omitempty"`
}

type createMachine struct {
	p     *Provider
	req   drivers.CreateRequest
	pool  *config.Pool
	label *config.PoolLabel
	st    createState
	inst  *drivers.Instance
	// notFound counts describes of a new instance that EC2 does not
	// know yet (its API is eventually consistent).
	notFound int
	lost     lostPolls
}

// Create returns the machine that launches a node's instance; state is a
// machine's earlier progress.
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	pool, pl, err := p.cfg.PoolLabel(req.Pool, req.Label)
	if err != nil {
		return nil, err
	}
	m := &createMachine{p: p, req: req, pool: pool, label: pl}
	if len(state) > 0 {
		if err := json.Unmarshal(state, &m.st); err != nil {
			return nil, fmt.Errorf("driver_data of node %s is not an aws create state: %w", req.NodeID, err)
		}
		if !slices.Contains([]string{"", stepImage, stepHost, stepTemplate, stepLaunch, stepWait, stepScan}, m.st.Step) {
			return nil, fmt.Errorf("driver_data of node %s has an unknown step %q", req.NodeID, m.st.Step)
		}
		if m.st.InstanceID != "" && !strings.HasPrefix(m.st.InstanceID, "i-") {
			return nil, fmt.Errorf("driver_data of node %s names %q, not an instance", req.NodeID, m.st.InstanceID)
		}
	}
	if m.st.Step == stepScan {
		m.st.Step = stepWait // the addresses are read again
	}
	if m.st.Step == "" {
		m.st.Step = m.firstStep()
	}
	return m, nil
}

func (m *createMachine) firstStep() string {
	switch {
	case m.req.ImageID == "" && m.label.CloudImage != "" && m.cloudImage().ImageRef() == "":
		return stepImage
	case m.label.DedicatedHost:
		return stepHost
	case m.label.Fleet != nil:
		return stepTemplate
	}
	return stepLaunch
}

func (m *createMachine) next() string {
	switch m.st.Step {
	case stepImage:
		if m.label.DedicatedHost {
			return stepHost
		}
		fallthrough
	case stepHost:
		if m.label.Fleet != nil {
			return stepTemplate
		}
		return stepLaunch
	case stepTemplate:
		return stepLaunch
	}
	return stepWait
}

func (m *createMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *createMachine) ExternalID() string { return m.st.InstanceID }

func (m *createMachine) cloudImage() *config.AWSCloudImage {
	ci, _ := m.p.cfg.AWSCloudImage(m.label.CloudImage)
	if ci == nil {
		return &config.AWSCloudImage{Name: m.label.CloudImage}
	}
	return ci
}

// token is the client token of one call of this attempt (at most 64
// characters, as EC2 takes them).
func (m *createMachine) token(what string) string {
	t := fmt.Sprintf("np-%s-%d-%s", m.req.NodeID, m.req.Attempt, what)
	if m.st.OnDemand {
		t += "-od"
	}
	if len(t) > 64 {
		sum := sha256.Sum256([]byte(t))
		t = "np-" + hex.EncodeToString(sum[:])[:60]
	}
	return t
}

func (m *createMachine) spot() bool { return m.label.UseSpot && !m.st.OnDemand }

// Advance makes at most one call to EC2 (and a host-key scan at the end).
// Every step is safe to make again (the calls that create carry client
// tokens made from the node and attempt, a template is made once by
// name): a call whose answer did not come is drivers.ErrUncertain, so
// the launcher makes the step again and a RunInstances that did start an
// instance returns that instance instead of leaving it to the next
// attempt.
func (m *createMachine) Advance(ctx context.Context) (drivers.Step, error) {
	step, err := m.advance(ctx)
	if err != nil && ctx.Err() == nil && unanswered(err) {
		err = fmt.Errorf("%w: %w", drivers.ErrUncertain, err)
	}
	return step, err
}

func (m *createMachine) advance(ctx context.Context) (drivers.Step, error) {
	switch m.st.Step {
	case stepImage:
		id, err := m.p.findImage(ctx, m.cloudImage())
		if err != nil {
			return drivers.Step{}, err
		}
		m.st.ImageID, m.st.Step = id, m.next()
		return drivers.Step{}, nil
	case stepHost:
		return m.allocateHost(ctx)
	case stepTemplate:
		name, err := m.p.ensureTemplate(ctx, m.pool, m.label)
		if err != nil {
			return drivers.Step{}, err
		}
		m.st.Template, m.st.Step = name, m.next()
		return drivers.Step{}, nil
	case stepLaunch:
		return m.launch(ctx)
	case stepWait:
		return m.wait(ctx)
	case stepScan:
		return m.scan(ctx)
	}
	return drivers.Step{}, fmt.Errorf("unknown step %q", m.st.Step)
}

func (m *createMachine) imageID() string {
	switch {
	case m.req.ImageID != "":
		return m.req.ImageID
	case m.st.ImageID != "":
		return m.st.ImageID
	}
	return m.cloudImage().ImageRef()
}

// tags are every tag of the node's instance and volumes: nodepool's, the
// label's tags and dynamic-tags, and a Name.
func (m *createMachine) tags() []ec2types.Tag {
	all := map[string]string{"Name": m.req.Hostname}
	for k, v := range m.label.Tags {
		all[k] = v
	}
	for k, v := range m.label.DynamicTags {
		all[k] = formatDynamicTag(v, m.req.Request)
	}
	for k, v := range m.req.Tags {
		all[k] = v
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]ec2types.Tag, 0, len(keys))
	for _, k := range keys {
		out = append(out, ec2types.Tag{Key: sdkaws.String(k), Value: sdkaws.String(all[k])})
	}
	return out
}

func (m *createMachine) allocateHost(ctx context.Context) (drivers.Step, error) {
	out, err := m.p.ec2.AllocateHosts(ctx, &ec2.AllocateHostsInput{
		AvailabilityZone: sdkaws.String(m.pool.AvailabilityZone),
		InstanceType:     sdkaws.String(m.label.InstanceType),
		Quantity:         sdkaws.Int32(1),
		AutoPlacement:    ec2types.AutoPlacementOff,
		// One host per node, whatever the attempt: a later attempt
		// takes the host an earlier one made.
		ClientToken:       sdkaws.String(fmt.Sprintf("np-%s-host", m.req.NodeID)),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeDedicatedHost, Tags: m.tags()}},
	})
	if err != nil {
		return drivers.Step{}, fmt.Errorf("allocating a dedicated host: %w", classify(err))
	}
	if len(out.HostIds) != 1 {
		return drivers.Step{}, fmt.Errorf("allocating a dedicated host: EC2 returned %d hosts", len(out.HostIds))
	}
	m.st.HostID, m.st.Step = out.HostIds[0], m.next()
	return drivers.Step{}, nil
}

// rootDevice is the label's root volume settings (nil: it sets none), for
// RunInstances and, converted, for a fleet's launch template.
func rootDevice(l *config.PoolLabel) *ec2types.EbsBlockDevice {
	if l.RootVolumeType == "" && l.RootVolumeSize == 0 && l.RootIops == 0 && l.RootThroughput == 0 {
		return nil
	}
	e := &ec2types.EbsBlockDevice{DeleteOnTermination: sdkaws.Bool(true)}
	if l.RootVolumeType != "" {
		e.VolumeType = ec2types.VolumeType(l.RootVolumeType)
	}
	if l.RootVolumeSize > 0 {
		e.VolumeSize = sdkaws.Int32(int32(l.RootVolumeSize))
	}
	if l.RootIops > 0 {
		e.Iops = sdkaws.Int32(int32(l.RootIops))
	}
	if l.RootThroughput > 0 {
		e.Throughput = sdkaws.Int32(int32(l.RootThroughput))
	}
	return e
}

func (m *createMachine) networkInterface() ec2types.InstanceNetworkInterfaceSpecification {
	ni := ec2types.InstanceNetworkInterfaceSpecification{DeviceIndex: sdkaws.Int32(0),
		AssociatePublicIpAddress: sdkaws.Bool(m.pool.AssignsPublicIPv4())}
	if m.pool.SubnetID != "" {
		ni.SubnetId = sdkaws.String(m.pool.SubnetID)
	}
	if m.pool.SecurityGroupID != "" {
		ni.Groups = []string{m.pool.SecurityGroupID}
	}
	if m.pool.PublicIPv6 != nil && *m.pool.PublicIPv6 {
		ni.Ipv6AddressCount = sdkaws.Int32(1)
	}
	return ni
}

func (m *createMachine) launch(ctx context.Context) (drivers.Step, error) {
	var id string
	var err error
	if m.label.Fleet != nil {
		id, err = m.createFleet(ctx)
	} else {
		id, err = m.runInstance(ctx)
	}
	if err != nil {
		if errors.Is(err, drivers.ErrCapacity) && m.spot() && m.label.OnDemandFallback > 0 {
			m.st.SpotErrors++
			if m.st.SpotErrors >= m.label.OnDemandFallback {
				m.p.log.Info("falling back to on-demand after spot capacity errors", "node", m.req.NodeID, "errors", m.st.SpotErrors)
				m.st.OnDemand = true
			}
		}
		return drivers.Step{}, err
	}
	m.st.InstanceID, m.st.Step = id, stepWait
	return drivers.Step{}, nil
}

func (m *createMachine) runInstance(ctx context.Context) (string, error) {
	l := m.label
	in := &ec2.RunInstancesInput{
		ImageId: sdkaws.String(m.imageID()), InstanceType: ec2types.InstanceType(l.InstanceType),
		MinCount: sdkaws.Int32(1), MaxCount: sdkaws.Int32(1), ClientToken: sdkaws.String(m.token("run")),
		KeyName: sdkaws.String(l.EC2KeyName), EbsOptimized: sdkaws.Bool(l.EBSOptimized),
		NetworkInterfaces: []ec2types.InstanceNetworkInterfaceSpecification{m.networkInterface()},
		TagSpecifications: []ec2types.TagSpecification{
			{ResourceType: ec2types.ResourceTypeInstance, Tags: m.tags()},
			{ResourceType: ec2types.ResourceTypeVolume, Tags: m.tags()},
		},
	}
	if m.pool.AvailabilityZone != "" || m.st.HostID != "" {
		in.Placement = &ec2types.Placement{AvailabilityZone: nonEmpty(m.pool.AvailabilityZone)}
		if m.st.HostID != "" {
			in.Placement.HostId, in.Placement.Tenancy = sdkaws.String(m.st.HostID), ec2types.TenancyHost
		}
	}
	if ip := l.IAMInstanceProfile; ip != nil {
		in.IamInstanceProfile = &ec2types.IamInstanceProfileSpecification{Name: nonEmpty(ip.Name), Arn: nonEmpty(ip.Arn)}
	}
	if l.IMDSv2 != "" {
		in.MetadataOptions = &ec2types.InstanceMetadataOptionsRequest{HttpTokens: ec2types.HttpTokensState(l.IMDSv2), HttpEndpoint: ec2types.InstanceMetadataEndpointStateEnabled}
	}
	if l.EC2UserData != "" {
		in.UserData = sdkaws.String(base64.StdEncoding.EncodeToString([]byte(l.EC2UserData)))
	}
	if root := rootDevice(m.label); root != nil {
		dev, err := m.p.rootDeviceName(ctx, m.imageID())
		if err != nil {
			return "", err
		}
		in.BlockDeviceMappings = []ec2types.BlockDeviceMapping{{DeviceName: sdkaws.String(dev), Ebs: root}}
	}
	if m.spot() {
		in.InstanceMarketOptions = &ec2types.InstanceMarketOptionsRequest{MarketType: ec2types.MarketTypeSpot,
			SpotOptions: &ec2types.SpotMarketOptions{SpotInstanceType: ec2types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: ec2types.InstanceInterruptionBehaviorTerminate}}
		in.TagSpecifications = append(in.TagSpecifications, ec2types.TagSpecification{ResourceType: ec2types.ResourceTypeSpotInstancesRequest, Tags: m.tags()})
	}
	out, err := m.p.ec2.RunInstances(ctx, in)
	if err != nil {
		return "", fmt.Errorf("launching a %s%s instance: %w", l.InstanceType, map[bool]string{true: " spot", false: ""}[m.spot()], classify(err))
	}
	if len(out.Instances) != 1 || out.Instances[0].InstanceId == nil {
		return "", fmt.Errorf("RunInstances returned %d instances", len(out.Instances))
	}
	return *out.Instances[0].InstanceId, nil
}

func (m *createMachine) createFleet(ctx context.Context) (string, error) {
	l := m.label
	in := &ec2.CreateFleetInput{
		Type: ec2types.FleetTypeInstant, ClientToken: sdkaws.String(m.token("fleet" + strconv.Itoa(m.st.FleetTries))),
		LaunchTemplateConfigs: []ec2types.FleetLaunchTemplateConfigRequest{{
			LaunchTemplateSpecification: &ec2types.FleetLaunchTemplateSpecificationRequest{LaunchTemplateName: sdkaws.String(m.st.Template), Version: sdkaws.String("$Latest")},
			Overrides:                   m.fleetOverrides(),
		}},
		TagSpecifications: []ec2types.TagSpecification{
			{ResourceType: ec2types.ResourceTypeInstance, Tags: m.tags()},
			{ResourceType: ec2types.ResourceTypeVolume, Tags: m.tags()},
		},
	}
	m.setFleetCapacity(in)
	out, err := m.p.ec2.CreateFleet(ctx, in)
	if err != nil {
		return "", fmt.Errorf("launching a fleet of %s: %w", strings.Join(l.Fleet.InstanceTypes, ", "), classify(err))
	}
	for _, fi := range out.Instances {
		if len(fi.InstanceIds) > 0 {
			return fi.InstanceIds[0], nil
		}
	}
	// No instance: every type failed; say why.
	m.st.FleetTries++
	return "", fleetError(out)
}

// fleetOverrides are the instance types a fleet label launches, each with
// the image, and the pool's subnet and availability zone; in the order of
// their priority for the prioritized allocation strategy.
func (m *createMachine) fleetOverrides() []ec2types.FleetLaunchTemplateOverridesRequest {
	l := m.label
	var overrides []ec2types.FleetLaunchTemplateOverridesRequest
	for i, t := range l.Fleet.InstanceTypes {
		o := ec2types.FleetLaunchTemplateOverridesRequest{InstanceType: ec2types.InstanceType(t), ImageId: sdkaws.String(m.imageID())}
		if m.pool.SubnetID != "" {
			o.SubnetId = sdkaws.String(m.pool.SubnetID)
		}
		if m.pool.AvailabilityZone != "" {
			o.AvailabilityZone = sdkaws.String(m.pool.AvailabilityZone)
		}
		if l.Fleet.AllocationStrategy == "prioritized" {
			o.Priority = sdkaws.Float64(float64(i))
		}
		overrides = append(overrides, o)
	}
	return overrides
}

// setFleetCapacity asks a fleet for one instance, spot or on demand, with
// the label's allocation strategy.
func (m *createMachine) setFleetCapacity(in *ec2.CreateFleetInput) {
	l := m.label
	tc := &ec2types.TargetCapacitySpecificationRequest{TotalTargetCapacity: sdkaws.Int32(1)}
	if m.spot() {
		tc.DefaultTargetCapacityType = ec2types.DefaultTargetCapacityTypeSpot
		in.SpotOptions = &ec2types.SpotOptionsRequest{AllocationStrategy: ec2types.SpotAllocationStrategy(l.Fleet.AllocationStrategy)}
	} else {
		tc.DefaultTargetCapacityType = ec2types.DefaultTargetCapacityTypeOnDemand
		strategy := l.Fleet.AllocationStrategy
		if !slices.Contains(config.AWSOnDemandFleet, strategy) {
			strategy = "lowest-price" // a spot label fallen back to on demand
		}
		in.OnDemandOptions = &ec2types.OnDemandOptionsRequest{AllocationStrategy: ec2types.FleetOnDemandAllocationStrategy(strategy)}
	}
	in.TargetCapacitySpecification = tc
}

// fleetError says why a fleet launched no instance: each type's error,
// as the launcher's error kinds (capacity or quota is a wait, not a failed
// attempt): quota if a type ran out of it, else the first kind found.
func fleetError(out *ec2.CreateFleetOutput) error {
	var msgs []string
	var kind error
	for _, e := range out.Errors {
		c := sdkaws.ToString(e.ErrorCode)
		t := ""
		if e.LaunchTemplateAndOverrides != nil && e.LaunchTemplateAndOverrides.Overrides != nil {
			t = string(e.LaunchTemplateAndOverrides.Overrides.InstanceType) + ": "
		}
		msgs = append(msgs, t+c+": "+sdkaws.ToString(e.ErrorMessage))
		switch k := kindOf(c); {
		case k == nil:
		case kind == nil || errors.Is(k, drivers.ErrQuotaExceeded):
			kind = k
		}
	}
	err := fmt.Errorf("the fleet %s launched no instance: %s", sdkaws.ToString(out.FleetId), strings.Join(msgs, "; "))
	if kind != nil {
		err = fmt.Errorf("%w: %w", kind, err)
	}
	return err
}

func (m *createMachine) wait(ctx context.Context) (drivers.Step, error) {
	in, ok, err := m.p.watch.get(ctx, m.st.InstanceID)
	if m.lost.again(err) {
		m.p.log.Warn("the answer to a poll was lost; polling again", "instance", m.st.InstanceID, "err", err)
		return drivers.Step{Wait: time.Second}, nil
	}
	if err != nil {
		return drivers.Step{}, fmt.Errorf("describing instance %s: %w", m.st.InstanceID, err)
	}
	if !ok {
		if m.notFound < 10 {
			// A new instance may take a moment to be known everywhere.
			m.notFound++
			return drivers.Step{Wait: time.Second}, nil
		}
		return drivers.Step{}, fmt.Errorf("instance %s: EC2 does not know it", m.st.InstanceID)
	}
	state := ec2types.InstanceStateNamePending
	if in.State != nil {
		state = in.State.Name
	}
	switch state {
	case ec2types.InstanceStateNamePending:
		// The watch spaces the polls.
		return drivers.Step{}, nil
	case ec2types.InstanceStateNameRunning:
	default:
		why := string(state)
		if in.StateReason != nil {
			why += ": " + sdkaws.ToString(in.StateReason.Message)
		}
		return drivers.Step{}, fmt.Errorf("instance %s is %s before it ran", m.st.InstanceID, why)
	}
	useInternal := m.pool.UseInternalIP
	inst := m.p.instance(&in, &useInternal)
	inst.Resources, _ = m.p.resources(string(in.InstanceType), in.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot)
	m.applyAccess(&inst)
	m.inst = &inst
	if !m.pool.ChecksHostKeys() || (inst.ConnectionType != "" && inst.ConnectionType != "ssh" && inst.ConnectionType != "network_cli") {
		return drivers.Step{Done: true, Instance: m.inst}, nil
	}
	m.st.Step = stepScan
	return drivers.Step{}, nil
}

// applyAccess reports how the node is reached when the provider's config
// says so (the cloud image's settings, or the provider's diskimage entry's
// username, python-path and shell-type).
func (m *createMachine) applyAccess(inst *drivers.Instance) {
	if m.label.CloudImage != "" {
		ci := m.cloudImage()
		inst.Username, inst.PythonPath, inst.ShellType = ci.Username, ci.PythonPath, ci.ShellType
		inst.ConnectionType, inst.ConnectionPort = ci.ConnectionType, ci.ConnectionPort
		return
	}
	if pd, ok := m.p.cfg.Diskimage(m.label.Diskimage); ok {
		inst.Username, inst.PythonPath, inst.ShellType = pd.AWSUsername, pd.AWSPythonPath, pd.AWSShellType
		inst.ConnectionType = pd.ConnectionType
		inst.ConnectionPort = pd.ConnectionPort
	}
}

func (m *createMachine) scan(ctx context.Context) (drivers.Step, error) {
	port := m.inst.ConnectionPort
	if port == 0 {
		port = 22
	}
	addr := net.JoinHostPort(m.inst.InterfaceIP, strconv.Itoa(port))
	keys, err := hostkeys.Scan(ctx, addr, m.p.opts.ScanTimeout)
	if err != nil {
		// Not yet up: the boot-timeout bounds how long this goes on.
		m.p.log.Debug("host key scan failed; trying again", "node", m.req.NodeID, "addr", addr, "err", err)
		return drivers.Step{Wait: 2 * time.Second}, nil
	}
	m.inst.HostKeys = keys
	return drivers.Step{Done: true, Instance: m.inst}, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return sdkaws.String(s)
}

// formatDynamicTag fills a dynamic-tags format string with what is known
// of the node's request ({request.id}, ...; {{ and }} are braces).
func formatDynamicTag(format string, r *drivers.RequestInfo) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		switch {
		case c == '{' && i+1 < len(format) && format[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(format) && format[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(format[i:], '}')
			if end < 0 {
				b.WriteString(format[i:])
				return b.String()
			}
			b.WriteString(requestField(format[i+1:i+end], r))
			i += end
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func requestField(field string, r *drivers.RequestInfo) string {
	if r == nil {
		return ""
	}
	name, index, _ := strings.Cut(field, "[")
	index = strings.Trim(strings.TrimSuffix(index, "]"), `'"`)
	switch name {
	case "request.id":
		return r.ID
	case "request.labels":
		return "[" + strings.Join(r.Labels, ", ") + "]"
	case "request.requestor":
		return r.Requestor
	case "request.requestor_data":
		if index != "" {
			return r.RequestorData[index]
		}
		data, _ := json.Marshal(r.RequestorData)
		return string(data)
	case "request.relative_priority":
		return strconv.Itoa(r.RelativePriority)
	case "request.event_id":
		return r.EventID
	case "request.created_time":
		return strconv.FormatFloat(float64(r.Created.UnixMilli())/1000, 'f', -1, 64)
	case "request.tenant_name":
		return r.Tenant
	}
	return ""
}
