package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
)

// Bucket names (public contract).
const (
	BucketRequests   = "nodepool-requests"
	BucketNodes      = "nodepool-nodes"
	BucketImages     = "nodepool-images"
	BucketComponents = "nodepool-components"
	BucketLocks      = "nodepool-locks"
	// BucketProviders holds, per provider, its configuration section as
	// a launcher last loaded it (ProviderRecord), so that a provider
	// removed from the configuration can still be drained.
	BucketProviders = "nodepool-providers"
)

// Options shape the buckets a process creates.
type Options struct {
	// Replicas for every bucket: 1, 3 or 5.
	Replicas int
	// LeaseTTL is how long a component heartbeat or a lease lives without
	// renewal.
	LeaseTTL time.Duration
	// Missing, if set, is told the name of a bucket's stream (KV_<bucket>)
	// when a call on it or a cache's watch finds it gone: the process's
	// repair keeper (internal/repair) looks at once.
	Missing func(stream string)
}

// Buckets are the stores of every bucket of the contract.
type Buckets struct {
	Requests   *Store[Request]
	Nodes      *Store[Node]
	Components *Store[Component]
	Locks      *Store[LeaseRecord]
	Images     jetstream.KeyValue
	// Providers are the providers' remembered configuration sections,
	// set by Ensure (Open leaves them out: see OpenProviders).
	Providers *Store[ProviderRecord]
	// LeaseTTL is the TTL of the components and locks buckets as they
	// are: the life of every heartbeat and lease, whatever a process was
	// configured with (0 if it could not be read).
	LeaseTTL time.Duration
	// missing is Options.Missing, for the caches of Images.
	missing func(stream string)
}

// ReportMissing tells Options.Missing (if Ensure had one) that a stream
// the process depends on was found gone: a consumer's stream, an object
// store's (OBJ_<store>), a bucket's (KV_<bucket>; the stores tell it
// themselves).
func (b *Buckets) ReportMissing(stream string) {
	if b != nil && b.missing != nil {
		b.missing(stream)
	}
}

// BucketConfigs returns the configuration of each bucket.
func BucketConfigs(o Options) []jetstream.KeyValueConfig {
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 10 * time.Second
	}
	return []jetstream.KeyValueConfig{
		{Bucket: BucketRequests, Description: "node requests", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas},
		{Bucket: BucketNodes, Description: "nodes", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas},
		{Bucket: BucketImages, Description: "image builds and uploads", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas},
		{Bucket: BucketComponents, Description: "live launchers and builders (heartbeat)", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas,
			TTL: o.LeaseTTL, LimitMarkerTTL: markerTTL(o.LeaseTTL)},
		{Bucket: BucketLocks, Description: "leases", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas,
			TTL: o.LeaseTTL, LimitMarkerTTL: markerTTL(o.LeaseTTL)},
		{Bucket: BucketProviders, Description: "providers' configuration sections, kept to drain removed providers", History: 1, Storage: jetstream.FileStorage, Replicas: o.Replicas},
	}
}

// markerTTL is how long an expiry marker stays: long enough for every
// watcher to see it.
func markerTTL(ttl time.Duration) time.Duration { return max(ttl, time.Minute) }

