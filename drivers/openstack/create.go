package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/hostkeys"
)

// Steps of a create, in order. Each Advance runs one; what it learns
// (ids) is in the state, stored in the node's driver_data, so that
// another process resumes at the same step.
const (
	stepStart      = ""
	stepVolume     = "volume"      // create the boot volume (boot-from-volume)
	stepVolumeWait = "volume-wait" // until it is available
	stepServer     = "server"      // create the server
	stepBoot       = "boot"        // until it is ACTIVE (or ERROR)
	stepFloatingIP = "floating-ip" // attach a floating IP (auto-floating-ip)
	stepScan       = "scan"        // the SSH host-key scan (host-key-checking)
)

// scanTimeout bounds one host-key scan try; the launcher's boot-timeout
// bounds them all.
const scanTimeout = 10 * time.Second

// createState is a create's progress, as stored in driver_data.
type createState struct {
	Step     string `json:"step,omitempty"`
	AZ       string `json:"az,omitempty"`
	Volume   string `json:"volume,omitempty"`
	Server   string `json:"server,omitempty"`
	FIP      string `json:"floating_ip,omitempty"`
	PublicIP string `json:"public_ip,omitempty"`
}

type createMachine struct {
	p   *Provider
	req drivers.CreateRequest
	st  createState
	// mayExist: a server or volume of this step may exist already (the
	// machine was resumed, or a create call's outcome is unknown), so the
	// step looks for it before creating one.
	mayExist bool
	server   *server // the ACTIVE server, once seen
}

// Create returns a machine that creates the server of one node; state is
// a stored createState (nil: start afresh).
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	if _, _, err := p.cfg.PoolLabel(req.Pool, req.Label); err != nil {
		return nil, err
	}
	m := &createMachine{p: p, req: req}
	if len(state) > 0 && string(state) != "null" {
		if err := json.Unmarshal(state, &m.st); err != nil {
			return nil, fmt.Errorf("openstack: resuming the create of node %s: %w", req.NodeID, err)
		}
		// The process that made the steps before may have died in a
		// create call: what it creates may exist. Past that call (a
		// recorded server or volume being waited for), it is known.
		switch m.st.Step {
		case stepVolume, stepServer, stepFloatingIP:
			m.mayExist = true
		}
	}
	return m, nil
}

func (m *createMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *createMachine) ExternalID() string { return m.st.Server }

// Advance makes the machine's next step. A step that fails while a
// server, volume or floating IP of it may exist (its create call got no
// answer, or a 5xx one) is drivers.ErrUncertain: made again, it looks for
// what the call may have made before making another, so the launcher
// makes it again instead of starting an attempt that would leave that
// resource behind.
func (m *createMachine) Advance(ctx context.Context) (drivers.Step, error) {
	step, err := m.advance(ctx)
	if err != nil && ctx.Err() == nil && m.mayExist && !refused(err) {
		err = fmt.Errorf("%w: %w", drivers.ErrUncertain, err)
	}
	return step, err
}

// refused: the cloud answered that it did not do what it was asked (4xx).
func refused(err error) bool {
	var ce *cloudError
	return errors.As(err, &ce) && ce.status >= 400 && ce.status < 500
}

func (m *createMachine) advance(ctx context.Context) (drivers.Step, error) {
	p := m.p
	cl, err := p.client(ctx)
	if err != nil {
		return drivers.Step{}, err
	}
	pool, pl, err := p.cfg.PoolLabel(m.req.Pool, m.req.Label)
	if err != nil {
		return drivers.Step{}, err
	}
	switch m.st.Step {
	case stepStart:
		return m.start(ctx, cl, pool, pl)
	case stepVolume:
		return m.createVolume(ctx, cl, pl)
	case stepVolumeWait:
		return m.waitVolume(ctx, cl)
	case stepServer:
		return m.createServer(ctx, cl, pool, pl)
	case stepBoot:
		return m.boot(ctx, cl, pool)
	case stepFloatingIP:
		return m.attachFloatingIP(ctx, cl)
	case stepScan:
		return m.scan(ctx, pool, pl)
	}
	return drivers.Step{}, fmt.Errorf("openstack: unknown create step %q", m.st.Step)
}

// start chooses the availability zone, and the first step: the boot
// volume (after deleting those earlier attempts left), or the server.
func (m *createMachine) start(ctx context.Context, cl *clients, pool *config.Pool, pl *config.PoolLabel) (drivers.Step, error) {
	azs, err := m.p.availabilityZones(ctx, cl, pool)
	if err != nil {
		return drivers.Step{}, err
	}
	m.st = createState{Step: stepServer, AZ: chooseAZ(&m.req, azs)}
	if pl.BootFromVolume {
		m.st.Step = stepVolume
		if err := m.dropOldVolumes(ctx, cl); err != nil {
			return drivers.Step{}, err
		}
	}
	return drivers.Step{}, nil
}

