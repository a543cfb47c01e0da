package openstack

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Steps of a delete.
const (
	delInspect = ""         // find the server's floating IPs and volumes
	delRelease = "release"  // delete its floating IPs
	delServer  = "delete"   // delete the server
	delWait    = "wait"     // until it is gone
	delVolumes = "volumes"  // delete its volumes that are left
	delDone    = "finished" // nothing left
)

// deleteState is a delete's progress, as stored in driver_data.
type deleteState struct {
	Step        string   `json:"step,omitempty"`
	Server      string   `json:"server"`
	FloatingIPs []string `json:"floating_ips,omitempty"`
	Volumes     []string `json:"volumes,omitempty"`
}

type deleteMachine struct {
	p  *Provider
	st deleteState
}

// Delete returns a machine that deletes a server with its floating IPs
// and volumes, and waits until they are gone.
func (p *Provider) Delete(externalID string, state json.RawMessage) (drivers.StateMachine, error) {
	m := &deleteMachine{p: p, st: deleteState{Server: externalID}}
	if len(state) > 0 && string(state) != "null" {
		var st deleteState
		if err := json.Unmarshal(state, &st); err != nil {
			return nil, fmt.Errorf("openstack: resuming the delete of %s: %w", externalID, err)
		}
		// Only a delete's own state resumes it (a node's driver_data may
		// still hold its create's).
		if st.Server == externalID {
			m.st = st
		}
	}
	return m, nil
}

func (m *deleteMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *deleteMachine) ExternalID() string { return m.st.Server }

// Advance makes the machine's next step.
func (m *deleteMachine) Advance(ctx context.Context) (drivers.Step, error) {
	cl, err := m.p.client(ctx)
	if err != nil {
		return drivers.Step{}, err
	}
	switch m.st.Step {
	case delInspect:
		return m.inspect(ctx, cl)
	case delRelease:
		return m.releaseFloatingIPs(ctx, cl)
	case delServer:
		return m.deleteServer(ctx, cl)
	case delWait:
		return m.waitGone(ctx)
	case delVolumes:
		return m.deleteVolumes(ctx, cl)
	case delDone:
		return drivers.Step{Done: true}, nil
	}
	return drivers.Step{}, fmt.Errorf("openstack: unknown delete step %q", m.st.Step)
}

// inspect records the server's volumes and floating IPs; a server that is
// gone ends the delete.
func (m *deleteMachine) inspect(ctx context.Context, cl *clients) (drivers.Step, error) {
	s, err := servers.Get(ctx, cl.compute, m.st.Server).Extract()
	if err != nil {
		if err = classify(err); notFound(err) {
			m.st.Step = delDone
			return drivers.Step{Done: true}, nil
		}
		return drivers.Step{}, wrapf(err, "reading server %s", m.st.Server)
	}
	for _, v := range s.AttachedVolumes {
		m.st.Volumes = append(m.st.Volumes, v.ID)
	}
	m.st.Step = delRelease
	if !m.p.createsFloatingIPs() && !hasFloatingIP(s.Addresses) {
		// Nodepool made no floating IP for it: no need to look.
		return drivers.Step{}, nil
	}
	return drivers.Step{}, m.findFloatingIPs(ctx, cl, s.ID)
}

// findFloatingIPs records the floating IPs on the ports of a server.
func (m *deleteMachine) findFloatingIPs(ctx context.Context, cl *clients, serverID string) error {
	pages, err := ports.List(cl.network, ports.ListOpts{DeviceID: serverID}).AllPages(ctx)
	if err != nil {
		return wrapf(err, "listing the ports of server %s", serverID)
	}
	pl, err := ports.ExtractPorts(pages)
	if err != nil {
		return err
	}
	for _, port := range pl {
		fp, err := floatingips.List(cl.network, floatingips.ListOpts{PortID: port.ID}).AllPages(ctx)
		if err != nil {
			return wrapf(err, "listing floating IPs")
		}
		fl, err := floatingips.ExtractFloatingIPs(fp)
		if err != nil {
			return err
		}
		for _, f := range fl {
			m.st.FloatingIPs = append(m.st.FloatingIPs, f.ID)
		}
	}
	return nil
}

