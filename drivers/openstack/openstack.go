// Package openstack is the driver of OpenStack clouds, on gophercloud v2:
// servers booted through Nova from cloud images or uploaded diskimages
// (Glance), on Neutron networks with floating IPs where asked, from Cinder
// volumes where asked. Creates and deletes are resumable state machines
// whose progress lives in the node's driver_data; quota comes from Nova's
// and Cinder's limits; every API call is paced by the provider's rate.
package openstack

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	cinderlimits "github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/availabilityzones"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	novalimits "github.com/gophercloud/gophercloud/v2/openstack/compute/v2/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// Tags the driver adds to the metadata of its servers and volumes, besides
// drivers.TagProvider, TagPool, TagNode and TagLabel.
const (
	// TagAttempt tells the servers of a node's launch attempts apart.
	TagAttempt = "nodepool_attempt"
	// TagNodepoolID carries the provider's nodepool-id, when it has one.
	TagNodepoolID = "nodepool_nodepool_id"
)

// catalogTTL is how long flavors, availability zones, networks and cloud
// image ids are kept before they are read again.
const catalogTTL = 10 * time.Minute

// Provider is one configured openstack provider.
type Provider struct {
	cfg        *config.Provider
	cloudsFile string // "" : where openstacksdk looks
	log        *slog.Logger
	pacer      pacer
	transport  *pacedTransport

	connMu sync.Mutex
	cl     *clients

	catMu     sync.Mutex
	flavors   []flavors.Flavor
	flavorsAt time.Time
	azs       []string
	azsAt     time.Time
	names     map[string]cached // cloud image and network references -> ids
	// external are the names of the external networks.
	external   map[string]bool
	externalAt time.Time

	watch *serverWatch
	sweep sweepState
	// scanErrs holds the last failed host-key scan of servers, by id.
	scanErrs sync.Map
	// lookups share the catalog lookups that run at once.
	lookups flights

	// bg lives as long as the provider: background work runs under it.
	bg   context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
}

type cached struct {
	id string
	at time.Time
}

// Option changes how New sets a provider up.
type Option func(*Provider)

// WithCloudsFile reads the cloud's entry from this clouds.yaml instead of
// looking where openstacksdk looks (tests run several clouds at once).
func WithCloudsFile(path string) Option { return func(p *Provider) { p.cloudsFile = path } }

// New makes the driver of an openstack provider and logs in to its cloud
// in the background (waiting up to a few seconds for the first login, so
// that the flavors are known when the launcher starts).
func New(ctx context.Context, pc *config.Provider, log *slog.Logger, opts ...Option) (*Provider, error) {
	if pc.Driver != "openstack" {
		return nil, fmt.Errorf("provider %s: driver is %q, not openstack", pc.Name, pc.Driver)
	}
	p := &Provider{cfg: pc, log: log.With("provider", pc.Name, "cloud", pc.Cloud), names: map[string]cached{}}
	for _, o := range opts {
		o(p)
	}
	p.transport = &pacedTransport{pacer: &p.pacer}
	p.watch = newServerWatch(p)
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.bg, p.stop = bg, stop
	ready := make(chan struct{})
	p.wg.Go(func() { p.connectLoop(bg, ready) })
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
		p.log.Warn("the cloud did not answer yet; going on, the driver keeps trying")
	case <-ctx.Done():
		stop()
		p.wg.Wait()
		return nil, ctx.Err()
	}
	return p, nil
}

// connectLoop logs in and reads the flavors, retrying until it succeeds.
func (p *Provider) connectLoop(ctx context.Context, ready chan<- struct{}) {
	for failures := 0; ctx.Err() == nil; failures++ {
		cl, err := p.client(ctx)
		if err == nil {
			_, err = p.loadFlavors(ctx, cl)
		}
		if err == nil {
			close(ready)
			return
		}
		if ctx.Err() == nil {
			p.log.Warn("cannot reach the cloud yet", "err", err)
		}
		if !wait.Sleep(ctx, wait.Backoff(failures)) {
			return
		}
	}
}

// Close stops the driver's background work.
func (p *Provider) Close() {
	p.stop()
	p.wg.Wait()
}

// Pace makes every API call of this provider wait for lim (the launcher's
// share of the provider's rate).
func (p *Provider) Pace(lim drivers.Limiter) { p.pacer.lim.Store(&limiterBox{lim}) }

// Calls counts the HTTP calls made to the cloud.
func (p *Provider) Calls() int64 { return p.transport.calls.Load() }

// client returns the logged-in clients, logging in first if needed.
func (p *Provider) client(ctx context.Context) (*clients, error) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.cl != nil {
		return p.cl, nil
	}
	cl, err := connect(ctx, p.cfg.Cloud, p.cfg.Region, p.cloudsFile, p.transport)
	if err != nil {
		return nil, err
	}
	p.cl = cl
	return cl, nil
}

