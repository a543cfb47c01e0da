// Package durable runs the durable consumers of the worker groups and makes
// one again, within seconds, when it is deleted: by an operator (`nats
// consumer rm`), or with its stream. Without it, a worker group whose
// consumer is gone waits for ever.
package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/wait"
)

// ErrUnavailable: Next found no consumer to pull from (it is being made
// again, or its server is between two leaders); the caller just asks again.
var ErrUnavailable = errors.New("the consumer is not available")

// floorEvery is how often the ack floor of a consumer with Resume is read
// by default (Options.FloorEvery): the floor a consumer made again starts
// from is at most this old. A
// consumer without Resume is looked at only when a pull suggests it is
// gone (the server ends the pulls of a deleted consumer at once, and a
// pull that hears no heartbeat says so): an idle process asks nothing.
const floorEvery = 30 * time.Second

// Options say which consumer to keep.
type Options struct {
	// Stream is the stream the consumer reads.
	Stream string
	// Config is the consumer's configuration; Durable names it.
	Config jetstream.ConsumerConfig
	// Resume makes a consumer made again (its stream still the same)
	// start after the last message the old one had acknowledged, as last
	// read (at most FloorEvery ago), instead of where Config says: for a
	// stream whose old messages must not be handled again (request
	// messages whose records were deleted long ago). What was acknowledged
	// since that read is delivered again: the handler must find it done.
	// A stream made again is read from where Config says.
	Resume bool
	// FloorEvery is how often the ack floor is read with Resume (0:
	// floorEvery).
	FloorEvery time.Duration
	// Missing, if set, is told the stream's name when the consumer finds
	// its stream gone: the process's repair keeper (internal/repair)
	// makes it again, and the consumer after it.
	Missing func(stream string)
	Log     *slog.Logger
}

// Consumer is a durable consumer that is made again when it is deleted.
type Consumer struct {
	js   jetstream.JetStream
	opts Options
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	cons jetstream.Consumer
	// made is closed, and replaced, each time the consumer is made again;
	// gen counts those times.
	made chan struct{}
	gen  int
	// ackFloor is the consumer's ack floor as last read, and created the
	// time its stream was made (to tell the same stream from one made
	// again).
	ackFloor uint64
	created  time.Time
	// madeAt is when the consumer as last seen was made: another time
	// means another process made it again.
	madeAt time.Time

	suspect chan struct{}
	// stop ends Consume, which consuming waits for.
	stop      chan struct{}
	stopOnce  sync.Once
	consuming sync.WaitGroup
}

// Open makes the consumer, or opens it and updates its settings (keeping
// where it starts: a consumer made again by Resume keeps its start), and
// watches it until ctx ends or Stop.
func Open(ctx context.Context, js jetstream.JetStream, o Options) (*Consumer, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	c := &Consumer{js: js, opts: o, made: make(chan struct{}), suspect: make(chan struct{}, 1), stop: make(chan struct{}),
		log: o.Log.With("consumer", o.Config.Durable, "stream", o.Stream)}
	cons, _, err := c.make(ctx, false)
	if err != nil {
		return nil, err
	}
	c.cons = cons
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, c.cancel)
	c.wg.Go(func() {
		defer stop()
		c.watch()
	})
	return c, nil
}

// current returns the consumer, the count of times it was made again and
// a channel closed the next time it is.
func (c *Consumer) current() (jetstream.Consumer, int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cons, c.gen, c.made
}

// maybeGone asks the watch to look at the consumer now.
func (c *Consumer) maybeGone() {
	select {
	case c.suspect <- struct{}{}:
	default:
	}
}

// gone reports whether an error of a pull may mean that the consumer, or
// its stream, no longer exists.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoHeartbeat)
}

// Consume runs handle for each message, as jetstream.Consumer.Consume
// does, until Stop; after the consumer was made again it consumes from the
// new one. The error is that of the first start.
func (c *Consumer) Consume(handle jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) error {
	cons, gen, _ := c.current()
	cc, err := c.consume(cons, handle, opts)
	if err != nil {
		return err
	}
	c.consuming.Go(func() { c.keepConsuming(cc, gen, handle, opts) })
	return nil
}

func (c *Consumer) consume(cons jetstream.Consumer, handle jetstream.MessageHandler, opts []jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	opts = append(opts[:len(opts):len(opts)], jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if gone(err) {
			c.maybeGone()
		}
	}))
	return cons.Consume(handle, opts...)
}