// Ensure creates the buckets that do not exist yet. A bucket that exists with
// other settings is used as it is, with a warning. The buckets are opened
// at once, each with two requests when it exists (its stream's info, then
// the bucket), so that a process restarting in a cluster busy electing
// leaders waits out the slowest bucket, not the sum of them.
//
// The lease TTL is the buckets' (Buckets.LeaseTTL): every process must
// renew its heartbeat and leases within the same TTL, so a process
// configured with another one adopts the buckets' and says so (the
// process that created the buckets chose it). Components and locks
// buckets whose TTLs differ (changed by hand) are refused.
func Ensure(ctx context.Context, js jetstream.JetStream, o Options, log *slog.Logger) (*Buckets, error) {
	cfgs := BucketConfigs(o)
	kvs := make([]jetstream.KeyValue, len(cfgs))
	streams := make([]jetstream.StreamConfig, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { kvs[i], streams[i], errs[i] = ensureBucket(ctx, js, cfg, log) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	byName := map[string]int{}
	for i, cfg := range cfgs {
		byName[cfg.Bucket] = i
	}
	b := &Buckets{
		Requests:   newStore[Request](js, kvs[byName[BucketRequests]]).Reporting(o.Missing),
		Nodes:      newStore[Node](js, kvs[byName[BucketNodes]]).Reporting(o.Missing),
		Images:     kvs[byName[BucketImages]],
		Components: newStore[Component](js, kvs[byName[BucketComponents]]).Reporting(o.Missing),
		Locks:      newStore[LeaseRecord](js, kvs[byName[BucketLocks]]).Reporting(o.Missing),
		Providers:  newStore[ProviderRecord](js, kvs[byName[BucketProviders]]).Reporting(o.Missing),
		LeaseTTL:   streams[byName[BucketComponents]].MaxAge,
		missing:    o.Missing,
	}
	if lock := streams[byName[BucketLocks]].MaxAge; b.LeaseTTL != lock {
		return nil, fmt.Errorf("buckets %s (TTL %s) and %s (TTL %s) must have the same TTL, the lease TTL; recreate one of them with the other's",
			BucketComponents, b.LeaseTTL, BucketLocks, lock)
	}
	if o.LeaseTTL != 0 && b.LeaseTTL != 0 && b.LeaseTTL != o.LeaseTTL {
		log.Warn("the lease TTL of this process differs from the buckets' TTL; using the buckets' so that every process agrees (change it by recreating the nodepool-components and nodepool-locks buckets with every process stopped)",
			"configured", o.LeaseTTL, "buckets", b.LeaseTTL)
	}
	return b, nil
}

// Consumer limits of the buckets' streams. Requestors may watch the
// records, which makes a consumer per watch; the limits bound what a
// buggy or hostile one can make: how many, and how long one lives idle
// (a watch ends, or its consumer goes after this long without use). The
// node-lifecycle consumer of versions before the work stream is removed
// so once no process of such a version pulls from it.
const (
	MaxBucketConsumers    = 10000
	MaxConsumerInactivity = 24 * time.Hour
)

// limitConsumers sets the consumer limits of a bucket's stream, whose
// configuration is sc, unless they are set already (as these or by an
// operator), and returns the configuration as it is then.
func limitConsumers(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (jetstream.StreamConfig, error) {
	if sc.MaxConsumers > 0 && sc.ConsumerLimits.InactiveThreshold > 0 {
		return sc, nil
	}
	if sc.MaxConsumers <= 0 {
		sc.MaxConsumers = MaxBucketConsumers
	}
	if sc.ConsumerLimits.InactiveThreshold <= 0 {
		sc.ConsumerLimits.InactiveThreshold = MaxConsumerInactivity
	}
	st, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.UpdateStream(ctx, sc) })
	if err != nil {
		return sc, err
	}
	return st.CachedInfo().Config, nil
}

// bucketTTL reads a bucket's TTL, waiting out what a cluster electing a
// leader answers meanwhile (an unreadable TTL is an error, never a TTL
// of 0).
func bucketTTL(ctx context.Context, b jetstream.KeyValue) (time.Duration, error) {
	st, err := natsretry.Do(ctx, b.Status)
	if err != nil {
		return 0, fmt.Errorf("reading the TTL of bucket %s: %w", b.Bucket(), err)
	}
	return st.TTL(), nil
}

// EnsureBucket creates a bucket, or opens it if it exists (with a warning
// when its settings differ), sets its consumer limits (see limitConsumers)
// and returns it once it answers. In a cluster, a create that another
// process started a moment before is acknowledged before every server
// knows the bucket, and a server still electing a leader answers nothing:
// both are waited out. A replicated bucket reads from its stream's leader
// (ReadFromLeader).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, log *slog.Logger) (jetstream.KeyValue, error) {
	b, _, err := ensureBucket(ctx, js, cfg, log)
	return b, err
}

// ensureBucket is EnsureBucket, returning the configuration of the
// bucket's stream as well. An existing bucket costs two requests: its
// stream's info, which has all there is to check, and the opening of the
// bucket.
func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, log *slog.Logger) (jetstream.KeyValue, jetstream.StreamConfig, error) {
	name := "KV_" + cfg.Bucket
	info := func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) }
	st, err := natsretry.Do(ctx, info)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// A server that has not caught up yet may not know a bucket that
		// exists: the create then finds it, and changes nothing.
		if cfg, err = createBucket(ctx, js, cfg, log); err != nil {
			return nil, jetstream.StreamConfig{}, err
		}
		st, err = natsretry.Await(ctx, jetstream.ErrStreamNotFound, info)
	}
	if err != nil {
		return nil, jetstream.StreamConfig{}, fmt.Errorf("opening bucket %s: %w", cfg.Bucket, err)
	}
	sc := st.CachedInfo().Config
	have := kvConfig(sc)
	if differ := bucketDiffers(cfg, have); len(differ) > 0 {
		log.Warn("bucket exists with other settings; using it as it is", "bucket", cfg.Bucket,
			"want_ttl", cfg.TTL, "want_history", cfg.History, "want_replicas", cfg.Replicas,
			"have_ttl", have.TTL, "have_history", have.History, "have_replicas", have.Replicas, "differs", differ)
	}
	if sc, err = limitConsumers(ctx, js, sc); err != nil {
		return nil, jetstream.StreamConfig{}, fmt.Errorf("setting the consumer limits of bucket %s: %w", cfg.Bucket, err)
	}
	b, err := awaitBucket(ctx, js, cfg.Bucket)
	if err != nil {
		return nil, jetstream.StreamConfig{}, fmt.Errorf("opening bucket %s: %w", cfg.Bucket, err)
	}
	return readFromLeader(js, b, sc), sc, nil
}