// loadFlavors reads the cloud's flavors.
func (p *Provider) loadFlavors(ctx context.Context, cl *clients) ([]flavors.Flavor, error) {
	err := p.lookups.do(ctx, "flavors", func() error {
		pages, err := flavors.ListDetail(cl.compute, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(ctx)
		if err != nil {
			return wrapf(err, "listing flavors")
		}
		fl, err := flavors.ExtractFlavors(pages)
		if err != nil {
			return err
		}
		p.catMu.Lock()
		p.flavors, p.flavorsAt = fl, time.Now()
		p.catMu.Unlock()
		return nil
	})
	p.catMu.Lock()
	defer p.catMu.Unlock()
	return p.flavors, err
}

// chooseFlavor picks a label's flavor as Nodepool does: with min-ram, the
// smallest flavor (by RAM, then name) with at least that much whose name
// contains flavor-name (if given); otherwise the flavor whose name or id
// is flavor-name.
func chooseFlavor(all []flavors.Flavor, pl *config.PoolLabel) (flavors.Flavor, error) {
	if pl.MinRAM > 0 {
		sorted := slices.Clone(all)
		sort.SliceStable(sorted, func(i, j int) bool {
			if sorted[i].RAM != sorted[j].RAM {
				return sorted[i].RAM < sorted[j].RAM
			}
			return sorted[i].Name < sorted[j].Name
		})
		for _, f := range sorted {
			if f.RAM >= pl.MinRAM && (pl.FlavorName == "" || strings.Contains(f.Name, pl.FlavorName)) {
				return f, nil
			}
		}
		if pl.FlavorName != "" {
			return flavors.Flavor{}, fmt.Errorf("no flavor with at least %d MiB of RAM and %q in its name", pl.MinRAM, pl.FlavorName)
		}
		return flavors.Flavor{}, fmt.Errorf("no flavor with at least %d MiB of RAM", pl.MinRAM)
	}
	for _, f := range all {
		if f.Name == pl.FlavorName || f.ID == pl.FlavorName {
			return f, nil
		}
	}
	return flavors.Flavor{}, fmt.Errorf("no flavor named %q", pl.FlavorName)
}

// flavorFor is a label's flavor from the flavors read last (read again
// when a create asks and they are old or lack it).
func (p *Provider) flavorFor(ctx context.Context, cl *clients, pl *config.PoolLabel) (flavors.Flavor, error) {
	p.catMu.Lock()
	all, at := p.flavors, p.flavorsAt
	p.catMu.Unlock()
	f, err := chooseFlavor(all, pl)
	if err == nil && time.Since(at) < catalogTTL {
		return f, nil
	}
	if all, err = p.loadFlavors(ctx, cl); err != nil {
		return flavors.Flavor{}, err
	}
	f, err = chooseFlavor(all, pl)
	if err != nil {
		return flavors.Flavor{}, fmt.Errorf("label %s: %w", pl.Name, err)
	}
	return f, nil
}

// QuotaForLabel is what one node of a label holds: its flavor's cores and
// RAM, one instance, and its volume when it boots from one. It errs until
// the flavors are known.
func (p *Provider) QuotaForLabel(pool, label string) (drivers.Resources, error) {
	_, pl, err := p.cfg.PoolLabel(pool, label)
	if err != nil {
		return drivers.Resources{}, err
	}
	p.catMu.Lock()
	all := p.flavors
	p.catMu.Unlock()
	if all == nil {
		return drivers.Resources{}, fmt.Errorf("provider %s: the cloud's flavors are not known yet", p.cfg.Name)
	}
	f, err := chooseFlavor(all, pl)
	if err != nil {
		return drivers.Resources{}, fmt.Errorf("label %s: %w", label, err)
	}
	r := drivers.Resources{Instances: 1, Cores: f.VCPUs, RAM: f.RAM}
	if pl.BootFromVolume {
		r.Other = volumeResources(pl.VolumeSize)
	}
	return r, nil
}

// volumeResources is what a boot volume of size GB holds.
func volumeResources(size int) map[string]int {
	return map[string]int{drivers.ResourceVolumes: 1, drivers.ResourceVolumeGB: size}
}

func orUnlimited(v int) int {
	if v < 0 {
		return drivers.Unlimited
	}
	return v
}

// usesVolumes reports whether a label of the provider boots from a volume.
func (p *Provider) usesVolumes() bool {
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			if pl.BootFromVolume {
				return true
			}
		}
	}
	return false
}