// keepConsuming starts consuming again whenever the consumer was made
// again, or waits for it when the library ended the consumption (the
// consumer was deleted); Stop drains the consumption and ends it.
func (c *Consumer) keepConsuming(cc jetstream.ConsumeContext, gen int, handle jetstream.MessageHandler, opts []jetstream.PullConsumeOpt) {
	for {
		cons, now, made := c.current()
		if now == gen {
			select {
			case <-c.stop:
				cc.Drain()
				<-cc.Closed()
				return
			case <-made:
			case <-cc.Closed():
				// The library ended it: the consumer was deleted (it
				// is made again) or the connection closed.
				c.maybeGone()
				select {
				case <-c.stop:
					return
				case <-made:
				case <-time.After(time.Second):
				}
			}
			cons, now, _ = c.current()
		}
		cc.Stop()
		<-cc.Closed()
		for failures := 0; ; failures++ {
			next, err := c.consume(cons, handle, opts)
			if err == nil {
				cc, gen = next, now
				break
			}
			c.log.Warn("could not consume from the consumer made again; retrying", "err", err)
			select {
			case <-c.stop:
				return
			case <-time.After(min(wait.Backoff(failures), 2*time.Second)):
			}
			cons, now, _ = c.current()
		}
	}
}

// pullHeartbeat is how often the server tells a long pull of Next that it
// still holds it.
const pullHeartbeat = 5 * time.Second

// Next waits up to maxWait for the next message, as jetstream.Consumer.Next
// does; a pull of 15 s or more hears heartbeats, and ends with
// ErrUnavailable (after a look at the consumer) when they stop. When there is no consumer to pull from, it waits a moment (for the
// consumer to be made again, at most a second) and returns ErrUnavailable.
func (c *Consumer) Next(ctx context.Context, maxWait time.Duration) (jetstream.Msg, error) {
	cons, made, fctx, opts, cancel := c.pull(ctx, maxWait)
	defer cancel()
	msg, err := cons.Next(opts...)
	if err == nil || !gone(err) {
		return msg, err
	}
	return nil, c.unavailable(fctx, made, err)
}

// Fetch asks for at most n messages, as jetstream.Consumer.Fetch does,
// and runs handle for each as it comes, until n came or maxWait passed; it
// returns how many came. Like Next, a long pull hears heartbeats, and a
// consumer that is gone makes it return ErrUnavailable after a look.
func (c *Consumer) Fetch(ctx context.Context, n int, maxWait time.Duration, handle func(jetstream.Msg)) (int, error) {
	cons, made, fctx, opts, cancel := c.pull(ctx, maxWait)
	defer cancel()
	batch, err := cons.Fetch(n, opts...)
	got := 0
	if err == nil {
		for m := range batch.Messages() {
			got++
			handle(m)
		}
		err = batch.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = nil // maxWait passed
	}
	if err == nil || !gone(err) {
		return got, err
	}
	return got, c.unavailable(fctx, made, err)
}

// pull is the consumer to pull from now, the channel closed when it is
// made again, and the context and options of a pull of maxWait.
func (c *Consumer) pull(ctx context.Context, maxWait time.Duration) (jetstream.Consumer, <-chan struct{}, context.Context, []jetstream.FetchOpt, context.CancelFunc) {
	cons, _, made := c.current()
	fctx, cancel := context.WithTimeout(ctx, maxWait)
	opts := []jetstream.FetchOpt{jetstream.FetchContext(fctx)}
	if maxWait >= 3*pullHeartbeat {
		// A long pull lost with its server is noticed by the heartbeats
		// it stops hearing, not only when it expires.
		opts = append(opts, jetstream.FetchHeartbeat(pullHeartbeat))
	}
	return cons, made, fctx, opts, cancel
}

// unavailable has the consumer looked at after a pull said it may be gone,
// waits a moment for it to be made again, and wraps the pull's error.
func (c *Consumer) unavailable(fctx context.Context, made <-chan struct{}, err error) error {
	c.maybeGone()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-made:
	case <-fctx.Done():
	case <-t.C:
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Stop stops taking messages (a running Consume is drained: the handler
// has returned for every message it took) and stops watching the consumer.
// Calling it again does nothing.
func (c *Consumer) Stop() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.consuming.Wait()
		c.cancel()
		c.wg.Wait()
	})
}

// watch looks at the consumer when a pull suggests it is gone, and every
// floorEvery with Resume; a consumer that is gone is made again.
func (c *Consumer) watch() {
	var tick <-chan time.Time
	if c.opts.Resume {
		t := time.NewTicker(cmp.Or(c.opts.FloorEvery, floorEvery))
		defer t.Stop()
		tick = t.C
	}
	var repeats wait.Repeats
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick:
		case <-c.suspect:
		}
		cons, _, _ := c.current()
		ictx, cancel := context.WithTimeout(c.ctx, natsretry.AttemptTimeout)
		info, err := cons.Info(ictx)
		cancel()
		switch {
		case err == nil:
			c.mu.Lock()
			moved := c.ackFloor != info.AckFloor.Stream
			c.ackFloor = info.AckFloor.Stream
			again := !info.Created.Equal(c.madeAt)
			c.mu.Unlock()
			if moved && c.opts.Resume {
				c.log.Debug("ack floor read", "ack_floor", info.AckFloor.Stream)
			}
			if again {
				// Deleted and made again by another process between two
				// looks: consume from it afresh.
				c.log.Info("the consumer was made again by another process")
				c.noted(c.ctx, cons)
				c.renewed(cons)
			}
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
			c.streamMaybeGone(err)
			c.repair(&repeats)
		case c.ctx.Err() == nil:
			c.log.Debug("could not read the consumer's state", "err", err)
		}
	}
}

