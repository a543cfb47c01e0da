package aws

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/drivers"
)

// The instance watch answers every create and delete machine of the
// provider that waits on an instance's state with one DescribeInstances
// per poll, for all the instances asked about since the last one, instead
// of one call per instance per poll: 500 booting instances cost a call
// every poll interval, not 500, and the provider's rate stays for the
// launches themselves. A poll starts at most every pollInterval, or every
// two poll durations when polls grow long, or every five paced calls when
// the provider has a rate (so that polling takes at most a fifth of it).
const (
	pollInterval = 250 * time.Millisecond
	// filterValues is EC2's limit of values in one filter.
	filterValues = 200
)

type instanceWatch struct {
	p *Provider

	mu        sync.Mutex
	next      *describeBatch // collecting ids; nil when none is
	lastStart time.Time
	lastTook  time.Duration
}

// describeBatch is one poll: the ids asked about before it started and,
// once done is closed, what EC2 said of them.
type describeBatch struct {
	ids  map[string]struct{}
	done chan struct{}
	got  map[string]ec2types.Instance
	err  error
}

// get returns the instance as a poll that started after this call shows
// it; ok is false when EC2 does not know it (not yet, or no longer).
func (w *instanceWatch) get(ctx context.Context, id string) (in ec2types.Instance, ok bool, err error) {
	w.mu.Lock()
	b := w.next
	if b == nil {
		b = &describeBatch{ids: map[string]struct{}{}, done: make(chan struct{})}
		w.next = b
		go w.run(b)
	}
	b.ids[id] = struct{}{}
	w.mu.Unlock()
	select {
	case <-ctx.Done():
		return in, false, ctx.Err()
	case <-b.done:
	}
	if b.err != nil {
		return in, false, b.err
	}
	in, ok = b.got[id]
	return in, ok, nil
}

// run waits out the interval since the last poll, closes the batch to
// new ids (they start the next one) and describes its instances.
func (w *instanceWatch) run(b *describeBatch) {
	w.mu.Lock()
	interval := max(pollInterval, 2*w.lastTook)
	if r := w.p.cfg.Rate; r > 0 {
		interval = max(interval, time.Duration(5*float64(time.Second)/r))
	}
	next := w.lastStart.Add(interval)
	w.mu.Unlock()
	if d := time.Until(next); d > 0 {
		t := time.NewTimer(d)
		<-t.C
	}
	w.mu.Lock()
	w.next = nil
	ids := slices.Sorted(maps.Keys(b.ids))
	start := time.Now()
	w.lastStart = start
	w.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, paced := drivers.WithPacedWaitMeter(ctx)
	// A poll whose answer was lost on the way (the connection closed
	// under it) is made again by the SDK's retryer, as every call is.
	b.got, b.err = w.p.describeInstances(ctx, ids)
	w.mu.Lock()
	// What the poll cost the cloud: its time less its turns at the rate.
	w.lastTook = time.Since(start) - paced()
	w.mu.Unlock()
	close(b.done)
}

// maxLostPolls is how many polls in a row a machine waiting on its
// instance lets go unanswered before it fails.
const maxLostPolls = 5

// lostPolls counts the polls in a row whose answer was lost on the way
// (the connection closed under it, even after the SDK's retries; the
// SDK's own cause of that is worked around in internal/awsbody, a network
// has others). A poll is a read: losing its answer says nothing about the
// instance, so the machine polls again, a few times, instead of failing
// its launch or delete.
type lostPolls int

// again reports whether err is a lost answer the machine should poll
// again after, and counts it; any other outcome starts the count again.
func (l *lostPolls) again(err error) bool {
	if err == nil || !unanswered(err) || *l >= maxLostPolls {
		*l = 0
		return false
	}
	*l++
	return true
}

// describeInstances describes the instances with these ids, by a filter
// (an unknown id is left out instead of failing the whole call), in
// chunks of EC2's filter limit and page by page.
func (p *Provider) describeInstances(ctx context.Context, ids []string) (map[string]ec2types.Instance, error) {
	got := make(map[string]ec2types.Instance, len(ids))
	for chunk := range slices.Chunk(ids, filterValues) {
		pg := ec2.NewDescribeInstancesPaginator(p.ec2, &ec2.DescribeInstancesInput{
			Filters: []ec2types.Filter{{Name: sdkaws.String("instance-id"), Values: chunk}}})
		for pg.HasMorePages() {
			out, err := pg.NextPage(ctx)
			if err != nil {
				return nil, fmt.Errorf("describing %d instance(s): %w", len(chunk), classify(err))
			}
			for _, r := range out.Reservations {
				for _, in := range r.Instances {
					got[sdkaws.ToString(in.InstanceId)] = in
				}
			}
		}
	}
	return got, nil
}

var _ drivers.Owner = (*Provider)(nil)

// Owns reports whether the instance was made for the node by this
// provider (its tags), as the instance watch sees it.
func (p *Provider) Owns(ctx context.Context, externalID, nodeID string) (bool, error) {
	in, ok, err := p.watch.get(ctx, externalID)
	if err != nil {
		return false, fmt.Errorf("describing instance %s: %w", externalID, err)
	}
	if !ok {
		return false, fmt.Errorf("instance %s: %w", externalID, drivers.ErrNotFound)
	}
	return drivers.OwnedBy(tagMap(in.Tags), p.cfg.Name, nodeID), nil
}