// QuotaLimits is the project's quota: Nova's absolute limits (instances,
// cores, RAM) and, for providers that boot from volumes, Cinder's (volumes
// and gigabytes, less what volumes that are not this provider's hold; the
// launcher takes off what other servers hold from ListInstances). A
// limit of -1 is unlimited; an unlimited volume resource is left out.
func (p *Provider) QuotaLimits(ctx context.Context) (drivers.Resources, error) {
	cl, err := p.client(ctx)
	if err != nil {
		return drivers.Resources{}, err
	}
	lim, err := novalimits.Get(ctx, cl.compute, nil).Extract()
	if err != nil {
		return drivers.Resources{}, wrapf(err, "reading compute limits")
	}
	a := lim.Absolute
	r := drivers.Resources{Instances: orUnlimited(a.MaxTotalInstances), Cores: orUnlimited(a.MaxTotalCores), RAM: orUnlimited(a.MaxTotalRAMSize)}
	if cl.volume == nil || !p.usesVolumes() {
		return r, nil
	}
	vl, err := cinderlimits.Get(ctx, cl.volume).Extract()
	if err != nil {
		return drivers.Resources{}, wrapf(err, "reading volume limits")
	}
	ours, oursGB, err := p.ourVolumes(ctx, cl)
	if err != nil {
		return drivers.Resources{}, err
	}
	r.Other = map[string]int{}
	if v := vl.Absolute.MaxTotalVolumes; v >= 0 {
		r.Other[drivers.ResourceVolumes] = v - (vl.Absolute.TotalVolumesUsed - ours)
	}
	if v := vl.Absolute.MaxTotalVolumeGigabytes; v >= 0 {
		r.Other[drivers.ResourceVolumeGB] = v - (vl.Absolute.TotalGigabytesUsed - oursGB)
	}
	return r, nil
}

// ourVolumes counts the volumes tagged as this provider's.
func (p *Provider) ourVolumes(ctx context.Context, cl *clients) (n, gb int, err error) {
	vs, err := p.listVolumes(ctx, cl)
	if err != nil {
		return 0, 0, err
	}
	for _, v := range vs {
		n++
		gb += v.Size
	}
	return n, gb, nil
}

// listVolumes lists the volumes tagged as this provider's.
func (p *Provider) listVolumes(ctx context.Context, cl *clients) ([]volumes.Volume, error) {
	pages, err := volumes.List(cl.volume, volumes.ListOpts{Metadata: map[string]string{drivers.TagProvider: p.cfg.Name}}).AllPages(ctx)
	if err != nil {
		return nil, wrapf(err, "listing volumes")
	}
	vs, err := volumes.ExtractVolumes(pages)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(vs, func(v volumes.Volume) bool { return v.Metadata[drivers.TagProvider] != p.cfg.Name }), nil
}

// listingAge is how old the server watch's listing that ListInstances
// answers from may be.
const listingAge = time.Second

// ListInstances lists every server of the project, ours (tagged) and
// others, from the server watch (a listing of what changed since the last
// one, at most listingAge old).
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	all, err := p.watch.snapshot(ctx, listingAge)
	if err != nil {
		return nil, err
	}
	out := make([]drivers.Instance, 0, len(all))
	for i := range all {
		out = append(out, p.toInstance(&all[i]))
	}
	return out, nil
}

var _ drivers.Liveness = (*Provider)(nil)

// ListingAge: ListInstances answers from a listing at most listingAge old.
func (p *Provider) ListingAge() time.Duration { return listingAge }

// availabilityZones are the zones a pool's nodes go to: its
// availability-zones, or all the cloud's.
func (p *Provider) availabilityZones(ctx context.Context, cl *clients, pool *config.Pool) ([]string, error) {
	if len(pool.AvailabilityZones) > 0 {
		return pool.AvailabilityZones, nil
	}
	p.catMu.Lock()
	azs, at := p.azs, p.azsAt
	p.catMu.Unlock()
	if azs != nil && time.Since(at) < catalogTTL {
		return azs, nil
	}
	err := p.lookups.do(ctx, "availability-zones", func() error {
		pages, err := availabilityzones.List(cl.compute).AllPages(ctx)
		if err != nil {
			return wrapf(err, "listing availability zones")
		}
		infos, err := availabilityzones.ExtractAvailabilityZones(pages)
		if err != nil {
			return err
		}
		azs := []string{}
		for _, z := range infos {
			if z.ZoneState.Available {
				azs = append(azs, z.ZoneName)
			}
		}
		slices.Sort(azs)
		p.catMu.Lock()
		p.azs, p.azsAt = azs, time.Now()
		p.catMu.Unlock()
		return nil
	})
	p.catMu.Lock()
	defer p.catMu.Unlock()
	return p.azs, err
}