// repair makes the consumer again; when it is needed again and again, it
// waits longer each time (wait.Repeats), so as not to fight an operator
// who keeps deleting it.
func (c *Consumer) repair(repeats *wait.Repeats) {
	if d := repeats.Next(time.Now()); d > 0 {
		c.log.Warn("the consumer is missing again; making it again after a pause", "pause", d)
		if !wait.Sleep(c.ctx, d) {
			return
		}
	}
	// Several processes notice at once: a random pause lets one make it
	// and the others find it made.
	if !wait.Sleep(c.ctx, time.Duration(rand.Int64N(int64(200*time.Millisecond)))) {
		return
	}
	var (
		cons    jetstream.Consumer
		existed bool
		err     error
	)
	for failures := 0; ; failures++ {
		cons, existed, err = c.make(c.ctx, true)
		if err == nil {
			break
		}
		if c.ctx.Err() != nil {
			return
		}
		c.streamMaybeGone(err)
		if failures == 0 {
			c.log.Warn("the consumer is missing and cannot be made again yet; retrying", "err", err)
		}
		if !wait.Sleep(c.ctx, min(wait.Backoff(failures), 2*time.Second)) {
			return
		}
	}
	if existed {
		c.log.Info("the consumer was missing; another process made it again")
	} else {
		c.log.Warn("the consumer was missing; made it again")
	}
	c.renewed(cons)
}

// streamMaybeGone tells Options.Missing of an error that says the stream
// is gone.
func (c *Consumer) streamMaybeGone(err error) {
	if c.opts.Missing != nil && errors.Is(err, jetstream.ErrStreamNotFound) {
		c.opts.Missing(c.opts.Stream)
	}
}

// renewed makes a consumer made again the one to consume from.
func (c *Consumer) renewed(cons jetstream.Consumer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cons = cons
	c.gen++
	close(c.made)
	c.made = make(chan struct{})
}

// make makes the consumer, or opens it if it exists (another process
// made it), updating its settings but not where it starts. When repair
// is set and Options.Resume, a consumer made anew on the same stream
// starts after the ack floor last read. It reports whether the consumer
// existed.
func (c *Consumer) make(ctx context.Context, repair bool) (jetstream.Consumer, bool, error) {
	name := c.opts.Config.Durable
	for {
		cfg := c.opts.Config
		existing, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return c.js.Consumer(ctx, c.opts.Stream, name)
		})
		switch {
		case err == nil:
			have := existing.CachedInfo().Config
			cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
			cons, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
				return c.js.CreateOrUpdateConsumer(ctx, c.opts.Stream, cfg)
			})
			if err != nil {
				return nil, false, fmt.Errorf("updating consumer %s of %s: %w", name, c.opts.Stream, err)
			}
			c.noted(ctx, cons)
			return cons, true, nil
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return nil, false, fmt.Errorf("opening consumer %s of %s: %w", name, c.opts.Stream, err)
		}
		if repair && c.opts.Resume {
			if seq, ok := c.resumeAt(ctx); ok {
				cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, seq, nil
				c.log.Info("the consumer made again starts after the last message it had acknowledged", "sequence", seq)
			}
		}
		cons, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return c.js.CreateConsumer(ctx, c.opts.Stream, cfg)
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			continue // another process made it a moment ago, starting elsewhere
		}
		if err != nil {
			return nil, false, fmt.Errorf("creating consumer %s of %s: %w", name, c.opts.Stream, err)
		}
		c.noted(ctx, cons)
		return cons, false, nil
	}
}

// noted records the ack floor of a consumer just made or opened, when it
// was made, and when its stream was made.
//
// Both come from a consumer info read afterwards, as the watch reads them:
// the answer of a create-or-update of a consumer that a restarted server
// loaded from its store gives the time it was loaded as the consumer's
// creation (nats-server 2.15.2), where every info gives the original one,
// and the watch would take every consumer as made again by another
// process after every restart.
func (c *Consumer) noted(ctx context.Context, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if fresh, err := natsretry.Do(ctx, cons.Info); err == nil {
		info = fresh
	}
	c.mu.Lock()
	c.ackFloor = info.AckFloor.Stream
	c.madeAt = info.Created
	c.created = time.Time{}
	c.mu.Unlock()
	s, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, c.opts.Stream) })
	if err != nil {
		return
	}
	c.mu.Lock()
	c.created = s.CachedInfo().Created
	c.mu.Unlock()
}

// resumeAt is where a consumer made again starts: after the ack floor
// last read, if its stream is the one it was read on.
func (c *Consumer) resumeAt(ctx context.Context) (uint64, bool) {
	c.mu.Lock()
	floor, created := c.ackFloor, c.created
	c.mu.Unlock()
	if created.IsZero() {
		return 0, false
	}
	s, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, c.opts.Stream) })
	if err != nil || !s.CachedInfo().Created.Equal(created) {
		return 0, false
	}
	return floor + 1, true
}
