// Package fake is a simulated cloud behind the driver interface: instances
// boot after a settable delay, fail at a settable rate, count against a
// settable quota and are deleted after a settable delay. Its instances live
// in a KV bucket of their own (fakecloud-<cloud>), so they outlive any one
// launcher process and every process sees the same cloud, as it would a real
// one.
package fake

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/kv"
)

// Instance statuses, as a cloud reports them.
const (
	StatusBuild    = "BUILD"
	StatusActive   = "ACTIVE"
	StatusError    = "ERROR"
	StatusShutoff  = "SHUTOFF"
	StatusDeleting = "DELETING"
)

// BucketName is the bucket holding a fake cloud's instances.
// A dot, which bucket names cannot hold, is written "_".
func BucketName(cloud string) string { return "fakecloud-" + strings.ReplaceAll(cloud, ".", "_") }

// Buckets are the configurations of the buckets of a fake cloud.
type Buckets struct {
	Instances jetstream.KeyValueConfig
	// API counts calls per second, for a cloud with an API rate limit
	// (nil without).
	API    *jetstream.KeyValueConfig
	Images jetstream.KeyValueConfig
}

// All lists the buckets.
func (b Buckets) All() []jetstream.KeyValueConfig {
	out := []jetstream.KeyValueConfig{b.Instances, b.Images}
	if b.API != nil {
		out = append(out, *b.API)
	}
	return out
}

// BucketConfigs returns the configurations of the buckets of a fake
// provider's cloud.
func BucketConfigs(cfg *config.Provider, replicas int) Buckets {
	b := Buckets{
		Instances: jetstream.KeyValueConfig{
			Bucket: BucketName(cfg.Cloud), Description: "instances of a simulated cloud",
			History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		},
		Images: jetstream.KeyValueConfig{
			Bucket: ImagesBucketName(cfg.Cloud), Description: "images of a simulated cloud",
			History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		},
	}
	if cfg.APIRateLimit > 0 {
		b.API = &jetstream.KeyValueConfig{
			Bucket: BucketName(cfg.Cloud) + "-api", Description: "API calls of a simulated cloud, per second",
			History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1), TTL: time.Hour,
		}
	}
	return b
}

// InstanceRecord is one instance of the fake cloud, as stored.
type InstanceRecord struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Token    string            `json:"token,omitempty"`
	Tags     map[string]string `json:"tags"`
	Flavor   string            `json:"flavor,omitempty"`
	Image    string            `json:"image,omitempty"`
	Cores    int               `json:"cores"`
	RAM      int               `json:"ram"`
	IPv4     string            `json:"ipv4"`
	Created  time.Time         `json:"created"`
	ReadyAt  time.Time         `json:"ready_at"`
	Fail     bool              `json:"fail,omitempty"`
	Stopped  bool              `json:"stopped,omitempty"` // shut off (Stop)
	DeleteAt *time.Time        `json:"delete_at,omitempty"`
}

// Status is the instance's status at a moment.
func (r *InstanceRecord) Status(now time.Time) string {
	switch {
	case r.DeleteAt != nil:
		return StatusDeleting
	case now.Before(r.ReadyAt):
		return StatusBuild
	case r.Fail:
		return StatusError
	case r.Stopped:
		return StatusShutoff
	}
	return StatusActive
}

// runState is whether an instance in a status runs.
func runState(status string) drivers.RunState {
	switch status {
	case StatusActive:
		return drivers.Running
	case StatusBuild:
		return drivers.Changing
	}
	return drivers.Down
}

// Provider is one fake provider: its pools' labels and flavors, and the
// simulated cloud it talks to.
type Provider struct {
	cfg   *config.Provider
	api   *kv.Store[apiWindow] // calls per second, when the cloud limits them
	store *kv.Store[InstanceRecord]
	cache *kv.Cache[InstanceRecord]
	log   *slog.Logger
	stop  func()

	mu  sync.Mutex
	rng *rand.Rand

	// used is what every instance of the cloud holds, kept as the cache
	// changes.
	usedMu sync.Mutex
	used   drivers.Resources

	// The cloud's image service (images.go).
	images      *kv.Store[ImageRecord]
	failUploads int
}

// Options are what a fake cloud is opened with besides its provider's
// configuration.
type Options struct {
	// Replicas of the cloud's buckets.
	Replicas int
	// Missing, if set, is told the name of a bucket's stream when a call
	// on it finds it gone (kv.Store.Reporting).
	Missing func(stream string)
}

