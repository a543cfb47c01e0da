package openstack

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

func (c *Cloud) networkRoutes() {
	m := c.mux
	m.HandleFunc("GET /network", c.networkVersions)
	m.HandleFunc("GET /network/{$}", c.networkVersions)
	m.HandleFunc("GET /network/v2.0", c.locked(c.networkResources))
	m.HandleFunc("GET /network/v2.0/{$}", c.locked(c.networkResources))
	m.HandleFunc("GET /network/v2.0/extensions", c.locked(c.networkExtensions))
	m.HandleFunc("GET /network/v2.0/networks", c.locked(c.listNetworks))
	m.HandleFunc("GET /network/v2.0/networks/{id}", c.locked(c.showNetwork))
	m.HandleFunc("GET /network/v2.0/subnets", c.locked(c.listSubnets))
	m.HandleFunc("GET /network/v2.0/subnets/{id}", c.locked(c.showSubnet))
	m.HandleFunc("GET /network/v2.0/ports", c.locked(c.listPorts))
	m.HandleFunc("POST /network/v2.0/ports", c.locked(c.createPort))
	m.HandleFunc("GET /network/v2.0/ports/{id}", c.locked(c.withPort(c.showPort)))
	m.HandleFunc("PUT /network/v2.0/ports/{id}", c.locked(c.withPort(c.updatePort)))
	m.HandleFunc("DELETE /network/v2.0/ports/{id}", c.locked(c.withPort(c.deletePort)))
	m.HandleFunc("GET /network/v2.0/floatingips", c.locked(c.listFloatingIPs))
	m.HandleFunc("POST /network/v2.0/floatingips", c.locked(c.createFloatingIP))
	m.HandleFunc("GET /network/v2.0/floatingips/{id}", c.locked(c.withFloatingIP(c.showFloatingIP)))
	m.HandleFunc("PUT /network/v2.0/floatingips/{id}", c.locked(c.withFloatingIP(c.updateFloatingIP)))
	m.HandleFunc("DELETE /network/v2.0/floatingips/{id}", c.locked(c.withFloatingIP(c.deleteFloatingIP)))
	m.HandleFunc("GET /network/v2.0/security-groups", c.locked(c.listSecurityGroups))
	m.HandleFunc("GET /network/v2.0/security-groups/{id}", c.locked(c.showSecurityGroup))
}

func (c *Cloud) networkVersions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"versions": []any{map[string]any{
		"id": "v2.0", "status": "CURRENT", "links": []any{map[string]any{"rel": "self", "href": base(r) + "/network/v2.0/"}},
	}}})
}

func (c *Cloud) networkResources(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var out []any
	for _, res := range []string{"network", "subnet", "port", "floatingip", "security_group"} {
		coll := strings.ReplaceAll(res, "_", "-") + "s"
		out = append(out, map[string]any{"name": res, "collection": coll,
			"links": []any{map[string]any{"rel": "self", "href": base(r) + "/network/v2.0/" + coll}}})
	}
	writeJSON(w, http.StatusOK, map[string]any{"resources": out})
}

func (c *Cloud) networkExtensions(w http.ResponseWriter, _ *http.Request, _ time.Time) {
	var out []any
	for _, e := range [][2]string{
		{"external-net", "Neutron external network"}, {"router", "Neutron L3 Router"},
		{"security-group", "security-group"}, {"port-security", "Port Security"},
		{"standard-attr-description", "standard-attr-description"}, {"standard-attr-timestamp", "Resource timestamps"},
		{"standard-attr-revisions", "Resource revision numbers"}, {"binding", "Port Binding"}, {"quotas", "Quota management support"},
	} {
		out = append(out, map[string]any{"alias": e[0], "name": e[1], "description": e[1], "updated": "2013-01-20T00:00:00-00:00", "links": []any{}})
	}
	writeJSON(w, http.StatusOK, map[string]any{"extensions": out})
}

