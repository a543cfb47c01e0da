package consumers

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
)

// nodeSize is what a node holds against quota (at least one instance).
func nodeSize(n *kv.Node) kv.Resources {
	r := n.Resources
	if r.Instances == 0 {
		r.Instances = 1
	}
	return r
}

// limit turns a configured limit into one the scheduler counts with:
// config.Unlimited (the key was not written) is no limit, and a limit
// below zero is zero (as in Nodepool, where max-servers below 0 disables
// a pool).
func limit(v int) int {
	switch {
	case v == config.Unlimited:
		return drivers.Unlimited
	case v < 0:
		return 0
	}
	return v
}

// poolLimits are the pool's own limits (with an aws pool's max-resources
// and an openstack pool's max-volumes and max-volume-gb).
func poolLimits(p *config.Pool) kv.Resources {
	r := kv.Resources{Instances: limit(p.MaxServers), Cores: limit(p.MaxCores), RAM: limit(p.MaxRAM)}
	r.Other = otherLimits(p.AWSPool.MaxResources)
	r.Other = volumeLimits(r.Other, p.MaxVolumes, p.MaxVolumeGB)
	return withResourceLimits(r, p.KubernetesPool.PoolMaxResources)
}

// withResourceLimits adds a kubernetes pool's max-resources to its limits:
// cores, ram and instances limit those (as in Nodepool, whose quota takes
// them by name), any other name the resource of that name (what labels'
// extra-resources, storage and gpu count, see the kubernetes driver). A
// limit is rounded down to a whole number, as resources count in whole
// numbers.
func withResourceLimits(r kv.Resources, m map[string]float64) kv.Resources {
	for k, f := range m {
		v := max(int(math.Floor(f)), 0)
		switch k {
		case "cores":
			r.Cores = min(r.Cores, v)
		case "ram":
			r.RAM = min(r.RAM, v)
		case "instances":
			r.Instances = min(r.Instances, v)
		default:
			if r.Other == nil {
				r.Other = map[string]int{}
			}
			r.Other[k] = v
		}
	}
	return r
}

// tenantLimits are a tenant's limits; its other keys (AWS quota codes)
// limit the resources of that name, and max-volumes and max-volume-gb the
// volumes of OpenStack nodes booted from volumes.
func tenantLimits(tl config.TenantLimit) kv.Resources {
	r := kv.Resources{Instances: limit(tl.MaxServers), Cores: limit(tl.MaxCores), RAM: limit(tl.MaxRAM)}
	r.Other = otherLimits(tl.Resources)
	vols, gb := config.Unlimited, config.Unlimited
	if v, ok := tl.Resources["max-volumes"]; ok {
		vols = v
	}
	if v, ok := tl.Resources["max-volume-gb"]; ok {
		gb = v
	}
	r.Other = volumeLimits(r.Other, vols, gb)
	return r
}

// volumeLimits adds limits of volumes and their size (the resources
// drivers.ResourceVolumes and ResourceVolumeGB) to other; a limit not set
// (config.Unlimited) is left out, so it limits nothing.
func volumeLimits(other map[string]int, volumes, gb int) map[string]int {
	for k, v := range map[string]int{drivers.ResourceVolumes: volumes, drivers.ResourceVolumeGB: gb} {
		if v == config.Unlimited {
			continue
		}
		if other == nil {
			other = map[string]int{}
		}
		other[k] = limit(v)
	}
	return other
}

// otherLimits are limits of resources other than servers, cores and RAM,
// by name (keys written max-something are not resource names).
func otherLimits(m map[string]int) map[string]int {
	var out map[string]int
	for k, v := range m {
		if strings.HasPrefix(k, "max-") {
			continue
		}
		if out == nil {
			out = map[string]int{}
		}
		out[k] = max(v, 0)
	}
	return out
}

// unlimited is a quota that is never reached.
var unlimited = kv.Resources{Instances: drivers.Unlimited, Cores: drivers.Unlimited, RAM: drivers.Unlimited}

// exceeds reports the first dimension in which need is more than limit.
func exceeds(need, limit kv.Resources) (string, bool) {
	switch {
	case need.Instances > limit.Instances:
		return fmt.Sprintf("%d servers, limit %d", need.Instances, limit.Instances), true
	case need.Cores > limit.Cores:
		return fmt.Sprintf("%d cores, limit %d", need.Cores, limit.Cores), true
	case need.RAM > limit.RAM:
		return fmt.Sprintf("%d MB of RAM, limit %d", need.RAM, limit.RAM), true
	}
	for _, k := range slices.Sorted(maps.Keys(need.Other)) {
		// A resource the limit does not name is not limited.
		if lim, ok := limit.Other[k]; ok && need.Other[k] > 0 && need.Other[k] > lim {
			return fmt.Sprintf("%d %s, limit %d", need.Other[k], k, lim), true
		}
	}
	return "", false
}