// New opens (creating if needed) the fake cloud of a provider and starts
// watching its instances.
func New(ctx context.Context, js jetstream.JetStream, cfg *config.Provider, o Options, log *slog.Logger) (*Provider, error) {
	if cfg.Driver != "fake" {
		return nil, fmt.Errorf("provider %s: driver is %q, not fake", cfg.Name, cfg.Driver)
	}
	buckets := BucketConfigs(cfg, o.Replicas)
	bucket, err := kv.EnsureBucket(ctx, js, buckets.Instances, log)
	if err != nil {
		return nil, fmt.Errorf("provider %s: opening fake cloud %s: %w", cfg.Name, cfg.Cloud, err)
	}
	log = log.With("provider", cfg.Name, "cloud", cfg.Cloud)
	var api *kv.Store[apiWindow]
	if buckets.API != nil {
		ab, err := kv.EnsureBucket(ctx, js, *buckets.API, log)
		if err != nil {
			return nil, fmt.Errorf("provider %s: opening fake cloud API counters: %w", cfg.Name, err)
		}
		api = kv.NewStore[apiWindow](ab).Reporting(o.Missing)
	}
	p := &Provider{
		api:   api,
		cfg:   cfg,
		store: kv.NewStore[InstanceRecord](bucket).Reporting(o.Missing),
		log:   log,
		rng:   rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x9e3779b97f4a7c15)),
	}
	if err := p.openImages(ctx, js, buckets.Images, o.Missing); err != nil {
		return nil, err
	}
	p.cache = kv.NewCache(p.store, log)
	p.cache.Observe(p.account)
	p.stop = p.cache.Start()
	return p, nil
}

// Close stops watching the cloud.
func (p *Provider) Close() { p.stop() }

// apiWindow counts the calls the cloud took in one second, and how many
// it refused (all seconds' refusals add up in the "refused" key).
type apiWindow struct {
	Calls int `json:"calls"`
}

// apiCall simulates one cloud API call: the cloud's rate limit (shared by
// every client of the cloud, as a real cloud's is), then its latency.
func (p *Provider) apiCall(ctx context.Context) error {
	if err := p.admit(ctx); err != nil {
		return err
	}
	d := p.cfg.APIDelay.D()
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// admit counts a call against the cloud's per-second limit.
func (p *Provider) admit(ctx context.Context) error {
	if p.api == nil {
		return nil
	}
	key := fmt.Sprintf("s%d", time.Now().Unix())
	for {
		e, err := p.api.Get(ctx, key)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			_, err = p.api.Create(ctx, key, &apiWindow{Calls: 1})
			if errors.Is(err, kv.ErrExists) {
				continue
			}
			return err
		case err != nil:
			return err
		}
		if float64(e.Value.Calls) >= p.cfg.APIRateLimit {
			if _, err := p.api.Modify(ctx, "refused", func(w *apiWindow) error { w.Calls++; return nil }); errors.Is(err, kv.ErrNotFound) {
				_, _ = p.api.Create(ctx, "refused", &apiWindow{Calls: 1})
			}
			return fmt.Errorf("%w: cloud %s allows %g calls per second", drivers.ErrRateLimited, p.cfg.Cloud, p.cfg.APIRateLimit)
		}
		e.Value.Calls++
		if _, err := p.api.Update(ctx, key, &e.Value, e.Revision); errors.Is(err, kv.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
}

// Refused counts the calls the cloud refused for its rate limit.
func (p *Provider) Refused(ctx context.Context) (int, error) {
	if p.api == nil {
		return 0, nil
	}
	e, err := p.api.Get(ctx, "refused")
	if errors.Is(err, kv.ErrNotFound) {
		return 0, nil
	}
	return e.Value.Calls, err
}

// instanceID derives the instance id from the idempotency token, so that a
// create repeated with the same token finds the same instance.
func instanceID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "i-" + hex.EncodeToString(sum[:8])
}

// QuotaLimits is the cloud's quota from the configuration.
func (p *Provider) QuotaLimits(ctx context.Context) (drivers.Resources, error) {
	q := config.CloudQuota{}
	if p.cfg.Quota != nil {
		q = *p.cfg.Quota
	}
	orUnlimited := func(v int) int {
		if v <= 0 {
			return drivers.Unlimited
		}
		return v
	}
	return drivers.Resources{Instances: orUnlimited(q.Instances), Cores: orUnlimited(q.Cores), RAM: orUnlimited(q.RAM)}, nil
}

// poolLabel finds a label's entry in a pool.
func (p *Provider) poolLabel(pool, label string) (config.PoolLabel, error) {
	_, pl, err := p.cfg.PoolLabel(pool, label)
	if err != nil {
		return config.PoolLabel{}, err
	}
	return *pl, nil
}

// QuotaForLabel is the size of the label's flavor, and one instance.
func (p *Provider) QuotaForLabel(pool, label string) (drivers.Resources, error) {
	pl, err := p.poolLabel(pool, label)
	if err != nil {
		return drivers.Resources{}, err
	}
	r := drivers.Resources{Instances: 1}
	if f, ok := p.cfg.Flavor(pl.FlavorName); ok {
		r.Cores, r.RAM = f.Cores, f.RAM
	}
	return r, nil
}

// ListInstances lists every instance of the cloud, ours and others, as
// the cloud holds them when it is called (the cache catches up with every
// change made before the call, by any process).
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	if err := p.apiCall(ctx); err != nil {
		return nil, err
	}
	if err := p.cache.Sync(ctx); err != nil {
		return nil, err
	}
	out := make([]drivers.Instance, 0, p.cache.Len())
	p.cache.Range(func(e *kv.Entry[InstanceRecord]) bool {
		out = append(out, p.toInstance(&e.Value))
		return true
	})
	return out, nil
}