// neutronList filters a collection by the query (each field may be given
// several times: any value matches), sorts it by id and cuts a page.
func (c *Cloud) neutronList(w http.ResponseWriter, r *http.Request, collection string, items []map[string]any) {
	q := r.URL.Query()
	control := map[string]bool{"limit": true, "marker": true, "fields": true, "sort_key": true, "sort_dir": true, "page_reverse": true}
	var list []map[string]any
	for _, it := range items {
		match := true
		for k, vs := range q {
			if control[k] {
				continue
			}
			v, ok := it[k]
			if !ok {
				continue // Neutron ignores filters on unknown fields
			}
			have := fmt.Sprint(orEmptyString(v))
			if !slices.ContainsFunc(vs, func(x string) bool { return strings.EqualFold(x, have) }) {
				match = false
			}
		}
		if match {
			list = append(list, it)
		}
	}
	slices.SortFunc(list, func(a, b map[string]any) int { return strings.Compare(a["id"].(string), b["id"].(string)) })
	limit, err := c.limitParam(r)
	if err != nil {
		neutronError(w, http.StatusBadRequest, "BadRequest", "Bad limit request: "+err.Error()+".")
		return
	}
	pg, more, ok := page(list, func(m map[string]any) string { return m["id"].(string) }, q.Get("marker"), limit)
	if !ok {
		neutronError(w, http.StatusNotFound, "NotFound", fmt.Sprintf("Marker %s could not be found.", q.Get("marker")))
		return
	}
	if pg == nil {
		pg = []map[string]any{}
	}
	body := map[string]any{collection: pg}
	if more && q.Get("limit") != "" {
		body[collection+"_links"] = []any{map[string]any{"rel": "next", "href": nextLink(r, "", pg[len(pg)-1]["id"].(string))}}
	}
	writeJSON(w, http.StatusOK, body)
}

func orEmptyString(v any) any {
	if v == nil {
		return ""
	}
	return v
}

func (c *Cloud) networkJSON(n *network) map[string]any {
	return map[string]any{"id": n.id, "name": n.name, "status": "ACTIVE", "subnets": n.subnets, "admin_state_up": true,
		"tenant_id": c.st.projectID, "project_id": c.st.projectID, "shared": n.shared, "router:external": n.external,
		"mtu": 1442, "availability_zones": c.opts.AvailabilityZones, "availability_zone_hints": []any{},
		"port_security_enabled": true, "ipv4_address_scope": nil, "ipv6_address_scope": nil, "is_default": n.external,
		"created_at": stamp(n.created), "updated_at": stamp(n.updated), "revision_number": n.revisions,
		"tags": []any{}, "description": "", "qos_policy_id": nil}
}

func (c *Cloud) listNetworks(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var items []map[string]any
	for _, n := range c.st.networks {
		items = append(items, c.networkJSON(n))
	}
	c.neutronList(w, r, "networks", items)
}

func (c *Cloud) showNetwork(w http.ResponseWriter, r *http.Request, _ time.Time) {
	n, ok := c.st.networks[r.PathValue("id")]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"network": c.networkJSON(n)})
}

func (c *Cloud) subnetJSON(sn *subnet) map[string]any {
	return map[string]any{"id": sn.id, "name": sn.name, "network_id": sn.networkID, "cidr": sn.cidr.String(),
		"gateway_ip": sn.gateway.String(), "ip_version": 4, "enable_dhcp": true, "tenant_id": c.st.projectID,
		"project_id": c.st.projectID, "allocation_pools": []any{}, "dns_nameservers": []any{}, "host_routes": []any{},
		"ipv6_ra_mode": nil, "ipv6_address_mode": nil, "subnetpool_id": nil, "created_at": stamp(sn.created),
		"updated_at": stamp(sn.created), "revision_number": 0, "tags": []any{}, "description": "", "service_types": []any{}}
}

func (c *Cloud) listSubnets(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var items []map[string]any
	for _, sn := range c.st.subnets {
		items = append(items, c.subnetJSON(sn))
	}
	c.neutronList(w, r, "subnets", items)
}

