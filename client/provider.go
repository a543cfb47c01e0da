package client

import (
	"context"
	"errors"
	"slices"

	"github.com/nodepool-nats/nodepool/kv"
)

// ProviderData is what the buckets hold about one provider (`nodepool
// info`): its image uploads and its nodes.
type ProviderData struct {
	Uploads []kv.ImageUpload
	Nodes   []kv.Node
	// ServedBy are the live launchers that announce a pool of the
	// provider.
	ServedBy []string
	// Remembered is the provider's record in nodepool-providers (its
	// configuration section as a launcher last loaded it, and whether it
	// drains), nil if there is none.
	Remembered *kv.ProviderRecord
}

// Providers opens the providers' remembered configuration sections
// (nodepool-providers; nil if the bucket does not exist). Operators'
// credentials read it; a requestor's may not.
func (c *Client) Providers(ctx context.Context) (*kv.Store[kv.ProviderRecord], error) {
	if c.b.Providers != nil {
		return c.b.Providers, nil
	}
	return kv.OpenProviders(ctx, c.js)
}

// ProviderData reads what the buckets hold about a provider, configured
// or not.
func (c *Client) ProviderData(ctx context.Context, provider string) (ProviderData, error) {
	var d ProviderData
	uploads, err := c.Images().Uploads.List(ctx)
	if err != nil {
		return d, err
	}
	for _, e := range uploads {
		if e.Value.Provider == provider {
			d.Uploads = append(d.Uploads, e.Value)
		}
	}
	nodes, err := c.b.Nodes.List(ctx)
	if err != nil {
		return d, err
	}
	for _, e := range nodes {
		if e.Value.Provider == provider {
			d.Nodes = append(d.Nodes, e.Value)
		}
	}
	comps, err := c.b.Components.List(ctx)
	if err != nil {
		return d, err
	}
	for _, e := range comps {
		for _, p := range e.Value.Pools {
			if p.Provider == provider && !slices.Contains(d.ServedBy, e.Value.ID) {
				d.ServedBy = append(d.ServedBy, e.Value.ID)
			}
		}
	}
	providers, err := c.Providers(ctx)
	if err != nil {
		return d, err
	}
	if providers != nil {
		e, err := providers.Get(ctx, kv.ProviderKey(provider))
		switch {
		case err == nil:
			d.Remembered = &e.Value
		case !errors.Is(err, kv.ErrNotFound):
			return d, err
		}
	}
	return d, nil
}

// EraseProvider removes the node records and upload records of a provider
// from the buckets (`nodepool erase`), as Nodepool erased its ZooKeeper
// data, and its remembered configuration section, so that the launchers
// stop draining it: the cloud's instances and images are not touched. It
// returns how many node and upload records it removed.
func (c *Client) EraseProvider(ctx context.Context, provider string) (nodes, uploads int, err error) {
	ns, err := c.b.Nodes.List(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ns {
		if e.Value.Provider != provider {
			continue
		}
		gone, err := removeRecord(ctx, c.b.Nodes, e, func(n *kv.Node) bool { return n.Provider == provider })
		if err != nil {
			return nodes, uploads, err
		}
		if gone {
			nodes++
		}
	}
	us := c.Images().Uploads
	es, err := us.List(ctx)
	if err != nil {
		return nodes, uploads, err
	}
	for _, e := range es {
		if e.Value.Provider != provider {
			continue
		}
		gone, err := removeRecord(ctx, us, e, func(u *kv.ImageUpload) bool { return u.Provider == provider })
		if err != nil {
			return nodes, uploads, err
		}
		if gone {
			uploads++
		}
	}
	// Its remembered configuration goes too: the launchers no longer try
	// to drain it (nothing of it is left in the records to drain).
	providers, err := c.Providers(ctx)
	if err != nil {
		return nodes, uploads, err
	}
	if providers != nil {
		if e, err := providers.Get(ctx, kv.ProviderKey(provider)); err == nil {
			if _, err := removeRecord(ctx, providers, e, func(*kv.ProviderRecord) bool { return true }); err != nil {
				return nodes, uploads, err
			}
		} else if !errors.Is(err, kv.ErrNotFound) {
			return nodes, uploads, err
		}
	}
	return nodes, uploads, nil
}

// removeRecord deletes a record at the revision it was read, reading it
// again when it changed meanwhile, as long as match still holds.
func removeRecord[T any](ctx context.Context, s *kv.Store[T], e kv.Entry[T], match func(*T) bool) (bool, error) {
	for {
		err := s.Delete(ctx, e.Key, e.Revision)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, kv.ErrConflict) {
			return false, err
		}
		e, err = s.Get(ctx, e.Key)
		if errors.Is(err, kv.ErrNotFound) {
			return false, nil
		}
		if err != nil && !errors.Is(err, kv.ErrBadRecord) {
			return false, err
		}
		if err == nil && !match(&e.Value) {
			return false, nil
		}
	}
}
