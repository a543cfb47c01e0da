package openstack

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/nodepool-nats/nodepool/drivers"
)

// sweepState is what the cleanup sweeps remember between runs: what they
// saw once and delete when they see it again, and since when ports have
// been DOWN.
type sweepState struct {
	mu       sync.Mutex
	fips     map[string]bool
	volumes  map[string]bool
	downFrom map[string]time.Time
}

// Sweep deletes what the project's servers left behind, as Nodepool's
// OpenStack driver does: floating IPs attached to nothing
// (clean-floating-ips: nodepool takes the project for its own), ports that
// stay DOWN for port-cleanup-interval (compute ports or ports of no
// device), and volumes tagged as this provider's that are attached to
// nothing and whose node has no record. Floating IPs and volumes are
// deleted on their second sighting, so that one a create is about to use
// is not taken from it.
func (p *Provider) Sweep(ctx context.Context, known func(nodeID string) bool) error {
	cl, err := p.client(ctx)
	if err != nil {
		return err
	}
	s := &p.sweep
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if p.cfg.CleansFloatingIPs() {
		errs = append(errs, p.sweepFloatingIPs(ctx, cl, s))
	}
	if p.cfg.PortCleanupInterval > 0 {
		errs = append(errs, p.sweepPorts(ctx, cl, s))
	}
	if cl.volume != nil {
		errs = append(errs, p.sweepVolumes(ctx, cl, s, known))
	}
	return errors.Join(errs...)
}

func (p *Provider) sweepFloatingIPs(ctx context.Context, cl *clients, s *sweepState) error {
	pages, err := floatingips.List(cl.network, floatingips.ListOpts{}).AllPages(ctx)
	if err != nil {
		return wrapf(err, "listing floating IPs")
	}
	all, err := floatingips.ExtractFloatingIPs(pages)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, f := range all {
		if f.PortID != "" {
			continue
		}
		seen[f.ID] = true
		if !s.fips[f.ID] {
			continue
		}
		if err := floatingips.Delete(ctx, cl.network, f.ID).ExtractErr(); err != nil && !notFound(classify(err)) {
			p.log.Warn("could not delete an unattached floating IP", "floating_ip", f.FloatingIP, "err", classify(err))
			continue
		}
		p.log.Info("deleted an unattached floating IP", "floating_ip", f.FloatingIP, "id", f.ID)
		delete(seen, f.ID)
	}
	s.fips = seen
	return nil
}

func (p *Provider) sweepPorts(ctx context.Context, cl *clients, s *sweepState) error {
	pages, err := ports.List(cl.network, ports.ListOpts{Status: "DOWN"}).AllPages(ctx)
	if err != nil {
		return wrapf(err, "listing ports")
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil {
		return err
	}
	now := time.Now()
	down := map[string]time.Time{}
	for _, port := range all {
		// Router and DHCP ports are not ours to touch.
		if port.Status != "DOWN" || (port.DeviceOwner != "" && !strings.HasPrefix(port.DeviceOwner, "compute:")) {
			continue
		}
		since, ok := s.downFrom[port.ID]
		if !ok {
			since = now
		}
		down[port.ID] = since
		if now.Sub(since) < p.cfg.PortCleanupInterval.D() {
			continue
		}
		if err := ports.Delete(ctx, cl.network, port.ID).ExtractErr(); err != nil && !notFound(classify(err)) {
			p.log.Warn("could not delete a DOWN port", "port", port.ID, "err", classify(err))
			continue
		}
		p.log.Info("deleted a port DOWN for longer than port-cleanup-interval", "port", port.ID, "device_owner", port.DeviceOwner)
		delete(down, port.ID)
	}
	s.downFrom = down
	return nil
}

func (p *Provider) sweepVolumes(ctx context.Context, cl *clients, s *sweepState, known func(string) bool) error {
	vs, err := p.listVolumes(ctx, cl)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, v := range vs {
		node := v.Metadata[drivers.TagNode]
		if len(v.Attachments) > 0 || known(node) || (v.Status != "available" && v.Status != "error") {
			continue
		}
		if id := p.cfg.NodepoolID; id != "" && v.Metadata[TagNodepoolID] != id {
			continue
		}
		seen[v.ID] = true
		if !s.volumes[v.ID] {
			continue
		}
		wait, err := deleteVolume(ctx, cl, v.ID)
		if err != nil {
			p.log.Warn("could not delete a leaked volume", "volume", v.ID, "err", err)
			continue
		}
		if !wait {
			continue
		}
		p.log.Info("deleted a leaked volume", "volume", v.ID, "node", node)
		delete(seen, v.ID)
	}
	s.volumes = seen
	return nil
}

// Diagnose says more about a failed launch attempt: the last host-key
// scan's error and, for labels with console-log, the server's console log
// (its last lines).
func (p *Provider) Diagnose(ctx context.Context, req drivers.CreateRequest, externalID string) string {
	var parts []string
	if v, ok := p.scanErrs.Load(externalID); ok {
		parts = append(parts, v.(string))
	}
	if _, pl, err := p.cfg.PoolLabel(req.Pool, req.Label); err == nil && pl.ConsoleLog {
		if log, err := p.consoleLog(ctx, externalID); err != nil {
			parts = append(parts, "console log of server "+externalID+" unavailable: "+err.Error())
		} else {
			parts = append(parts, "console log of server "+externalID+":\n"+log)
		}
	}
	return strings.Join(parts, "\n")
}

// consoleLines is how much of a console log a node's reason keeps.
const consoleLines = 50

func (p *Provider) consoleLog(ctx context.Context, id string) (string, error) {
	cl, err := p.client(ctx)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := servers.ShowConsoleOutput(ctx, cl.compute, id, servers.ShowConsoleOutputOpts{Length: consoleLines}).Extract()
	if err != nil {
		return "", classify(err)
	}
	if len(out) > 8192 {
		out = out[len(out)-8192:]
	}
	return strings.TrimRight(out, "\n"), nil
}