func (c *Cloud) showSubnet(w http.ResponseWriter, r *http.Request, _ time.Time) {
	sn, ok := c.st.subnets[r.PathValue("id")]
	if !ok {
		neutronError(w, http.StatusNotFound, "SubnetNotFound", fmt.Sprintf("Subnet %s could not be found.", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subnet": c.subnetJSON(sn)})
}

func (c *Cloud) portJSON(p *port) map[string]any {
	fixed := []any{}
	if p.ip != "" {
		fixed = append(fixed, map[string]any{"subnet_id": p.subnetID, "ip_address": p.ip})
	}
	return map[string]any{"id": p.id, "name": p.name, "network_id": p.networkID, "tenant_id": c.st.projectID,
		"project_id": c.st.projectID, "mac_address": p.mac, "admin_state_up": true, "status": p.status,
		"device_id": p.deviceID, "device_owner": p.deviceOwner, "fixed_ips": fixed, "allowed_address_pairs": []any{},
		"extra_dhcp_opts": []any{}, "security_groups": orEmptyStrings(p.secGroups), "binding:vnic_type": "normal",
		"port_security_enabled": true, "created_at": stamp(p.created), "updated_at": stamp(p.updated),
		"revision_number": p.revision, "tags": []any{}, "description": ""}
}

func orEmptyStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (c *Cloud) listPorts(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var items []map[string]any
	for _, p := range c.st.ports {
		items = append(items, c.portJSON(p))
	}
	c.neutronList(w, r, "ports", items)
}

func (c *Cloud) withPort(h func(w http.ResponseWriter, r *http.Request, now time.Time, p *port)) func(http.ResponseWriter, *http.Request, time.Time) {
	return withID(func(id string) (*port, bool) { p, ok := c.st.ports[id]; return p, ok },
		func(w http.ResponseWriter, id string) {
			neutronError(w, http.StatusNotFound, "PortNotFound", fmt.Sprintf("Port %s could not be found.", id))
		}, h)
}

func (c *Cloud) showPort(w http.ResponseWriter, _ *http.Request, _ time.Time, p *port) {
	writeJSON(w, http.StatusOK, map[string]any{"port": c.portJSON(p)})
}

func (c *Cloud) createPort(w http.ResponseWriter, r *http.Request, now time.Time) {
	var body struct {
		Port struct {
			NetworkID   string  `json:"network_id"`
			Name        string  `json:"name"`
			DeviceID    string  `json:"device_id"`
			DeviceOwner *string `json:"device_owner"`
		} `json:"port"`
	}
	if err := readJSON(r, &body); err != nil {
		neutronError(w, http.StatusBadRequest, "BadRequest", "Bad port request: "+err.Error()+".")
		return
	}
	n, ok := c.st.networks[body.Port.NetworkID]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", body.Port.NetworkID))
		return
	}
	p := c.st.newPort(n, c.hostIP, now)
	p.name, p.deviceID = body.Port.Name, body.Port.DeviceID
	if body.Port.DeviceOwner != nil {
		p.deviceOwner = *body.Port.DeviceOwner
	}
	writeJSON(w, http.StatusCreated, map[string]any{"port": c.portJSON(p)})
}

func (c *Cloud) updatePort(w http.ResponseWriter, r *http.Request, now time.Time, p *port) {
	var body struct {
		Port map[string]any `json:"port"`
	}
	if err := readJSON(r, &body); err != nil || body.Port == nil {
		neutronError(w, http.StatusBadRequest, "BadRequest", "Bad port request: a port is expected.")
		return
	}
	if v, ok := body.Port["name"].(string); ok {
		p.name = v
	}
	if v, ok := body.Port["device_owner"].(string); ok {
		p.deviceOwner = v
	}
	if v, ok := body.Port["device_id"].(string); ok {
		p.deviceID = v
	}
	p.updated = now
	p.revision++
	writeJSON(w, http.StatusOK, map[string]any{"port": c.portJSON(p)})
}

func (c *Cloud) deletePort(w http.ResponseWriter, _ *http.Request, now time.Time, p *port) {
	delete(c.st.ports, p.id)
	if s := c.st.servers[p.deviceID]; s != nil {
		s.ports = slices.DeleteFunc(s.ports, func(id string) bool { return id == p.id })
	}
	for _, f := range c.st.fips {
		if f.portID == p.id {
			f.portID, f.fixedIP, f.updated = "", "", now
			f.revision++
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (c *Cloud) fipJSON(f *floatingIP) map[string]any {
	status := "DOWN"
	var portID, fixed, router any
	if f.portID != "" {
		status, portID, fixed, router = "ACTIVE", f.portID, f.fixedIP, idFrom("router", "router1")
	}
	return map[string]any{"id": f.id, "floating_ip_address": f.address, "floating_network_id": f.networkID,
		"router_id": router, "port_id": portID, "fixed_ip_address": fixed, "status": status,
		"tenant_id": c.st.projectID, "project_id": c.st.projectID, "description": f.description,
		"created_at": stamp(f.created), "updated_at": stamp(f.updated), "revision_number": f.revision,
		"tags": []any{}, "dns_domain": "", "dns_name": "", "port_forwardings": []any{}, "qos_policy_id": nil}
}

func (c *Cloud) listFloatingIPs(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var items []map[string]any
	for _, f := range c.st.fips {
		items = append(items, c.fipJSON(f))
	}
	c.neutronList(w, r, "floatingips", items)
}

func (c *Cloud) withFloatingIP(h func(w http.ResponseWriter, r *http.Request, now time.Time, f *floatingIP)) func(http.ResponseWriter, *http.Request, time.Time) {
	return withID(func(id string) (*floatingIP, bool) { f, ok := c.st.fips[id]; return f, ok },
		func(w http.ResponseWriter, id string) {
			neutronError(w, http.StatusNotFound, "FloatingIPNotFound", fmt.Sprintf("Floating IP %s could not be found", id))
		}, h)
}

func (c *Cloud) showFloatingIP(w http.ResponseWriter, _ *http.Request, _ time.Time, f *floatingIP) {
	writeJSON(w, http.StatusOK, map[string]any{"floatingip": c.fipJSON(f)})
}

// associate binds a floating IP to a port (or frees it with "").
func (c *Cloud) associate(w http.ResponseWriter, f *floatingIP, portID string, now time.Time) bool {
	if portID == "" {
		f.portID, f.fixedIP = "", ""
		return true
	}
	p, ok := c.st.ports[portID]
	if !ok {
		neutronError(w, http.StatusNotFound, "PortNotFound", fmt.Sprintf("Port %s could not be found.", portID))
		return false
	}
	if p.ip == "" {
		neutronError(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("Bad floatingip request: Port %s does not have any IPv4 address.", portID))
		return false
	}
	for _, o := range c.st.fips {
		if o.portID == portID && o.id != f.id {
			neutronError(w, http.StatusConflict, "FloatingIPPortAlreadyAssociated",
				fmt.Sprintf("Cannot associate floating IP %s (%s) with port %s using fixed IP %s, as that fixed IP already has a floating IP on external network %s.", f.address, f.id, portID, p.ip, f.networkID))
			return false
		}
	}
	f.portID, f.fixedIP, f.updated = portID, p.ip, now
	return true
}

func (c *Cloud) createFloatingIP(w http.ResponseWriter, r *http.Request, now time.Time) {
	var body struct {
		FloatingIP struct {
			FloatingNetworkID string `json:"floating_network_id"`
			PortID            string `json:"port_id"`
			Description       string `json:"description"`
		} `json:"floatingip"`
	}
	if err := readJSON(r, &body); err != nil {
		neutronError(w, http.StatusBadRequest, "BadRequest", "Bad floatingip request: "+err.Error()+".")
		return
	}
	req := body.FloatingIP
	n, ok := c.st.networks[req.FloatingNetworkID]
	if !ok {
		neutronError(w, http.StatusNotFound, "NetworkNotFound", fmt.Sprintf("Network %s could not be found.", req.FloatingNetworkID))
		return
	}
	if !n.external {
		neutronError(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("Bad floatingip request: Network %s is not a valid external network.", n.id))
		return
	}
	if q := c.quota.FloatingIPs; q >= 0 && len(c.st.fips) >= q {
		neutronError(w, http.StatusConflict, "OverQuota", "Quota exceeded for resources: ['floatingip'].")
		return
	}
	f := &floatingIP{id: newID(), networkID: n.id, description: req.Description, created: now, updated: now, revision: 0}
	if c.hostIP != "" {
		f.address = c.hostIP
	} else {
		f.address = c.st.subnets[n.subnets[0]].nextIP()
	}
	if !c.associate(w, f, req.PortID, now) {
		return
	}
	c.st.fips[f.id] = f
	writeJSON(w, http.StatusCreated, map[string]any{"floatingip": c.fipJSON(f)})
}

func (c *Cloud) updateFloatingIP(w http.ResponseWriter, r *http.Request, now time.Time, f *floatingIP) {
	var body struct {
		FloatingIP map[string]any `json:"floatingip"`
	}
	if err := readJSON(r, &body); err != nil || body.FloatingIP == nil {
		neutronError(w, http.StatusBadRequest, "BadRequest", "Bad floatingip request: a floatingip is expected.")
		return
	}
	if v, ok := body.FloatingIP["port_id"]; ok {
		pid, _ := v.(string)
		if !c.associate(w, f, pid, now) {
			return
		}
	}
	if v, ok := body.FloatingIP["description"].(string); ok {
		f.description = v
	}
	f.updated = now
	f.revision++
	writeJSON(w, http.StatusOK, map[string]any{"floatingip": c.fipJSON(f)})
}

func (c *Cloud) deleteFloatingIP(w http.ResponseWriter, _ *http.Request, _ time.Time, f *floatingIP) {
	delete(c.st.fips, f.id)
	w.WriteHeader(http.StatusNoContent)
}

func (c *Cloud) securityGroupJSON(g *securityGroup) map[string]any {
	return map[string]any{"id": g.id, "name": g.name, "description": g.description, "tenant_id": c.st.projectID,
		"project_id": c.st.projectID, "security_group_rules": []any{}, "stateful": true, "shared": false,
		"created_at": stamp(g.created), "updated_at": stamp(g.created), "revision_number": 1, "tags": []any{}}
}

func (c *Cloud) listSecurityGroups(w http.ResponseWriter, r *http.Request, _ time.Time) {
	var items []map[string]any
	for _, g := range c.st.secgroup {
		items = append(items, c.securityGroupJSON(g))
	}
	c.neutronList(w, r, "security_groups", items)
}

func (c *Cloud) showSecurityGroup(w http.ResponseWriter, r *http.Request, _ time.Time) {
	g, ok := c.st.secgroup[r.PathValue("id")]
	if !ok {
		neutronError(w, http.StatusNotFound, "SecurityGroupNotFound", fmt.Sprintf("Security group %s does not exist", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"security_group": c.securityGroupJSON(g)})
}