// waitVolume waits until the boot volume is available.
func (m *createMachine) waitVolume(ctx context.Context, cl *clients) (drivers.Step, error) {
	v, err := volumes.Get(ctx, cl.volume, m.st.Volume).Extract()
	if err != nil {
		return drivers.Step{}, wrapf(err, "volume %s", m.st.Volume)
	}
	switch v.Status {
	case "available":
		m.st.Step = stepServer
		return drivers.Step{}, nil
	case "creating", "downloading":
		return drivers.Step{Wait: pollInterval}, nil
	}
	return drivers.Step{}, fmt.Errorf("boot volume %s is %s", v.ID, v.Status)
}

// tags are the metadata of the node's server and volume: the launcher's
// tags (provider, pool, node, label), the attempt, the nodepool-id.
func (m *createMachine) tags() map[string]string {
	md := map[string]string{}
	for k, v := range m.req.Tags {
		md[k] = v
	}
	md[TagAttempt] = strconv.Itoa(m.req.Attempt)
	if id := m.p.cfg.NodepoolID; id != "" {
		md[TagNodepoolID] = id
	}
	return md
}

// ours reports whether metadata marks a server or volume as this node's
// attempt.
func (m *createMachine) ours(md map[string]string) bool {
	return md[drivers.TagNode] == m.req.NodeID && md[drivers.TagProvider] == m.p.cfg.Name && md[TagAttempt] == strconv.Itoa(m.req.Attempt)
}

// dropOldVolumes deletes the unattached volumes that earlier attempts of
// this node left (their servers, which would have taken them along, never
// got made).
func (m *createMachine) dropOldVolumes(ctx context.Context, cl *clients) error {
	if cl.volume == nil {
		return errors.New("the cloud has no block storage service; boot-from-volume needs one")
	}
	vs, err := m.p.listVolumes(ctx, cl)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if v.Metadata[drivers.TagNode] != m.req.NodeID || v.Metadata[TagAttempt] == strconv.Itoa(m.req.Attempt) || len(v.Attachments) > 0 {
			continue
		}
		if err := volumes.Delete(ctx, cl.volume, v.ID, nil).ExtractErr(); err != nil && !notFound(classify(err)) {
			m.p.log.Warn("could not delete the volume of an earlier attempt; cleanup will", "node", m.req.NodeID, "volume", v.ID, "err", classify(err))
		}
	}
	return nil
}

// imageRef is the image a label boots from: the upload of its diskimage,
// or its cloud image.
func (m *createMachine) imageRef(ctx context.Context, cl *clients, pl *config.PoolLabel) (string, error) {
	if pl.Diskimage != "" {
		if m.req.ImageID == "" {
			return "", fmt.Errorf("label %s boots from diskimage %s, which has no ready upload in provider %s", pl.Name, pl.Diskimage, m.p.cfg.Name)
		}
		return m.req.ImageID, nil
	}
	ci, ok := m.p.cfg.OpenStackCloudImage(pl.CloudImage)
	if !ok {
		return "", fmt.Errorf("label %s: cloud image %q is not in the provider's cloud-images", pl.Name, pl.CloudImage)
	}
	switch {
	case ci.ImageName != "":
		return m.p.resolve(ctx, "image-name", ci.ImageName, m.p.findImageByName(cl))
	case ci.ImageID != "":
		return ci.ImageID, nil
	}
	return m.p.resolve(ctx, "image", ci.Name, m.p.findImage(cl))
}

func (m *createMachine) createVolume(ctx context.Context, cl *clients, pl *config.PoolLabel) (drivers.Step, error) {
	if m.mayExist {
		vs, err := m.p.listVolumes(ctx, cl)
		if err != nil {
			return drivers.Step{}, err
		}
		for _, v := range vs {
			if m.ours(v.Metadata) {
				m.st.Volume, m.st.Step, m.mayExist = v.ID, stepVolumeWait, false
				return drivers.Step{}, nil
			}
		}
	}
	image, err := m.imageRef(ctx, cl, pl)
	if err != nil {
		return drivers.Step{}, err
	}
	m.mayExist = true // until the answer says what became of it
	v, err := volumes.Create(ctx, cl.volume, volumes.CreateOpts{
		Size: pl.VolumeSize, Name: m.req.Hostname, ImageID: image, AvailabilityZone: m.st.AZ, Metadata: m.tags(),
		Description: "boot volume of nodepool node " + m.req.NodeID,
	}, nil).Extract()
	if err != nil {
		err = classify(err)
		if statusIs(err, 400) {
			m.mayExist = false
		}
		return drivers.Step{}, wrapf(err, "creating the boot volume")
	}
	m.st.Volume, m.st.Step, m.mayExist = v.ID, stepVolumeWait, false
	return drivers.Step{Wait: pollInterval}, nil
}

