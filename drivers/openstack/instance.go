package openstack

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"github.com/nodepool-nats/nodepool/drivers"
)

// toInstance is a server as the launcher sees it.
func (p *Provider) toInstance(s *server) drivers.Instance {
	inst := drivers.Instance{
		ExternalID: s.ID, Name: s.Name, Tags: s.Metadata, AZ: s.AZ, Region: p.region(),
		Resources: drivers.Resources{Instances: 1}, ImageID: s.imageID(),
	}
	inst.Run, inst.Status = runState(s)
	if inst.Tags == nil {
		inst.Tags = map[string]string{}
	}
	if id := p.cfg.NodepoolID; id != "" && inst.Tags[drivers.TagProvider] == p.cfg.Name && inst.Tags[TagNodepoolID] != id {
		// Another nodepool's server under the same provider name: not ours.
		tags := make(map[string]string, len(inst.Tags))
		for k, v := range inst.Tags {
			if k != drivers.TagProvider {
				tags[k] = v
			}
		}
		inst.Tags = tags
	}
	inst.Resources.Cores, inst.Resources.RAM = p.serverSize(s)
	p.setAddresses(&inst, s)
	return inst
}

// runState is whether a server runs, by its status (and task state), and
// the status to quote. ACTIVE runs, unless it is being deleted; statuses
// on the way to ACTIVE or back (BUILD, REBUILD, REBOOT, HARD_REBOOT,
// RESIZE, VERIFY_RESIZE, REVERT_RESIZE, MIGRATING, PASSWORD) are
// changing; SHUTOFF, ERROR, PAUSED, SUSPENDED, SHELVED(_OFFLOADED),
// RESCUE, SOFT_DELETED, DELETED and UNKNOWN (its compute host does not
// answer) are down. A status Nova may add later is unknown: nothing is
// judged by it.
func runState(s *server) (drivers.RunState, string) {
	switch s.Status {
	case "ACTIVE":
		if s.TaskState == "deleting" {
			return drivers.Down, "ACTIVE (task deleting)"
		}
		return drivers.Running, s.Status
	case "BUILD", "REBUILD", "REBOOT", "HARD_REBOOT", "RESIZE", "VERIFY_RESIZE", "REVERT_RESIZE", "MIGRATING", "PASSWORD":
		return drivers.Changing, s.Status
	case "SHUTOFF", "ERROR", "PAUSED", "SUSPENDED", "SHELVED", "SHELVED_OFFLOADED", "RESCUE", "SOFT_DELETED", "DELETED", "UNKNOWN":
		return drivers.Down, s.Status
	}
	return drivers.RunUnknown, s.Status
}

// serverSize is the cores and RAM of a server's flavor: embedded in the
// server (microversion 2.47 and later), or looked up by the flavor's id.
func (p *Provider) serverSize(s *server) (int, int) {
	if s.Flavor.ID == "" {
		return s.Flavor.VCPUs, s.Flavor.RAM
	}
	p.catMu.Lock()
	defer p.catMu.Unlock()
	for _, f := range p.flavors {
		if f.ID == s.Flavor.ID {
			return f.VCPUs, f.RAM
		}
	}
	return 0, 0
}

func (p *Provider) region() string {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.cl != nil && p.cl.region != "" {
		return p.cl.region
	}
	return p.cfg.Region
}

// setAddresses reads a server's addresses as openstacksdk does: floating
// IPs and fixed IPs on external networks are public, other fixed IPv4
// addresses private, global IPv6 addresses public; the interface IP is
// the public IPv4, else the public IPv6, else the private IPv4.
func (p *Provider) setAddresses(inst *drivers.Instance, s *server) {
	external := p.externalNames()
	nets := make([]string, 0, len(s.Addresses))
	for n := range s.Addresses {
		nets = append(nets, n)
	}
	slices.Sort(nets)
	for _, net := range nets {
		for _, a := range s.Addresses[net] {
			setAddress(inst, a.Addr, a.Type == "floating" || external[net])
		}
	}
	inst.InterfaceIP = cmp.Or(inst.PublicIPv4, inst.PublicIPv6, inst.PrivateIPv4)
}

// setAddress records an address of a server, unless it is not an IP
// address or one of its kind is recorded already: an IPv4 address is the
// public one if public (a floating IP, or on an external network), else
// the private one; a global IPv6 address is the public one.
func setAddress(inst *drivers.Instance, addr string, public bool) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return
	}
	var field *string
	switch {
	case ip.Is4() && public:
		field = &inst.PublicIPv4
	case ip.Is4():
		field = &inst.PrivateIPv4
	case ip.Is6() && ip.IsGlobalUnicast():
		field = &inst.PublicIPv6
	default:
		return
	}
	if *field == "" {
		*field = addr
	}
}

// externalNames are the names of the cloud's external networks, as last
// read (none before the first create).
func (p *Provider) externalNames() map[string]bool {
	p.catMu.Lock()
	defer p.catMu.Unlock()
	return p.external
}

// loadExternalNames reads which networks are external, for telling public
// addresses from private ones.
func (p *Provider) loadExternalNames(ctx context.Context, cl *clients) error {
	p.catMu.Lock()
	fresh := p.external != nil && time.Since(p.externalAt) < catalogTTL
	p.catMu.Unlock()
	if fresh {
		return nil
	}
	return p.lookups.do(ctx, "external-networks", func() error {
		pages, err := networks.List(cl.network, networks.ListOpts{}).AllPages(ctx)
		if err != nil {
			return wrapf(err, "listing networks")
		}
		var all []struct {
			Name     string `json:"name"`
			External bool   `json:"router:external"`
		}
		if err := networks.ExtractNetworksInto(pages, &all); err != nil {
			return fmt.Errorf("reading networks: %w", err)
		}
		ext := map[string]bool{}
		for _, n := range all {
			if n.External {
				ext[n.Name] = true
			}
		}
		p.catMu.Lock()
		p.external, p.externalAt = ext, time.Now()
		p.catMu.Unlock()
		return nil
	})
}
