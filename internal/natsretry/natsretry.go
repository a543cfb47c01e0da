// Package natsretry makes calls to NATS again when they failed only
// because the cluster was between two leaders, a server restarted or the
// connection was being re-established: the calls a requestor makes must
// get through an election, and a plain error there would lose a request
// or strand a node.
package natsretry

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/wait"
)

// AttemptTimeout bounds one try of a call: long enough for a loaded
// server, short enough that a try lost in an election is made again soon.
const AttemptTimeout = 5 * time.Second

// maxWait is the longest pause between two tries.
const maxWait = 2 * time.Second

// Transient reports whether err may pass if the same call is made again:
// the server did not answer in time, nobody answered (a stream between
// two leaders, a server restarting), or the connection is being
// re-established. A refusal (a revision conflict, a bad record, a
// permission) is not.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	var legacyErr nats.JetStreamError // KV watches still speak the older API
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded):
		return true
	case errors.As(err, &apiErr):
		// 503: JetStream, or the stream's group, has no leader right now.
		return apiErr.Code == 503
	case errors.As(err, &legacyErr):
		return legacyErr.APIError() != nil && legacyErr.APIError().Code == 503
	}
	return false
}

// Do runs call until it succeeds, fails for good, or ctx ends; each try
// gets AttemptTimeout. The call must be safe to make again: a publish
// carries a Nats-Msg-Id, an update is revision-checked and accepts the
// state that an earlier try which did land left behind.
func Do[T any](ctx context.Context, call func(ctx context.Context) (T, error)) (T, error) {
	for failures := 0; ; failures++ {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		v, err := call(actx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return v, err
		}
		if !wait.Sleep(ctx, min(wait.Backoff(failures), maxWait)) {
			return v, err
		}
	}
}

// appears bounds how long Await waits for something just created.
const appears = 30 * time.Second

// Await opens something that was just created (a bucket, a stream), by
// this process or another: besides what Do waits out, a not-found
// (notFound) is waited out for a while, since a cluster acknowledges a
// create before every server knows what it made.
func Await[T any](ctx context.Context, notFound error, open func(ctx context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(appears)
	for {
		v, err := Do(ctx, open)
		if err == nil || !errors.Is(err, notFound) || time.Now().After(deadline) {
			return v, err
		}
		if !wait.Sleep(ctx, 100*time.Millisecond) {
			return v, err
		}
	}
}