// createBucket creates a bucket, without TTL markers if the server has
// none, and returns the configuration it was created with. A bucket that
// another process created meanwhile is no error.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, log *slog.Logger) (jetstream.KeyValueConfig, error) {
	create := func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) }
	_, err := natsretry.Do(ctx, create)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		log.Warn("the NATS server does not support TTL markers; lease expiry is noticed by polling", "bucket", cfg.Bucket)
		cfg.LimitMarkerTTL = 0
		_, err = natsretry.Do(ctx, create)
	}
	switch {
	case errors.Is(err, jetstream.ErrBucketExists):
		log.Debug("bucket made by another process meanwhile", "bucket", cfg.Bucket)
	case err != nil:
		return cfg, fmt.Errorf("creating bucket %s: %w", cfg.Bucket, err)
	default:
		log.Debug("bucket created", "bucket", cfg.Bucket)
	}
	return cfg, nil
}

// kvConfig is what a bucket's stream configuration says of the bucket's
// settings.
func kvConfig(sc jetstream.StreamConfig) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: strings.TrimPrefix(sc.Name, "KV_"), TTL: sc.MaxAge, History: uint8(min(max(sc.MaxMsgsPerSubject, 0), 64)),
		Replicas: sc.Replicas, Storage: sc.Storage, MaxBytes: sc.MaxBytes, MaxValueSize: sc.MaxMsgSize,
		LimitMarkerTTL: sc.SubjectDeleteMarkerTTL,
	}
}

// awaitBucket opens a bucket that was just created or found.
func awaitBucket(ctx context.Context, js jetstream.JetStream, name string) (jetstream.KeyValue, error) {
	return natsretry.Await(ctx, jetstream.ErrBucketNotFound, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, name)
	})
}

// OpenProviders opens the nodepool-providers bucket, the operators' and
// the service's (a requestor may not read it: Open leaves it out); nil if
// it does not exist (no launcher of a version that has it has run
// against this server).
func OpenProviders(ctx context.Context, js jetstream.JetStream) (*Store[ProviderRecord], error) {
	b, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, BucketProviders) })
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("opening bucket %s: %w", BucketProviders, err)
	}
	if b, err = ReadFromLeader(ctx, js, b); err != nil {
		return nil, err
	}
	return newStore[ProviderRecord](js, b), nil
}

// Open opens the buckets, which must exist, but for nodepool-providers
// (OpenProviders).
func Open(ctx context.Context, js jetstream.JetStream) (*Buckets, error) {
	open := func(name string) (jetstream.KeyValue, error) {
		b, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, name) })
		if err != nil {
			return nil, fmt.Errorf("opening bucket %s (is nodepool running against this server?): %w", name, err)
		}
		if b, err = ReadFromLeader(ctx, js, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	var bs Buckets
	var err error
	var b jetstream.KeyValue
	if b, err = open(BucketRequests); err != nil {
		return nil, err
	}
	bs.Requests = newStore[Request](js, b)
	if b, err = open(BucketNodes); err != nil {
		return nil, err
	}
	bs.Nodes = newStore[Node](js, b)
	if b, err = open(BucketComponents); err != nil {
		return nil, err
	}
	bs.Components = newStore[Component](js, b)
	if b, err = open(BucketLocks); err != nil {
		return nil, err
	}
	bs.Locks = newStore[LeaseRecord](js, b)
	if bs.Images, err = open(BucketImages); err != nil {
		return nil, err
	}
	if bs.LeaseTTL, err = bucketTTL(ctx, bs.Components.kv); err != nil {
		return nil, err
	}
	return &bs, nil
}

// bucketDiffers names the settings of want that have differs from.
func bucketDiffers(want, have jetstream.KeyValueConfig) []string {
	var out []string
	add := func(differs bool, name string) {
		if differs {
			out = append(out, name)
		}
	}
	add(want.TTL != have.TTL, "ttl")
	add(max(want.History, 1) != max(have.History, 1), "history")
	add(max(want.Replicas, 1) != max(have.Replicas, 1), "replicas")
	add(want.Storage != have.Storage, "storage")
	add(want.MaxBytes > 0 && want.MaxBytes != have.MaxBytes, "max_bytes")
	add(want.MaxValueSize > 0 && want.MaxValueSize != have.MaxValueSize, "max_value_size")
	add(want.LimitMarkerTTL != have.LimitMarkerTTL, "limit_marker_ttl")
	return out
}