var _ drivers.Liveness = (*Provider)(nil)

// ListingAge is 0: a listing holds every change made before the call.
func (p *Provider) ListingAge() time.Duration { return 0 }

func (p *Provider) toInstance(r *InstanceRecord) drivers.Instance {
	status := r.Status(time.Now())
	return drivers.Instance{
		Run:         runState(status),
		Status:      status,
		ExternalID:  r.ID,
		Name:        r.Name,
		Tags:        r.Tags,
		Region:      "fake-region",
		AZ:          "fake-az",
		InterfaceIP: r.IPv4,
		PublicIPv4:  r.IPv4,
		PrivateIPv4: r.IPv4,
		ImageID:     r.Image,
		Resources:   drivers.Resources{Cores: r.Cores, RAM: r.RAM, Instances: 1},
	}
}

// account keeps the cloud's usage up to date with one change.
func (p *Provider) account(ch kv.Change[InstanceRecord]) {
	size := func(r *InstanceRecord) drivers.Resources {
		return drivers.Resources{Instances: 1, Cores: r.Cores, RAM: r.RAM}
	}
	p.usedMu.Lock()
	defer p.usedMu.Unlock()
	if ch.Old != nil {
		p.used = p.used.Sub(size(&ch.Old.Value))
	}
	if ch.New != nil {
		p.used = p.used.Add(size(&ch.New.Value))
	}
}

// usage is what every instance of the cloud holds.
func (p *Provider) usage() drivers.Resources {
	p.usedMu.Lock()
	defer p.usedMu.Unlock()
	return p.used
}

// Inject adds an instance that nodepool did not create (another tenant's, or
// a leaked one when tags are given), as a test or a demo would.
func (p *Provider) Inject(ctx context.Context, name string, tags map[string]string, cores, ram int) (string, error) {
	now := time.Now().UTC()
	rec := InstanceRecord{ID: instanceID(name + now.String()), Name: name, Tags: tags, Cores: cores, RAM: ram,
		IPv4: "192.0.2.1", Created: now, ReadyAt: now}
	if _, err := p.cache.Create(ctx, rec.ID, &rec); err != nil {
		return "", err
	}
	return rec.ID, nil
}

// Stop shuts an instance off (SHUTOFF), as someone running `openstack
// server stop` on it would; it stays, holding its quota.
func (p *Provider) Stop(ctx context.Context, id string) error {
	return p.change(ctx, id, func(r *InstanceRecord) { r.Stopped = true })
}

// Start starts a shut-off instance again (ACTIVE).
func (p *Provider) Start(ctx context.Context, id string) error {
	return p.change(ctx, id, func(r *InstanceRecord) { r.Stopped = false })
}

// Break puts an instance in ERROR, as a failing hypervisor would.
func (p *Provider) Break(ctx context.Context, id string) error {
	return p.change(ctx, id, func(r *InstanceRecord) { r.Fail = true })
}