// releaseFloatingIPs deletes the recorded floating IPs, one by one.
func (m *deleteMachine) releaseFloatingIPs(ctx context.Context, cl *clients) (drivers.Step, error) {
	for len(m.st.FloatingIPs) > 0 {
		id := m.st.FloatingIPs[0]
		if err := floatingips.Delete(ctx, cl.network, id).ExtractErr(); err != nil && !notFound(classify(err)) {
			return drivers.Step{}, wrapf(err, "deleting floating IP %s", id)
		}
		m.st.FloatingIPs = m.st.FloatingIPs[1:]
	}
	m.st.Step = delServer
	return drivers.Step{}, nil
}

// deleteServer asks Nova to delete the server.
func (m *deleteMachine) deleteServer(ctx context.Context, cl *clients) (drivers.Step, error) {
	if err := servers.Delete(ctx, cl.compute, m.st.Server).ExtractErr(); err != nil && !notFound(classify(err)) {
		return drivers.Step{}, wrapf(err, "deleting server %s", m.st.Server)
	}
	m.st.Step = delWait
	return drivers.Step{}, nil
}

// waitGone waits until the server is gone, and asks again for a delete
// that did not take.
func (m *deleteMachine) waitGone(ctx context.Context) (drivers.Step, error) {
	p := m.p
	s, ok, err := p.watch.get(ctx, m.st.Server, time.Now())
	if err != nil {
		return drivers.Step{}, err
	}
	if ok && s.TaskState != "deleting" && s.Status != "DELETED" && s.Status != "SOFT_DELETED" {
		// A delete that did not take (the server was busy): ask again.
		m.st.Step = delServer
		return drivers.Step{Wait: time.Second}, nil
	}
	if ok {
		return drivers.Step{}, nil
	}
	p.scanErrs.Delete(m.st.Server)
	m.st.Step = delVolumes
	return drivers.Step{}, nil
}

// deleteVolumes deletes the server's volumes that are left, one by one.
func (m *deleteMachine) deleteVolumes(ctx context.Context, cl *clients) (drivers.Step, error) {
	for len(m.st.Volumes) > 0 {
		id := m.st.Volumes[0]
		wait, err := deleteVolume(ctx, cl, id)
		if err != nil {
			return drivers.Step{}, err
		}
		if wait {
			return drivers.Step{Wait: pollInterval}, nil
		}
		m.st.Volumes = slices.Delete(m.st.Volumes, 0, 1)
	}
	m.st.Step = delDone
	return drivers.Step{Done: true}, nil
}

// deleteVolume deletes a volume unless it is gone; wait says it is still
// attached or being deleted (Nova takes delete-on-termination volumes
// along with their server, a moment after it).
func deleteVolume(ctx context.Context, cl *clients, id string) (wait bool, err error) {
	v, err := volumes.Get(ctx, cl.volume, id).Extract()
	if err != nil {
		if err = classify(err); notFound(err) {
			return false, nil
		}
		return false, wrapf(err, "reading volume %s", id)
	}
	switch v.Status {
	case "deleting", "detaching", "in-use", "attaching", "creating":
		return true, nil
	}
	if err := volumes.Delete(ctx, cl.volume, id, nil).ExtractErr(); err != nil {
		if err = classify(err); notFound(err) {
			return false, nil
		}
		if statusIs(err, 400) {
			return true, nil // not deletable yet (still attached)
		}
		return false, wrapf(err, "deleting volume %s", id)
	}
	return true, nil
}

// createsFloatingIPs reports whether a pool of the provider gives its
// nodes floating IPs.
func (p *Provider) createsFloatingIPs() bool {
	for i := range p.cfg.Pools {
		if p.cfg.Pools[i].AutoFloatingIPs() {
			return true
		}
	}
	return false
}

// hasFloatingIP reports whether a server's addresses show a floating one.
func hasFloatingIP(addresses map[string]any) bool {
	for _, list := range addresses {
		items, _ := list.([]any)
		for _, item := range items {
			if a, _ := item.(map[string]any); a["OS-EXT-IPS:type"] == "floating" {
				return true
			}
		}
	}
	return false
}