func (m *createMachine) createServer(ctx context.Context, cl *clients, pool *config.Pool, pl *config.PoolLabel) (drivers.Step, error) {
	p := m.p
	if m.mayExist {
		found, err := m.findServer(ctx)
		if err != nil || found {
			return drivers.Step{}, err
		}
	}
	opts, err := m.serverOpts(ctx, cl, pool, pl)
	if err != nil {
		return drivers.Step{}, err
	}
	m.mayExist = true // until the answer says what became of it
	s, err := servers.Create(ctx, cl.compute, keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: pl.KeyName}, nil).Extract()
	if err != nil {
		err = classify(err)
		if refused(err) {
			m.mayExist = false // refused: nothing was made
		}
		if errors.Is(err, drivers.ErrNotFound) {
			// The image or network went away: look it up again next time.
			p.forgetLookups(pool, pl)
		}
		return drivers.Step{}, wrapf(err, "creating server %s", m.req.Hostname)
	}
	m.st.Server, m.st.Step, m.mayExist = s.ID, stepBoot, false
	return drivers.Step{}, nil
}

// findServer looks for a server of this attempt that an earlier create
// call made (one not in ERROR nor being deleted), and goes on to wait for
// its boot if there is one.
func (m *createMachine) findServer(ctx context.Context) (bool, error) {
	all, err := m.p.watch.snapshot(ctx, 0)
	if err != nil {
		return false, err
	}
	for _, s := range all {
		if m.ours(s.Metadata) && s.Status != "ERROR" && s.TaskState != "deleting" {
			m.st.Server, m.st.Step, m.mayExist = s.ID, stepBoot, false
			return true, nil
		}
	}
	return false, nil
}

// serverOpts is the create call of the node's server: its flavor, its
// boot volume or image, networks, user data, config drive and metadata.
func (m *createMachine) serverOpts(ctx context.Context, cl *clients, pool *config.Pool, pl *config.PoolLabel) (servers.CreateOpts, error) {
	flavor, err := m.p.flavorFor(ctx, cl, pl)
	if err != nil {
		return servers.CreateOpts{}, err
	}
	opts := servers.CreateOpts{
		Name: m.req.Hostname, FlavorRef: flavor.ID, AvailabilityZone: m.st.AZ,
		SecurityGroups: pool.SecurityGroups, Metadata: m.tags(), Networks: "auto",
	}
	if pl.BootFromVolume {
		opts.BlockDevice = []servers.BlockDevice{{BootIndex: 0, UUID: m.st.Volume, SourceType: servers.SourceVolume,
			DestinationType: servers.DestinationVolume, DeleteOnTermination: true}}
	} else if opts.ImageRef, err = m.imageRef(ctx, cl, pl); err != nil {
		return servers.CreateOpts{}, err
	}
	if nets := pool.LabelNetworks(pl); len(nets) > 0 {
		if opts.Networks, err = m.p.serverNetworks(ctx, cl, nets); err != nil {
			return servers.CreateOpts{}, err
		}
	}
	if pl.Userdata != "" {
		opts.UserData = []byte(pl.Userdata)
	}
	opts.ConfigDrive = m.configDrive(pl)
	if err := m.addProperties(opts.Metadata, pl); err != nil {
		return servers.CreateOpts{}, err
	}
	return opts, nil
}

// serverNetworks are the networks a server is put on, looked up by name.
func (p *Provider) serverNetworks(ctx context.Context, cl *clients, nets []string) ([]servers.Network, error) {
	var list []servers.Network
	for _, n := range nets {
		id, err := p.resolve(ctx, "network", n, p.findNetwork(cl))
		if err != nil {
			return nil, err
		}
		list = append(list, servers.Network{UUID: id})
	}
	return list, nil
}