// Remove deletes an instance at once, out of band, as someone running
// `openstack server delete` on it would.
func (p *Provider) Remove(ctx context.Context, id string) error {
	e, err := p.store.Get(ctx, id)
	if errors.Is(err, kv.ErrNotFound) {
		return fmt.Errorf("fake: instance %s: %w", id, drivers.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("fake: reading instance %s: %w", id, err)
	}
	if err := p.cache.Delete(ctx, id, e.Revision); err != nil {
		return fmt.Errorf("fake: deleting instance %s: %w", id, err)
	}
	return nil
}

// change changes an instance's record out of band.
func (p *Provider) change(ctx context.Context, id string, fn func(*InstanceRecord)) error {
	_, err := p.cache.Modify(ctx, id, func(r *InstanceRecord) error {
		fn(r)
		return nil
	})
	if errors.Is(err, kv.ErrNotFound) {
		return fmt.Errorf("fake: instance %s: %w", id, drivers.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("fake: changing instance %s: %w", id, err)
	}
	return nil
}

// IdempotentCreate: the instance id is derived from the node id and
// attempt, so a create started again finds the instance it made.
func (p *Provider) IdempotentCreate() {}

// Create returns a machine that creates the instance of one node, resumed
// from its driver_data if given (validated: a known step, an instance id
// of this cloud).
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	m := &createMachine{p: p, req: req}
	st, err := decodeState(state)
	if err != nil {
		return nil, fmt.Errorf("fake: resuming create of node %s: %w", req.NodeID, err)
	}
	if (st.Step == "" && st.Instance != "") || (st.Step != "" && st.Step != "boot") || (st.Step == "boot" && st.Instance == "") {
		return nil, fmt.Errorf("fake: resuming create of node %s: driver_data has step %q and instance %q; expected no step, or step boot with an instance", req.NodeID, st.Step, st.Instance)
	}
	m.st = st
	return m, nil
}

// Delete returns a machine that deletes an instance, resumed from its
// driver_data if given. An external id that is not one of this cloud's is
// refused (drivers.ErrNotFound): there is nothing of ours to delete.
func (p *Provider) Delete(externalID string, state json.RawMessage) (drivers.StateMachine, error) {
	if !ValidInstanceID(externalID) {
		return nil, fmt.Errorf("fake: %w: %q is not an instance id of this cloud (i- and 16 hex digits)", drivers.ErrNotFound, externalID)
	}
	st, err := decodeState(state)
	if err != nil {
		return nil, fmt.Errorf("fake: resuming delete of %s: %w", externalID, err)
	}
	if (st.Step != "" && st.Step != "deleting") || (st.Instance != "" && st.Instance != externalID) {
		return nil, fmt.Errorf("fake: resuming delete of %s: driver_data has step %q and instance %q; expected step deleting of this instance", externalID, st.Step, st.Instance)
	}
	st.Instance = externalID
	return &deleteMachine{p: p, st: st}, nil
}

var instanceIDRE = regexp.MustCompile(`^i-[0-9a-f]{16}$`)

// ValidInstanceID reports whether id can be an instance of a fake cloud.
func ValidInstanceID(id string) bool { return instanceIDRE.MatchString(id) }

// decodeState reads the fake's driver_data: empty, null, or one JSON
// object with known fields, whose instance id (if any) is one of this
// cloud's.
func decodeState(state json.RawMessage) (machineState, error) {
	var st machineState
	if len(bytes.TrimSpace(state)) == 0 || string(bytes.TrimSpace(state)) == "null" {
		return st, nil
	}
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return machineState{}, fmt.Errorf("driver_data is not the fake's: %w", err)
	}
	if dec.More() {
		return machineState{}, errors.New("driver_data is not the fake's: extra data after the object")
	}
	if st.Instance != "" && !ValidInstanceID(st.Instance) {
		return machineState{}, fmt.Errorf("driver_data names instance %q, which is not an instance id of this cloud", st.Instance)
	}
	return st, nil
}

// machineState is what the fake's machines store in driver_data.
type machineState struct {
	Step     string `json:"step,omitempty"`
	Instance string `json:"instance,omitempty"`
}

type createMachine struct {
	p   *Provider
	req drivers.CreateRequest
	st  machineState
}

func (m *createMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *createMachine) ExternalID() string { return m.st.Instance }

