package metastatic

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/events"
)

// intakePoll is how often a new term of the manager asks the intake
// consumer how far it got.
const intakePoll = 50 * time.Millisecond

// awaitIntake waits, at most filedTimeout, until every request message
// published before it was called is recorded (the intake consumer
// acknowledges a message once its record is written), then until the
// provider's view of the requests holds those records. A term of the
// manager calls it first: it may follow a term of another process (the
// lease moved), whose backing requests published but not yet recorded
// are in no view of this process's and would be requested again. Without
// an intake consumer (none made yet) there is nothing to wait for.
func (p *Provider) awaitIntake(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, filedTimeout)
	defer cancel()
	s, err := p.js.Stream(ctx, events.RequestsStream)
	if err != nil {
		return
	}
	info, err := s.Info(ctx)
	if err != nil {
		return
	}
	last := info.State.LastSeq
	c, err := s.Consumer(ctx, events.IntakeConsumer)
	if err != nil {
		if !errors.Is(err, jetstream.ErrConsumerNotFound) && ctx.Err() == nil {
			p.log.Warn("could not read the intake consumer; the manager starts without waiting for it", "err", err)
		}
		return
	}
	tick := time.NewTicker(intakePoll)
	defer tick.Stop()
	for {
		ci, err := c.Info(ctx)
		if err == nil && (ci.AckFloor.Stream >= last || (ci.NumPending == 0 && ci.NumAckPending == 0)) {
			break
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				p.log.Warn("the intake has not recorded the requests published before this term of the manager began; it starts all the same", "last_sequence", last)
			}
			return
		case <-tick.C:
		}
	}
	if err := p.requests.Sync(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn("could not bring the view of the requests up to date", "err", err)
	}
}
