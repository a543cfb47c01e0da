package aws

import (
	"context"
	"fmt"
	"slices"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// loadTypes reads the vCPUs and memory of instance types not known yet.
func (p *Provider) loadTypes(ctx context.Context, names []string) error {
	p.mu.Lock()
	var missing []string
	for _, n := range names {
		if _, ok := p.types[n]; !ok && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	p.mu.Unlock()
	for len(missing) > 0 {
		batch := missing[:min(len(missing), 100)]
		missing = missing[len(batch):]
		pg := ec2.NewDescribeInstanceTypesPaginator(p.ec2, &ec2.DescribeInstanceTypesInput{
			InstanceTypes: sdkTypes(batch)})
		for pg.HasMorePages() {
			out, err := pg.NextPage(ctx)
			if err != nil {
				return fmt.Errorf("describing instance types %v: %w", batch, classify(err))
			}
			p.mu.Lock()
			for _, it := range out.InstanceTypes {
				t := instanceType{}
				if it.VCpuInfo != nil && it.VCpuInfo.DefaultVCpus != nil {
					t.VCPUs = int(*it.VCpuInfo.DefaultVCpus)
				}
				if it.MemoryInfo != nil && it.MemoryInfo.SizeInMiB != nil {
					t.MemoryMiB = int(*it.MemoryInfo.SizeInMiB)
				}
				p.types[string(it.InstanceType)] = t
			}
			p.mu.Unlock()
		}
	}
	return nil
}

func sdkTypes(names []string) []ec2types.InstanceType {
	out := make([]ec2types.InstanceType, len(names))
	for i, n := range names {
		out[i] = ec2types.InstanceType(n)
	}
	return out
}

// typeOf returns a known instance type.
func (p *Provider) typeOf(name string) (instanceType, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.types[name]
	return t, ok
}

// resources is what an instance of a type holds against quota: its vCPUs
// as cores and under its quota code, its memory as RAM (MiB), as
// Nodepool counts them.
func (p *Provider) resources(typ string, spot bool) (drivers.Resources, bool) {
	t, ok := p.typeOf(typ)
	r := drivers.Resources{Instances: 1}
	if !ok {
		return r, false
	}
	r.Cores, r.RAM = t.VCPUs, t.MemoryMiB
	if code := awsquota.Code(typ, spot); code != "" {
		r.Other = map[string]int{code: t.VCPUs}
	}
	return r, true
}

// QuotaForLabel is what one node of a label costs: its instance type's
// vCPUs and memory, under the quota code of its family (spot or on
// demand). A fleet label costs the most of any of its types, in each
// resource.
func (p *Provider) QuotaForLabel(pool, label string) (drivers.Resources, error) {
	_, pl, err := p.cfg.PoolLabel(pool, label)
	if err != nil {
		return drivers.Resources{}, err
	}
	types := []string{pl.InstanceType}
	if pl.Fleet != nil {
		types = pl.Fleet.InstanceTypes
	}
	if _, ok := p.typeOf(types[0]); !ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.loadTypes(ctx, types); err != nil {
			return drivers.Resources{Instances: 1}, err
		}
	}
	out := drivers.Resources{Instances: 1}
	for _, t := range types {
		r, ok := p.resources(t, pl.UseSpot)
		if !ok {
			return drivers.Resources{Instances: 1}, fmt.Errorf("instance type %s is not offered in %s", t, p.cfg.RegionName)
		}
		out.Cores, out.RAM = max(out.Cores, r.Cores), max(out.RAM, r.RAM)
		for k, v := range r.Other {
			if out.Other == nil {
				out.Other = map[string]int{}
			}
			out.Other[k] = max(out.Other[k], v)
		}
	}
	return out, nil
}

// quotaCodes are the vCPU quota codes the provider's labels count against.
func (p *Provider) quotaCodes() []string {
	var out []string
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			types := []string{pl.InstanceType}
			if pl.Fleet != nil {
				types = pl.Fleet.InstanceTypes
			}
			for _, t := range types {
				for _, spot := range []bool{pl.UseSpot, false} {
					if c := awsquota.Code(t, spot); c != "" && !slices.Contains(out, c) {
						out = append(out, c)
					}
					if !pl.UseSpot || pl.OnDemandFallback == 0 {
						break
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// QuotaLimits is the account's vCPU quotas the provider's labels count
// against, from Service Quotas, read again after QuotaRefresh. Instances,
// cores and RAM are not limited by AWS.
func (p *Provider) QuotaLimits(ctx context.Context) (drivers.Resources, error) {
	p.mu.Lock()
	fresh := p.quotas != nil && time.Since(p.quotasAt) < p.opts.QuotaRefresh
	cached := p.quotas
	p.mu.Unlock()
	out := drivers.Resources{Instances: drivers.Unlimited, Cores: drivers.Unlimited, RAM: drivers.Unlimited}
	if !fresh {
		read := map[string]int{}
		for _, c := range p.quotaCodes() {
			q, err := p.sq.GetServiceQuota(ctx, &servicequotas.GetServiceQuotaInput{
				ServiceCode: sdkaws.String(awsquota.ServiceCode), QuotaCode: sdkaws.String(c)})
			if err != nil {
				if code(err) == "NoSuchResourceException" {
					continue // not a quota of this account: no limit
				}
				return out, fmt.Errorf("reading quota %s: %w", c, classify(err))
			}
			if q.Quota != nil && q.Quota.Value != nil {
				read[c] = int(*q.Quota.Value)
			}
		}
		p.mu.Lock()
		p.quotas, p.quotasAt, cached = read, time.Now(), read
		p.mu.Unlock()
	}
	if len(cached) > 0 {
		out.Other = make(map[string]int, len(cached))
		for k, v := range cached {
			out.Other[k] = v
		}
	}
	return out, nil
}