// Advance makes the machine's next step. A call to the simulated cloud
// that failed on its way (its NATS request timed out, or the cluster had
// no leader) may or may not have taken effect: drivers.ErrUncertain, as
// every step is safe to make again.
func (m *createMachine) Advance(ctx context.Context) (drivers.Step, error) {
	step, err := m.advance(ctx)
	if err != nil && ctx.Err() == nil && natsretry.Transient(err) {
		err = fmt.Errorf("%w: %w", drivers.ErrUncertain, err)
	}
	return step, err
}

func (m *createMachine) advance(ctx context.Context) (drivers.Step, error) {
	if err := m.p.apiCall(ctx); err != nil {
		return drivers.Step{}, err
	}
	now := time.Now().UTC()
	switch m.st.Step {
	case "":
		return m.launch(ctx, now)
	case "boot":
		return m.boot(ctx, now)
	}
	return drivers.Step{}, fmt.Errorf("fake: unknown create step %q", m.st.Step)
}

// launch creates the node's instance, within the cloud's quota, or finds
// the one an earlier try of this same attempt created.
func (m *createMachine) launch(ctx context.Context, now time.Time) (drivers.Step, error) {
	p := m.p
	token := fmt.Sprintf("%s/%d", m.req.NodeID, m.req.Attempt)
	id := instanceID(token)
	if p.cache.Has(id) {
		// Created by an earlier try of this same attempt.
		m.st = machineState{Step: "boot", Instance: id}
		return drivers.Step{}, nil
	}
	pl, err := p.poolLabel(m.req.Pool, m.req.Label)
	if err != nil {
		return drivers.Step{}, err
	}
	image, err := m.image(ctx, &pl)
	if err != nil {
		return drivers.Step{}, err
	}
	size, _ := p.QuotaForLabel(m.req.Pool, m.req.Label)
	if err := p.checkQuota(ctx, size); err != nil {
		return drivers.Step{}, err
	}
	fail, ip := p.roll()
	rec := InstanceRecord{
		ID: id, Name: m.req.Hostname, Token: token, Tags: m.req.Tags,
		Flavor: pl.FlavorName, Image: image, Cores: size.Cores, RAM: size.RAM,
		IPv4: ip, Created: now, ReadyAt: now.Add(p.cfg.BootDelay.D()), Fail: fail,
	}
	// The token makes the create idempotent: an instance an earlier try
	// of this attempt made (which the cache had not seen yet) is found
	// here, not created twice; and, as a cloud's idempotency tokens
	// do, a token used once never makes a second instance, even once
	// its first was deleted (the next step finds it gone, and the
	// attempt fails).
	rev, err := p.store.CreateNew(ctx, id, &rec)
	switch {
	case err == nil:
		p.cache.Apply(kv.Entry[InstanceRecord]{Key: id, Value: rec, Revision: rev})
	case !errors.Is(err, kv.ErrExists):
		return drivers.Step{}, fmt.Errorf("fake: creating instance: %w", err)
	}
	m.st = machineState{Step: "boot", Instance: id}
	return drivers.Step{Wait: p.cfg.BootDelay.D()}, nil
}

// image is the image the node boots: the uploaded image it was given,
// once checked, or else its label's cloud image.
func (m *createMachine) image(ctx context.Context, pl *config.PoolLabel) (string, error) {
	if pl.Diskimage != "" && m.req.ImageID == "" {
		return "", fmt.Errorf("label %s boots from diskimage %s, but no uploaded image was given", m.req.Label, pl.Diskimage)
	}
	if m.req.ImageID == "" {
		return pl.CloudImage, nil
	}
	if err := m.p.bootImage(ctx, m.req.ImageID); err != nil {
		return "", err
	}
	return m.req.ImageID, nil
}

// checkQuota fails with drivers.ErrQuotaExceeded when an instance of size
// would take the cloud past its quota.
func (p *Provider) checkQuota(ctx context.Context, size drivers.Resources) error {
	if err := p.cache.WaitSynced(ctx); err != nil {
		return err
	}
	limits, _ := p.QuotaLimits(ctx)
	if used := p.usage().Add(size); used.Instances > limits.Instances || used.Cores > limits.Cores || used.RAM > limits.RAM {
		return fmt.Errorf("%w: cloud %s: %d instances, %d cores, %d ram in use of %d, %d, %d",
			drivers.ErrQuotaExceeded, p.cfg.Cloud, used.Instances-1, used.Cores-size.Cores, used.RAM-size.RAM,
			limits.Instances, limits.Cores, limits.RAM)
	}
	return nil
}

