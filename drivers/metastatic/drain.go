package metastatic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodepool-nats/nodepool/record"
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
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
		carved = e.Value.Provider == p.cfg.Name
		return !carved
	})
	held, errs := p.withdrawRequests(ctx)
	heldNodes, give := p.givable(carved)
	held += heldNodes
	now := p.clock.Now().UTC()
	for _, id := range give {
		if err := p.giveBack(ctx, id, now); err != nil {
			errs = append(errs, err)
		}
	}
	return held, errors.Join(errs...)
}

// withdrawRequests deletes the backing requests of ours; it returns how
// many there were, and why those that could not be deleted could not.
func (p *Provider) withdrawRequests(ctx context.Context) (int, []error) {
	var errs []error
	var requests []record.Entry[record.Request]
	p.requests.Range(func(e *record.Entry[record.Request]) bool {
		if e.Value.Requestor == p.me {
			requests = append(requests, *e)
		}
		return true
	})
	for _, e := range requests {
		if err := p.requests.Delete(ctx, e.Key, e.Revision); err != nil && !errors.Is(err, record.ErrNotFound) && !errors.Is(err, record.ErrConflict) {
			errs = append(errs, fmt.Errorf("withdrawing backing request %s: %w", e.Key, err))
		}
	}
	return len(requests), errs
}

// givable counts the backing nodes the provider holds, and returns those
// it can give back now: those no carved node uses a slot of.
func (p *Provider) givable(carved bool) (int, []string) {
	held := 0
	var give []string
	p.nodes.Range(func(e *record.Entry[record.Node]) bool {
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
	return held, give
}

// giveBack gives a backing node of a removed provider back (used), unless
// a slot of it was taken meanwhile.
func (p *Provider) giveBack(ctx context.Context, id string, now time.Time) error {
	_, err := p.nodes.Modify(ctx, id, func(n *record.Node) error {
		d, isHeld, err := p.held(n)
		if !isHeld || (err == nil && d.Used() > 0) {
			return record.ErrSkip
		}
		if err == nil {
			d.Released = &now
			n.UserData = encodeJSON(d)
		}
		n.SetState(record.NodeUsed, now)
		return nil
	})
	switch {
	case err == nil:
		p.log.Info("gave back a backing node of a removed provider", "backing_node", id)
	case !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound):
		return fmt.Errorf("giving back backing node %s: %w", id, err)
	}
	return nil
}
