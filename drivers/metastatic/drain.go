package metastatic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodepool-nats/nodepool/kv"
)

// Drain is called every cleanup sweep while the provider is drained (it
// was removed from the configuration; drivers.Drainer): its backing
// requests are withdrawn (the nodes of fulfilled ones, not taken, go back
// to their pool) and each backing node it holds is given back (used: its
// own provider deletes it) once no carved node uses a slot of it. It
// returns how many backing requests and nodes it still holds. The carved
// nodes themselves are deleted as any node is.
func (p *Provider) Drain(ctx context.Context) (int, error) {
	if err := p.synced(ctx); err != nil {
		return 0, err
	}
	carved := false // a carved node record of the provider is left
	p.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		carved = e.Value.Provider == p.cfg.Name
		return !carved
	})
	held := 0
	var errs []error
	var requests []kv.Entry[kv.Request]
	p.requests.Range(func(e *kv.Entry[kv.Request]) bool {
		if e.Value.Requestor == p.me {
			requests = append(requests, *e)
		}
		return true
	})
	for _, e := range requests {
		held++
		if err := p.b.Requests.Delete(ctx, e.Key, e.Revision); err != nil && !errors.Is(err, kv.ErrNotFound) && !errors.Is(err, kv.ErrConflict) {
			errs = append(errs, fmt.Errorf("withdrawing backing request %s: %w", e.Key, err))
		}
	}
	var give []string
	p.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		d, isHeld, err := p.held(&e.Value)
		if !isHeld {
			return true
		}
		held++
		// A slot map that cannot be read says nothing of its slots: such
		// a node goes once no carved node is left at all.
		if (err == nil && d.Used() == 0) || (err != nil && !carved) {
			give = append(give, e.Key)
		}
		return true
	})
	now := time.Now().UTC()
	for _, id := range give {
		_, err := p.nodes.Modify(ctx, id, func(n *kv.Node) error {
			d, isHeld, err := p.held(n)
			if !isHeld || (err == nil && d.Used() > 0) {
				return kv.ErrSkip
			}
			if err == nil {
				d.Released = &now
				n.UserData = encodeJSON(d)
			}
			n.SetState(kv.NodeUsed, now)
			return nil
		})
		switch {
		case err == nil:
			p.log.Info("gave back a backing node of a removed provider", "backing_node", id)
		case !errors.Is(err, kv.ErrSkip) && !errors.Is(err, kv.ErrNotFound):
			errs = append(errs, fmt.Errorf("giving back backing node %s: %w", id, err))
		}
	}
	return held, errors.Join(errs...)
}