// roll draws whether a new instance fails (failure-rate), and its address.
func (p *Provider) roll() (fail bool, ip string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fail = p.rng.Float64() < p.cfg.FailureRate
	ip = fmt.Sprintf("10.%d.%d.%d", p.rng.IntN(256), p.rng.IntN(256), 1+p.rng.IntN(254))
	return fail, ip
}

// boot waits until the instance leaves BUILD; then the node is ready. An
// instance that is gone, in ERROR, being deleted or shut off fails the
// attempt.
func (m *createMachine) boot(ctx context.Context, now time.Time) (drivers.Step, error) {
	p := m.p
	// An instance's record changes only when it is deleted; the cache
	// answers, and the cloud is asked when the cache has not seen it.
	e, ok := p.cache.Get(m.st.Instance)
	var err error
	if !ok {
		e, err = p.store.Get(ctx, m.st.Instance)
	}
	if errors.Is(err, kv.ErrNotFound) {
		return drivers.Step{}, fmt.Errorf("%w: instance %s vanished while booting", drivers.ErrNotFound, m.st.Instance)
	}
	if err != nil {
		return drivers.Step{}, err
	}
	switch e.Value.Status(now) {
	case StatusBuild:
		return drivers.Step{Wait: e.Value.ReadyAt.Sub(now)}, nil
	case StatusError:
		return drivers.Step{}, fmt.Errorf("instance %s went to ERROR while booting", m.st.Instance)
	case StatusDeleting:
		return drivers.Step{}, fmt.Errorf("instance %s is being deleted", m.st.Instance)
	case StatusShutoff:
		return drivers.Step{}, fmt.Errorf("instance %s was shut off while booting", m.st.Instance)
	}
	inst := p.toInstance(&e.Value)
	return drivers.Step{Done: true, Instance: &inst}, nil
}

type deleteMachine struct {
	p  *Provider
	st machineState
}

func (m *deleteMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *deleteMachine) ExternalID() string { return m.st.Instance }

func (m *deleteMachine) Advance(ctx context.Context) (drivers.Step, error) {
	p := m.p
	if err := p.apiCall(ctx); err != nil {
		return drivers.Step{}, err
	}
	e, err := p.store.Get(ctx, m.st.Instance)
	if errors.Is(err, kv.ErrNotFound) {
		return drivers.Step{Done: true}, nil
	}
	if err != nil {
		return drivers.Step{}, err
	}
	now := time.Now().UTC()
	if e.Value.DeleteAt == nil {
		at := now.Add(p.cfg.DeleteDelay.D())
		e.Value.DeleteAt = &at
		if p.cfg.DeleteDelay.D() > 0 {
			if _, err := p.cache.Update(ctx, m.st.Instance, &e.Value, e.Revision); err != nil && !errors.Is(err, kv.ErrConflict) {
				return drivers.Step{}, err
			}
			m.st.Step = "deleting"
			return drivers.Step{Wait: p.cfg.DeleteDelay.D()}, nil
		}
	}
	if now.Before(*e.Value.DeleteAt) {
		return drivers.Step{Wait: e.Value.DeleteAt.Sub(now)}, nil
	}
	if err := p.cache.Delete(ctx, m.st.Instance, e.Revision); err != nil && !errors.Is(err, kv.ErrConflict) && !errors.Is(err, kv.ErrNotFound) {
		return drivers.Step{}, err
	}
	return drivers.Step{Done: true}, nil
}

var _ drivers.Owner = (*Provider)(nil)

// Owns reports whether the instance was made for the node by this
// provider (its tags).
func (p *Provider) Owns(ctx context.Context, externalID, nodeID string) (bool, error) {
	if !ValidInstanceID(externalID) {
		return false, fmt.Errorf("fake: %w: %q is not an instance id of this cloud", drivers.ErrNotFound, externalID)
	}
	e, err := p.store.Get(ctx, externalID)
	if errors.Is(err, kv.ErrNotFound) {
		return false, fmt.Errorf("fake: instance %s: %w", externalID, drivers.ErrNotFound)
	}
	if err != nil {
		return false, fmt.Errorf("fake: reading instance %s: %w", externalID, err)
	}
	return drivers.OwnedBy(e.Value.Tags, p.cfg.Name, nodeID), nil
}
