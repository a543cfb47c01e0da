package config

import (
	"encoding/json"
	"fmt"
)

// A provider's section is remembered (the nodepool-providers bucket) as
// the launcher loaded it, defaults applied, so that a provider removed
// from the file can still be drained: its driver is made again from the
// section, to delete what is left of it. JSON of the loaded struct keeps
// every key a driver reads, whatever the file wrote (an anchor, a
// default, a secure file); what a launch alone reads and may hold a
// secret (the labels' userdata, a kubernetes pod's env and spec) is left
// out, since a drain never launches.

// ProviderSection returns the provider's section to remember.
func ProviderSection(p *Provider) (json.RawMessage, error) {
	c := p.clone()
	for i := range c.Pools {
		for j := range c.Pools[i].Labels {
			lb := &c.Pools[i].Labels[j]
			lb.Userdata, lb.EC2UserData = "", ""
			// A pod's environment and whole spec may carry secrets too.
			lb.Env, lb.Spec = nil, nil
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("provider %s: recording its section: %w", p.Name, err)
	}
	return b, nil
}

// ProviderFromSection reads a section ProviderSection wrote. Keys it does
// not know (written by another version) are ignored.
func ProviderFromSection(section []byte) (*Provider, error) {
	var p Provider
	if err := json.Unmarshal(section, &p); err != nil {
		return nil, fmt.Errorf("reading a remembered provider section: %w", err)
	}
	if p.Name == "" {
		return nil, fmt.Errorf("reading a remembered provider section: it names no provider")
	}
	if spec, ok := driverSpecs[p.Driver]; !ok || !spec.available {
		return nil, fmt.Errorf("provider %s: driver %q is not available in this build", p.Name, p.Driver)
	}
	return &p, nil
}

// clone copies the provider's pools and labels (what ProviderSection
// changes) so that the configuration in force is left as it is.
func (p *Provider) clone() *Provider {
	c := *p
	c.Pools = make([]Pool, len(p.Pools))
	for i, pool := range p.Pools {
		pool.Labels = append([]PoolLabel(nil), pool.Labels...)
		c.Pools[i] = pool
	}
	return &c
}
