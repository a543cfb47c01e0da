// Package events names the JetStream subjects and streams of the public
// contract, defines the messages that travel on them, and publishes them.
package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/internal/token"
)

// Streams and subjects (public contract).
const (
	RequestsStream  = "NODEPOOL_REQUESTS"
	RequestsSubject = "nodepool.requests.>"
	// NewRequestSubject is where clients without an identity of their
	// own publish node requests (their owner is Anonymous).
	NewRequestSubject = "nodepool.requests.new"
	// OwnedRequestSubjects is where a requestor publishes requests under
	// its identity: nodepool.requests.<owner>.new (nats.conf lets each
	// requestor user publish on its own only).
	OwnedRequestSubjects = "nodepool.requests.*.new"
	// APISubjects are the requestor's endpoints: nodepool.api.<owner>.<verb>.
	APISubjects = "nodepool.api.*.*"

	// IntakeConsumer is the durable consumer of RequestsStream (the
	// launchers' worker group) that turns request messages into request
	// records; it acknowledges a message once its record is written.
	IntakeConsumer = "intake"

	BuildsStream   = "NODEPOOL_BUILDS"
	BuildsSubject  = "nodepool.builds.>"
	UploadsSubject = "nodepool.uploads.>"
)

// BuildSubject is the trigger subject of an image build.
// Names are written as one token each (a dot becomes "="; see
// internal/token).
func BuildSubject(image string) string { return "nodepool.builds." + token.Encode(image) }

// UploadSubject is the trigger subject of an image upload to a provider.
func UploadSubject(image, provider string) string {
	return "nodepool.uploads." + token.Encode(image) + "." + token.Encode(provider)
}

// RequestsRetention is how long request messages stay in their stream. The
// stream is the inbox; the request records are the state.
const RequestsRetention = 24 * time.Hour

// DuplicateWindow is how long a Nats-Msg-Id makes a resubmission a no-op.
const DuplicateWindow = 2 * time.Minute

// StreamConfigs returns the configuration of each stream.
func StreamConfigs(replicas int) []jetstream.StreamConfig {
	if replicas == 0 {
		replicas = 1
	}
	return []jetstream.StreamConfig{
		{
			Name:        RequestsStream,
			Description: "node requests from clients",
			Subjects:    []string{RequestsSubject},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      RequestsRetention,
			Duplicates:  DuplicateWindow,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
		},
		{
			Name:        BuildsStream,
			Description: "image build and upload triggers",
			Subjects:    []string{BuildsSubject, UploadsSubject},
			Retention:   jetstream.WorkQueuePolicy,
			Duplicates:  DuplicateWindow,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
		},
		workStreamConfig(replicas),
	}
}

// Ensure creates the streams that do not exist yet, all at once. A stream
// that exists with other settings is used as it is, with a warning. In a
// cluster, a leader election and a stream another process just created
// are waited out (see natsretry).
func Ensure(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) error {
	cfgs := StreamConfigs(replicas)
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { errs[i] = EnsureStream(ctx, js, cfg, log) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// EnsureStream creates one stream if it does not exist yet (see Ensure).
// A stream that differs only by its first sequence (the requests stream
// made again, see Remake) is the same stream.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, log *slog.Logger) error {
	create := func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, cfg) }
	_, err := natsretry.Do(ctx, create)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		if s, serr := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, cfg.Name) }); serr == nil &&
			s.CachedInfo().Config.FirstSeq != cfg.FirstSeq {
			cfg.FirstSeq = s.CachedInfo().Config.FirstSeq
			_, err = natsretry.Do(ctx, create)
		}
	}
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		log.Warn("stream exists with other settings; using it as it is", "stream", cfg.Name)
		err = nil
	}
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", cfg.Name, err)
	}
	if _, err := natsretry.Await(ctx, jetstream.ErrStreamNotFound, func(ctx context.Context) (jetstream.Stream, error) {
		return js.Stream(ctx, cfg.Name)
	}); err != nil {
		return fmt.Errorf("opening stream %s: %w", cfg.Name, err)
	}
	return nil
}

// NamedBySequence reports whether records name the messages of a stream
// by their sequence (a request without an id of its own, the trigger a
// build answers): its last sequence is to be followed, so that the stream
// made again continues past it (Remake). Work is named by its subject and
// message id.
func NamedBySequence(stream string) bool {
	return stream == RequestsStream || stream == BuildsStream
}

// RemadeSequenceGap is how far past the last sequence seen of a deleted
// stream the stream made again starts: more than could be published
// between that reading (within a second of a publication) and the
// deletion.
const RemadeSequenceGap = 100000

// Remake makes a deleted stream again. Records name messages by their
// sequence, and outlive the stream: a request without an id of its own is
// named after its sequence, a build records the sequence of the trigger it
// answers. So the stream made again starts its sequences RemadeSequenceGap
// past last, the last sequence seen of the old one, so that no new message
// is taken for an old one.
func Remake(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, last uint64, log *slog.Logger) error {
	cfg.FirstSeq = last + RemadeSequenceGap
	return EnsureStream(ctx, js, cfg, log)
}
