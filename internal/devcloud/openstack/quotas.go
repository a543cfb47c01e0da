package openstack

import (
	"net/http"
	"time"
)

// The project's quota as each service shows it (what `openstack quota
// show` reads): Nova's and Cinder's os-quota-sets, Neutron's quotas. The
// limits Nova and Neutron enforce are the cloud's Quota; the others are
// OpenStack's defaults, shown, not enforced. A project other than the
// cloud's own is refused (403), as a member's token is refused another
// project's quota.

func (c *Cloud) quotaRoutes() {
	m := c.mux
	nova := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) {
		m.HandleFunc(pattern, c.microversioned(c.locked(c.ownProject("os_compute_api:os-quota-sets:show", fn))))
	}
	nova("GET /compute/v2.1/os-quota-sets/{project}", c.computeQuota(false))
	nova("GET /compute/v2.1/os-quota-sets/{project}/detail", c.computeQuota(true))
	nova("GET /compute/v2.1/os-quota-sets/{project}/defaults", c.computeQuotaDefaults)
	cinder := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) {
		m.HandleFunc(pattern, c.locked(c.ownProject("volume_extension:quotas:show", func(w http.ResponseWriter, r *http.Request, now time.Time) {
			if r.PathValue("owner") != c.st.projectID {
				novaError(w, http.StatusForbidden, "Policy doesn't allow volume_extension:quotas:show to be performed.")
				return
			}
			w.Header().Set("OpenStack-API-Version", "volume 3.0")
			fn(w, r, now)
		})))
	}
	cinder("GET /volume/v3/{owner}/os-quota-sets/{project}", c.volumeQuotaSet(false))
	cinder("GET /volume/v3/{owner}/os-quota-sets/{project}/defaults", c.volumeQuotaSet(true))
	neutron := func(pattern string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) {
		m.HandleFunc(pattern, c.locked(func(w http.ResponseWriter, r *http.Request, now time.Time) {
			if r.PathValue("project") != c.st.projectID {
				neutronError(w, http.StatusForbidden, "PolicyNotAuthorized", "(rule:get_quota) is disallowed by policy")
				return
			}
			fn(w, r, now)
		}))
	}
	neutron("GET /network/v2.0/quotas/{project}", c.networkQuota(false, false))
	neutron("GET /network/v2.0/quotas/{project}/details", c.networkQuota(true, false))
	neutron("GET /network/v2.0/quotas/{project}/default", c.networkQuota(false, true))
}

// ownProject refuses a call about another project than the cloud's, as
// Nova's policy does.
func (c *Cloud) ownProject(rule string, fn func(w http.ResponseWriter, r *http.Request, now time.Time)) func(w http.ResponseWriter, r *http.Request, now time.Time) {
	return func(w http.ResponseWriter, r *http.Request, now time.Time) {
		if r.PathValue("project") != c.st.projectID {
			novaError(w, http.StatusForbidden, "Policy doesn't allow "+rule+" to be performed.")
			return
		}
		fn(w, r, now)
	}
}

// quotaItem is one limit: a number, or with detail its use.
func quotaItem(detail bool, limit, inUse int, usedKey string) any {
	if !detail {
		return limit
	}
	return map[string]any{"limit": limit, usedKey: inUse, "reserved": 0}
}

// computeQuotaSet is Nova's quota set for q with the project's use (the
// fields of the microversion asked for: 2.36 dropped the network ones,
// 2.57 the injected files).
func (c *Cloud) computeQuotaSet(r *http.Request, q Quota, detail bool) map[string]any {
	instances, cores, ram, _, _, _ := c.st.usage()
	set := map[string]any{
		"id":        c.st.projectID,
		"instances": quotaItem(detail, q.Instances, instances, "in_use"), "cores": quotaItem(detail, q.Cores, cores, "in_use"),
		"ram": quotaItem(detail, q.RAM, ram, "in_use"), "key_pairs": quotaItem(detail, 100, len(c.st.keypairs), "in_use"),
		"metadata_items": quotaItem(detail, 128, 0, "in_use"), "server_groups": quotaItem(detail, 10, 0, "in_use"),
		"server_group_members": quotaItem(detail, 10, 0, "in_use"),
	}
	v := mv(r)
	if v < 36 {
		for _, k := range []string{"fixed_ips", "floating_ips", "security_groups", "security_group_rules"} {
			set[k] = quotaItem(detail, -1, 0, "in_use")
		}
	}
	if v < 57 {
		set["injected_files"] = quotaItem(detail, 5, 0, "in_use")
		set["injected_file_content_bytes"] = quotaItem(detail, 10240, 0, "in_use")
		set["injected_file_path_bytes"] = quotaItem(detail, 255, 0, "in_use")
	}
	return set
}

func (c *Cloud) computeQuota(detail bool) func(w http.ResponseWriter, r *http.Request, _ time.Time) {
	return func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		writeJSON(w, http.StatusOK, map[string]any{"quota_set": c.computeQuotaSet(r, c.quota, detail)})
	}
}

func (c *Cloud) computeQuotaDefaults(w http.ResponseWriter, r *http.Request, _ time.Time) {
	writeJSON(w, http.StatusOK, map[string]any{"quota_set": c.computeQuotaSet(r, DefaultQuota, false)})
}

// volumeQuotaSet is Cinder's quota set (with ?usage=True, each limit with
// its use), or its defaults.
func (c *Cloud) volumeQuotaSet(defaults bool) func(w http.ResponseWriter, r *http.Request, _ time.Time) {
	return func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		q := c.quota
		if defaults {
			q = DefaultQuota
		}
		_, _, _, volumes, gigabytes, _ := c.st.usage()
		detail := !defaults && (r.URL.Query().Get("usage") == "True" || r.URL.Query().Get("usage") == "true")
		writeJSON(w, http.StatusOK, map[string]any{"quota_set": map[string]any{
			"id":      c.st.projectID,
			"volumes": quotaItem(detail, q.Volumes, volumes, "in_use"), "gigabytes": quotaItem(detail, q.Gigabytes, gigabytes, "in_use"),
			"snapshots": quotaItem(detail, 10, 0, "in_use"), "backups": quotaItem(detail, 10, 0, "in_use"),
			"backup_gigabytes": quotaItem(detail, 1000, 0, "in_use"), "per_volume_gigabytes": quotaItem(detail, -1, 0, "in_use"),
			"groups": quotaItem(detail, 10, 0, "in_use"),
		}})
	}
}

// networkQuota is Neutron's quota of the project (with details, each
// limit with its use), or its defaults.
func (c *Cloud) networkQuota(detail, defaults bool) func(w http.ResponseWriter, r *http.Request, _ time.Time) {
	return func(w http.ResponseWriter, _ *http.Request, _ time.Time) {
		fips := c.quota.FloatingIPs
		if defaults {
			fips = DefaultQuota.FloatingIPs
		}
		st := c.st
		writeJSON(w, http.StatusOK, map[string]any{"quota": map[string]any{
			"network": quotaItem(detail, 100, len(st.networks), "used"), "subnet": quotaItem(detail, 100, len(st.subnets), "used"),
			"port": quotaItem(detail, 500, len(st.ports), "used"), "router": quotaItem(detail, 10, 0, "used"),
			"floatingip": quotaItem(detail, fips, len(st.fips), "used"), "security_group": quotaItem(detail, 10, len(st.secgroup), "used"),
			"security_group_rule": quotaItem(detail, 100, 0, "used"), "rbac_policy": quotaItem(detail, 10, 0, "used"),
			"subnetpool": quotaItem(detail, -1, 0, "used"),
		}})
	}
}