// addProperties adds the label's instance-properties and its
// dynamic-instance-properties, filled from the request, to a server's
// metadata.
func (m *createMachine) addProperties(md map[string]string, pl *config.PoolLabel) error {
	for k, v := range pl.InstanceProperties {
		md[k] = v
	}
	for k, tmpl := range pl.DynamicInstanceProperties {
		v, err := config.ExpandRequestTemplate(tmpl, m.requestField)
		if err != nil {
			return fmt.Errorf("label %s: dynamic-instance-properties %s: %w", pl.Name, k, err)
		}
		md[k] = v
	}
	return nil
}

// forgetLookups forgets the label's image and networks as looked up, so
// that the next create looks them up again.
func (p *Provider) forgetLookups(pool *config.Pool, pl *config.PoolLabel) {
	if ci, ok := p.cfg.OpenStackCloudImage(pl.CloudImage); ok {
		p.forget("image-name", ci.ImageName)
		p.forget("image", ci.Name)
	}
	for _, n := range pool.LabelNetworks(pl) {
		p.forget("network", n)
	}
}

// configDrive is the config-drive of the label's image (nil: the cloud's
// default).
func (m *createMachine) configDrive(pl *config.PoolLabel) *bool {
	if pl.Diskimage != "" {
		if pd, ok := m.p.cfg.Diskimage(pl.Diskimage); ok {
			return pd.ConfigDrive
		}
		return nil
	}
	if ci, ok := m.p.cfg.OpenStackCloudImage(pl.CloudImage); ok {
		return ci.ConfigDrive
	}
	return nil
}

// requestField gives dynamic-instance-properties the request's fields.
func (m *createMachine) requestField(field, key string) (string, bool) {
	return m.req.Request.Field(field, key)
}

// boot waits for the server to leave BUILD. A server that went to ERROR
// for want of capacity or quota is deleted and the create starts over
// (the launcher waits before the next try; it is not a failed attempt);
// any other ERROR fails the attempt.
func (m *createMachine) boot(ctx context.Context, cl *clients, pool *config.Pool) (drivers.Step, error) {
	p := m.p
	s, ok, err := p.watch.get(ctx, m.st.Server, time.Now())
	if err != nil {
		return drivers.Step{}, err
	}
	if !ok {
		// Deleted (by a process that failed this attempt and died before
		// recording it, or by hand): this attempt is over.
		return drivers.Step{}, fmt.Errorf("%w: server %s vanished while booting", drivers.ErrNotFound, m.st.Server)
	}
	switch s.Status {
	case "ACTIVE":
	case "ERROR":
		err := faultError(s.ID, s.Fault.Message)
		if errors.Is(err, drivers.ErrCapacity) || errors.Is(err, drivers.ErrQuotaExceeded) {
			if derr := servers.Delete(ctx, cl.compute, s.ID).ExtractErr(); derr != nil && !notFound(classify(derr)) {
				return drivers.Step{}, wrapf(derr, "deleting server %s that went to ERROR", s.ID)
			}
			m.st = createState{}
		}
		return drivers.Step{}, err
	default:
		if s.TaskState == "deleting" {
			return drivers.Step{}, fmt.Errorf("server %s is being deleted", s.ID)
		}
		return drivers.Step{}, nil
	}
	m.server = &s
	if err := p.loadExternalNames(ctx, cl); err != nil {
		return drivers.Step{}, err
	}
	inst := p.toInstance(&s)
	m.st.Step = stepScan
	if pool.AutoFloatingIPs() && inst.PublicIPv4 == "" && inst.PublicIPv6 == "" {
		m.st.Step = stepFloatingIP
	}
	return drivers.Step{}, nil
}

// attachFloatingIP gives the server a floating IP on its first port (one
// call: the floating IP is created on the port).
func (m *createMachine) attachFloatingIP(ctx context.Context, cl *clients) (drivers.Step, error) {
	p := m.p
	pages, err := ports.List(cl.network, ports.ListOpts{DeviceID: m.st.Server}).AllPages(ctx)
	if err != nil {
		return drivers.Step{}, wrapf(err, "listing the ports of server %s", m.st.Server)
	}
	pl, err := ports.ExtractPorts(pages)
	if err != nil {
		return drivers.Step{}, err
	}
	if len(pl) == 0 {
		return drivers.Step{}, fmt.Errorf("server %s has no port to attach a floating IP to", m.st.Server)
	}
	port := pl[0]
	if m.mayExist || m.st.FIP != "" {
		fp, err := floatingips.List(cl.network, floatingips.ListOpts{PortID: port.ID}).AllPages(ctx)
		if err != nil {
			return drivers.Step{}, wrapf(err, "listing floating IPs")
		}
		if fl, _ := floatingips.ExtractFloatingIPs(fp); len(fl) > 0 {
			m.st.FIP, m.st.PublicIP, m.st.Step, m.mayExist = fl[0].ID, fl[0].FloatingIP, stepScan, false
			return drivers.Step{}, nil
		}
	}
	ext, err := p.resolve(ctx, "external-network", "", p.findExternalNetwork(cl))
	if err != nil {
		return drivers.Step{}, err
	}
	m.mayExist = true
	f, err := floatingips.Create(ctx, cl.network, floatingips.CreateOpts{FloatingNetworkID: ext, PortID: port.ID,
		Description: fmt.Sprintf("nodepool node %s (provider %s)", m.req.NodeID, p.cfg.Name)}).Extract()
	if err != nil {
		err = classify(err)
		if statusIs(err, 400) || errors.Is(err, drivers.ErrQuotaExceeded) {
			m.mayExist = false
		}
		return drivers.Step{}, wrapf(err, "creating a floating IP for server %s", m.st.Server)
	}
	m.st.FIP, m.st.PublicIP, m.st.Step, m.mayExist = f.ID, f.FloatingIP, stepScan, false
	return drivers.Step{}, nil
}

