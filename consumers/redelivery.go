package consumers

import (
	"math/rand/v2"
	"time"
)

// Redelivery bounds of the worker groups. A message is delivered again when
// its handler could not commit its effect (it is NAKed with a delay that
// grows with each delivery) or did not answer within the consumer's ack
// wait. Past MaxDeliver the server stops delivering it, so nothing loops
// for ever:
//
//   - intake: at most intakeMaxDeliver deliveries, NAKed 1 s doubling up to
//     1 min (about 4 minutes in all); the last delivery records the
//     request as failed, with the reason and without its requestor_data,
//     and acknowledges it;
//   - launches and deletes (the work stream): at most lifecycleMaxDeliver
//     deliveries, NAKed 100 ms doubling up to 5 s (work that needs a
//     process with the node's provider, pool or label, or one that is not
//     fenced, is delivered again this way; a launch waiting for a slot of
//     max-concurrency is not delivered at all, see work.go); work dropped
//     past the bound leaves a node that cleanup's revisit sweep writes
//     again, which asks for it again.
const (
	intakeMaxDeliver    = 10
	lifecycleMaxDeliver = 100
)

// intakeAckWait is how long the intake's consumer waits for the answer
// to a delivery before it delivers the message again (a process killed
// mid-message, or a message that was on its way when the consumer's
// server went away, which only this wait brings back). The handler is
// quick: one KV write.
const intakeAckWait = 10 * time.Second

// backoff is base doubling with each delivery after the first, at most
// limit, less up to a quarter at random so that messages NAKed together do
// not all come back together.
func backoff(delivered uint64, base, limit time.Duration) time.Duration {
	d := limit
	if n := min(delivered, 30); n > 0 && base<<(n-1) < limit && base<<(n-1) > 0 {
		d = base << (n - 1)
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// redeliveryDelay is the NAK delay of a node change delivered n times.
func redeliveryDelay(delivered uint64) time.Duration {
	return backoff(delivered, 100*time.Millisecond, 5*time.Second)
}

// intakeDelay is the NAK delay of a request message delivered n times.
func intakeDelay(delivered uint64) time.Duration {
	return backoff(delivered, time.Second, time.Minute)
}
