package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/nodepool-nats/nodepool/kv"
)

// Errors of the guarded node commands.
var (
	// ErrHeldByOther: the node is taken by another holder, or allocated to
	// a request that has not taken it yet.
	ErrHeldByOther = errors.New("the node belongs to someone else")
	// ErrOnHold: the node is on hold.
	ErrOnHold = errors.New("the node is on hold")
)

// Guard says on whose behalf an operator gives back or deletes a node.
type Guard struct {
	// Holder is who acts: a node taken by this holder is theirs.
	Holder string
	// Force skips the checks.
	Force bool
}

// minReadyRequestor is consumers.MinReadyRequestor: nodes kept ready for
// min-ready belong to no one.
const minReadyRequestor = "NodePool:min-ready"

// check refuses a node that is someone else's or on hold; request reads
// the request a ready node is allocated to.
func (g Guard) check(ctx context.Context, n *kv.Node, requests *kv.Store[kv.Request]) error {
	if g.Force {
		return nil
	}
	switch {
	case n.State == kv.NodeHold:
		why := n.Comment
		if why == "" {
			why = "no reason given"
		}
		return fmt.Errorf("%w (%s)", ErrOnHold, why)
	case n.Holder != "" && n.Holder != g.Holder && n.State == kv.NodeInUse:
		return fmt.Errorf("%w: in use by %q, not by %q", ErrHeldByOther, n.Holder, g.Holder)
	case n.AllocatedTo != "" && n.State == kv.NodeReady:
		r, err := requests.Get(ctx, n.AllocatedTo)
		if errors.Is(err, kv.ErrNotFound) || (err == nil && (r.Value.Requestor == minReadyRequestor || r.Value.State == kv.RequestFailed)) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: allocated to request %s of %q", ErrHeldByOther, n.AllocatedTo, r.Value.Requestor)
	}
	return nil
}