// connection is how a label's nodes are reached and who logs in: from its
// cloud image, or (connection-type and -port only; the launcher takes the
// rest from the upload) from the provider's entry for its diskimage.
func (p *Provider) connection(pl *config.PoolLabel) (username, pythonPath, shellType, connType string, port int) {
	if pl.Diskimage != "" {
		connType, port = config.DefaultCloudImageConnectionType, config.DefaultCloudImageSSHPort
		if pd, ok := p.cfg.Diskimage(pl.Diskimage); ok {
			connType, port = pd.ConnectionType, pd.ConnectionPort
		}
		return "", "", "", connType, port
	}
	if ci, ok := p.cfg.OpenStackCloudImage(pl.CloudImage); ok {
		return ci.Username, ci.PythonPath, ci.ShellType, ci.ConnectionType, ci.ConnectionPort
	}
	return config.DefaultCloudImageUsername, config.DefaultPythonPath, "", config.DefaultCloudImageConnectionType, config.DefaultCloudImageSSHPort
}

// scan gathers the node's SSH host keys (unless host-key-checking is off
// or the node does not speak SSH), trying again until the launcher's
// boot-timeout ends the attempt; then the node is ready.
func (m *createMachine) scan(ctx context.Context, pool *config.Pool, pl *config.PoolLabel) (drivers.Step, error) {
	p := m.p
	if m.server == nil {
		s, ok, err := p.watch.get(ctx, m.st.Server, time.Now())
		if err != nil {
			return drivers.Step{}, err
		}
		if !ok {
			return drivers.Step{}, fmt.Errorf("%w: server %s vanished while booting", drivers.ErrNotFound, m.st.Server)
		}
		m.server = &s
	}
	inst := p.toInstance(m.server)
	if m.st.PublicIP != "" {
		inst.PublicIPv4, inst.InterfaceIP = m.st.PublicIP, m.st.PublicIP
	}
	// A cloud image's settings go on the instance; a diskimage's the
	// launcher takes from its upload and the provider's entry for it.
	_, _, _, connType, connPort := p.connection(pl)
	if pl.Diskimage != "" {
		inst.ImageID = m.req.ImageID
	} else {
		inst.Username, inst.PythonPath, inst.ShellType, inst.ConnectionType, inst.ConnectionPort = p.connection(pl)
	}
	if pl.BootFromVolume {
		inst.Resources.Other = volumeResources(pl.VolumeSize)
	}
	inst.HostKeys = []string{}
	if pool.ChecksLabelHostKeys(pl) && (connType == "ssh" || connType == "network_cli") {
		if inst.InterfaceIP == "" {
			return drivers.Step{}, fmt.Errorf("server %s has no address to reach it at", m.st.Server)
		}
		addr := net.JoinHostPort(inst.InterfaceIP, strconv.Itoa(connPort))
		keys, err := hostkeys.Scan(ctx, addr, scanTimeout)
		if err != nil {
			if ctx.Err() != nil {
				return drivers.Step{}, ctx.Err()
			}
			p.log.Debug("host-key scan failed; trying again", "node", m.req.NodeID, "addr", addr, "err", err)
			p.scanErrs.Store(m.st.Server, fmt.Sprintf("host-key scan of %s: %v", addr, err))
			return drivers.Step{Wait: time.Second}, nil
		}
		inst.HostKeys = keys
		p.scanErrs.Delete(m.st.Server)
	}
	return drivers.Step{Done: true, Instance: &inst}, nil
}