// headroom is what may still be launched now, in every dimension the pool
// is limited in: its own limits, its provider's quota (what the cloud
// reports, less instances that are not this provider's and this
// provider's nodes in every pool) and each tenant's limits.
type headroom struct {
	pool     kv.Resources
	provider kv.Resources
	tenants  map[string]kv.Resources // only tenants with limits
}

// fits reports whether need fits now; blockedBy says which limit stops it.
func (h *headroom) fits(tenant string, need kv.Resources) (ok bool, blockedBy string) {
	if why, over := exceeds(need, h.pool); over {
		return false, "pool: " + why
	}
	if why, over := exceeds(need, h.provider); over {
		return false, "provider quota: " + why
	}
	if t, limited := h.tenants[tenant]; limited {
		if why, over := exceeds(need, t); over {
			return false, "tenant " + tenant + ": " + why
		}
	}
	return true, ""
}

func (h *headroom) take(tenant string, need kv.Resources) {
	h.pool = h.pool.Less(need)
	h.provider = h.provider.Less(need)
	if t, limited := h.tenants[tenant]; limited {
		h.tenants[tenant] = t.Less(need)
	}
}

// usage keeps running totals of what nodes hold, updated from every node
// change, so a pass need not add up every node.
type usage struct {
	provider string
	pool     string
	poolUsed kv.Resources
	provUsed kv.Resources
	tenants  map[string]kv.Resources
}

func newUsage(provider, pool string) *usage {
	return &usage{provider: provider, pool: pool, tenants: map[string]kv.Resources{}}
}

// apply accounts for one node change.
func (u *usage) apply(ch kv.Change[kv.Node]) {
	if ch.Old != nil {
		u.add(&ch.Old.Value, kv.Resources{}.Sub(nodeSize(&ch.Old.Value)))
	}
	if ch.New != nil {
		u.add(&ch.New.Value, nodeSize(&ch.New.Value))
	}
}

func (u *usage) add(n *kv.Node, size kv.Resources) {
	if !n.Accountable() {
		// A record the service cannot account for holds nothing it
		// knows of; the cleanup ends it.
		return
	}
	if n.Provider == u.provider {
		u.provUsed = u.provUsed.Add(size)
		if n.Pool == u.pool {
			u.poolUsed = u.poolUsed.Add(size)
		}
	}
	if n.Tenant != "" {
		u.tenants[n.Tenant] = u.tenants[n.Tenant].Add(size)
	}
}

// cloudQuota is the provider's quota as the cloud last reported it, and
// what instances that are not this provider's hold.
type cloudQuota struct {
	limits kv.Resources
	others kv.Resources
}

// announced is the quota as the heartbeat tells it: the limits the cloud
// sets (a resource without one is left out) and what others hold.
func (q cloudQuota) announced(read time.Time) *kv.CloudQuota {
	out := &kv.CloudQuota{Limits: resourceMap(q.limits, drivers.Unlimited), Others: resourceMap(q.others, 0), Read: read.UTC()}
	if len(out.Others) == 0 {
		out.Others = nil
	}
	return out
}

// resourceMap lists resources by name (instances, cores, ram and the
// others), leaving out those of value none.
func resourceMap(r kv.Resources, none int) map[string]int {
	m := map[string]int{"instances": r.Instances, "cores": r.Cores, "ram": r.RAM}
	maps.Copy(m, r.Other)
	maps.DeleteFunc(m, func(_ string, v int) bool { return v == none })
	return m
}

// readCloudQuota reads a provider's quota and what instances that are
// not this provider's hold.
func readCloudQuota(ctx context.Context, drv drivers.Provider, provider string) (cloudQuota, error) {
	limits, err := drv.QuotaLimits(ctx)
	if err != nil {
		return cloudQuota{}, fmt.Errorf("reading quota: %w", err)
	}
	insts, err := drv.ListInstances(ctx)
	if err != nil {
		return cloudQuota{}, fmt.Errorf("listing instances: %w", err)
	}
	var others kv.Resources
	for _, inst := range insts {
		if inst.Tags[drivers.TagProvider] != provider {
			r := inst.Resources
			r.Instances = max(r.Instances, 1)
			others = others.Add(r)
		}
	}
	return cloudQuota{limits: limits, others: others}, nil
}

// watchCloudQuota reads a provider's quota now and then every interval
// until ctx ends. Each read is bounded by timeout: a cloud whose calls
// hang delays the next reading, never the scheduler.
func watchCloudQuota(ctx context.Context, drv drivers.Provider, provider string, interval, timeout time.Duration, log *slog.Logger, out chan<- cloudQuota) {
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		q, err := readCloudQuota(rctx, drv, provider)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("could not read the cloud's quota", "err", err)
		case err == nil:
			select {
			case out <- q:
			case <-ctx.Done():
				return
			}
		}
		if !wait.Sleep(ctx, interval) {
			return
		}
	}
}