// chooseAZ picks a node's availability zone as Nodepool spreads them: at
// random across requests, the same for every node of one request (the
// zone is derived from the request id), or the one the node record names.
func chooseAZ(req *drivers.CreateRequest, azs []string) string {
	if req.AZ != "" {
		return req.AZ
	}
	if len(azs) == 0 {
		return ""
	}
	key := req.NodeID
	if req.Request != nil && req.Request.ID != "" {
		key = req.Request.ID
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return azs[int(h.Sum32()%uint32(len(azs)))]
}

// resolve finds the id of a cloud image or network by id or name,
// remembering it for a while.
func (p *Provider) resolve(ctx context.Context, kind, ref string, find func(ctx context.Context, ref string) (string, error)) (string, error) {
	key := kind + "/" + ref
	p.catMu.Lock()
	c, ok := p.names[key]
	p.catMu.Unlock()
	if ok && time.Since(c.at) < catalogTTL {
		return c.id, nil
	}
	err := p.lookups.do(ctx, key, func() error {
		id, err := find(ctx, ref)
		if err != nil {
			return err
		}
		p.catMu.Lock()
		p.names[key] = cached{id: id, at: time.Now()}
		p.catMu.Unlock()
		return nil
	})
	if err != nil {
		return "", err
	}
	p.catMu.Lock()
	defer p.catMu.Unlock()
	return p.names[key].id, nil
}

// forget drops a remembered id (the image or network is gone).
func (p *Provider) forget(kind, ref string) {
	p.catMu.Lock()
	delete(p.names, kind+"/"+ref)
	p.catMu.Unlock()
}

// findImage finds an active image by id, else by name (one only).
func (p *Provider) findImage(cl *clients) func(ctx context.Context, ref string) (string, error) {
	return func(ctx context.Context, ref string) (string, error) {
		if img, err := images.Get(ctx, cl.image, ref).Extract(); err == nil {
			if img.Status != images.ImageStatusActive {
				return "", fmt.Errorf("image %s is %s, not active", ref, img.Status)
			}
			return img.ID, nil
		} else if err = classify(err); !errors.Is(err, drivers.ErrNotFound) && !statusIs(err, 400) {
			return "", fmt.Errorf("looking up image %s: %w", ref, err)
		}
		return p.findImageByName(cl)(ctx, ref)
	}
}

// findImageByName finds the one active image of a name.
func (p *Provider) findImageByName(cl *clients) func(ctx context.Context, ref string) (string, error) {
	return func(ctx context.Context, ref string) (string, error) {
		pages, err := images.List(cl.image, images.ListOpts{Name: ref, Status: images.ImageStatusActive}).AllPages(ctx)
		if err != nil {
			return "", wrapf(err, "looking up image %s", ref)
		}
		found, err := images.ExtractImages(pages)
		if err != nil {
			return "", err
		}
		switch len(found) {
		case 0:
			return "", fmt.Errorf("cloud image %q: no active image has that id or name", ref)
		case 1:
			return found[0].ID, nil
		}
		return "", fmt.Errorf("cloud image %q: %d active images have that name; give its image-id", ref, len(found))
	}
}

// findNetwork finds a network by id, else by name (one only).
func (p *Provider) findNetwork(cl *clients) func(ctx context.Context, ref string) (string, error) {
	return func(ctx context.Context, ref string) (string, error) {
		for _, opts := range []networks.ListOpts{{ID: ref}, {Name: ref}} {
			pages, err := networks.List(cl.network, opts).AllPages(ctx)
			if err != nil {
				return "", wrapf(err, "looking up network %s", ref)
			}
			found, err := networks.ExtractNetworks(pages)
			if err != nil {
				return "", err
			}
			switch len(found) {
			case 0:
				continue
			case 1:
				return found[0].ID, nil
			}
			return "", fmt.Errorf("network %q: %d networks have that name; give its id", ref, len(found))
		}
		return "", fmt.Errorf("network %q: no network has that id or name", ref)
	}
}

// findExternalNetwork finds the network floating IPs come from.
func (p *Provider) findExternalNetwork(cl *clients) func(ctx context.Context, _ string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		pages, err := networks.List(cl.network, externalNetworks{}).AllPages(ctx)
		if err != nil {
			return "", wrapf(err, "looking up the external network")
		}
		found, err := networks.ExtractNetworks(pages)
		if err != nil {
			return "", err
		}
		if len(found) == 0 {
			return "", fmt.Errorf("the cloud has no external network to take floating IPs from")
		}
		slices.SortFunc(found, func(a, b networks.Network) int { return strings.Compare(a.Name, b.Name) })
		return found[0].ID, nil
	}
}

// externalNetworks lists networks with router:external set.
type externalNetworks struct{}

func (externalNetworks) ToNetworkListQuery() (string, error) { return "?router:external=true", nil }
