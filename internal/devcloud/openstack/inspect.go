package openstack

import (
	"slices"
	"strings"
	"time"
)

// ServerInfo is a server as the cloud holds it, for tests and the dev
// cloud's status line.
type ServerInfo struct {
	ID, Name, Status string
	AZ               string
	Flavor           string
	ImageID          string
	KeyName          string
	UserData         string
	ConfigDrive      bool
	Fault            string
	Deleting         bool
	Metadata         map[string]string
	SecurityGroups   []string
	Networks         []string // names, in port order
	Volumes          []string
	Created          time.Time
	// Launched is when it went ACTIVE (zero before).
	Launched time.Time
}

// Servers lists the servers that are not deleted, oldest first.
func (c *Cloud) Servers() []ServerInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(time.Now().UTC())
	var out []ServerInfo
	for _, s := range c.st.servers {
		if !s.live() {
			continue
		}
		si := ServerInfo{ID: s.id, Name: s.name, Status: s.status, AZ: s.az, Flavor: s.flavor.Name, ImageID: s.imageID,
			KeyName: s.keyName, UserData: s.userData, ConfigDrive: s.configDrive, Deleting: s.taskState == "deleting",
			Metadata: map[string]string{}, SecurityGroups: slices.Clone(s.secGroups), Created: s.created, Launched: s.launchedAt}
		if s.status == "ERROR" {
			si.Fault = s.fault
		}
		for k, v := range s.metadata {
			si.Metadata[k] = v
		}
		for _, pid := range s.ports {
			if p := c.st.ports[pid]; p != nil {
				if n := c.st.networks[p.networkID]; n != nil {
					si.Networks = append(si.Networks, n.name)
				}
			}
		}
		for _, a := range s.volumes {
			si.Volumes = append(si.Volumes, a.volumeID)
		}
		out = append(out, si)
	}
	slices.SortFunc(out, func(a, b ServerInfo) int { return a.Created.Compare(b.Created) })
	return out
}

// VolumeInfo is a volume as the cloud holds it.
type VolumeInfo struct {
	ID, Name, Status string
	Size             int
	Server           string
	Metadata         map[string]string
}

// Volumes lists the volumes.
func (c *Cloud) Volumes() []VolumeInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(time.Now().UTC())
	var out []VolumeInfo
	for _, v := range c.st.volumes {
		vi := VolumeInfo{ID: v.id, Name: v.name, Status: v.status, Size: v.size, Server: v.serverID, Metadata: map[string]string{}}
		for k, val := range v.metadata {
			vi.Metadata[k] = val
		}
		out = append(out, vi)
	}
	slices.SortFunc(out, func(a, b VolumeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// FloatingIPInfo is a floating IP as the cloud holds it.
type FloatingIPInfo struct {
	ID, Address, PortID, Description string
}

// FloatingIPs lists the floating IPs.
func (c *Cloud) FloatingIPs() []FloatingIPInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(time.Now().UTC())
	var out []FloatingIPInfo
	for _, f := range c.st.fips {
		out = append(out, FloatingIPInfo{ID: f.id, Address: f.address, PortID: f.portID, Description: f.description})
	}
	slices.SortFunc(out, func(a, b FloatingIPInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// PortInfo is a port as the cloud holds it.
type PortInfo struct {
	ID, Network, Status, DeviceID, DeviceOwner string
}

// Ports lists the ports.
func (c *Cloud) Ports() []PortInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(time.Now().UTC())
	var out []PortInfo
	for _, p := range c.st.ports {
		pi := PortInfo{ID: p.id, Status: p.status, DeviceID: p.deviceID, DeviceOwner: p.deviceOwner}
		if n := c.st.networks[p.networkID]; n != nil {
			pi.Network = n.name
		}
		out = append(out, pi)
	}
	slices.SortFunc(out, func(a, b PortInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// ImageInfo is an image as the cloud holds it.
type ImageInfo struct {
	ID, Name, Status, DiskFormat string
	Size                         int64
	Properties                   map[string]string
}

// Images lists the images.
func (c *Cloud) Images() []ImageInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ImageInfo
	for _, img := range c.st.images {
		ii := ImageInfo{ID: img.id, Name: img.name, Status: img.status, DiskFormat: img.diskFormat, Size: img.size, Properties: map[string]string{}}
		for k, v := range img.props {
			ii.Properties[k] = v
		}
		out = append(out, ii)
	}
	slices.SortFunc(out, func(a, b ImageInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// AddNetwork adds a network with one subnet (cidr such as "10.1.0.0/24");
// external networks hand out floating IPs. It returns the network's id.
func (c *Cloud) AddNetwork(name string, external bool, cidr string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.addNetwork(name, external, cidr, time.Now().UTC())
	return idFrom("network", name)
}

// AddSecurityGroup adds a security group and returns its id.
func (c *Cloud) AddSecurityGroup(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := &securityGroup{id: idFrom("secgroup", name), name: name, created: time.Now().UTC()}
	c.st.secgroup[g.id] = g
	return g.id
}
