// Package aws is the AWS driver: EC2 instances (RunInstances, or
// CreateFleet for fleet labels, spot or on demand, on dedicated hosts if
// asked), quota from Service Quotas, AMIs imported through S3 or the EBS
// direct API, on aws-sdk-go-v2. Every call to EC2 and Service Quotas is
// paced by the provider's rate; the SDK's retryer keeps no pace of its own
// and leaves throttling and capacity errors to the launcher.
package aws

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/servicequotas"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"golang.org/x/time/rate"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/awsbody"
)

// Options are what a process (or a test) sets beyond the configuration.
type Options struct {
	// Endpoint is the base endpoint of every service ("": the SDK's own
	// resolution, which honours AWS_ENDPOINT_URL and the shared config).
	Endpoint string
	// Credentials replace the SDK's default credential chain.
	Credentials sdkaws.CredentialsProvider
	// HTTPClient replaces the SDK's HTTP client.
	HTTPClient *http.Client
	// RetryMaxAttempts bounds the SDK's attempts of a call that fails in
	// transit (default 3); throttling and capacity errors are never
	// retried by the SDK.
	RetryMaxAttempts int
	// ScanTimeout bounds each SSH connection of a host-key scan (default
	// 10 s).
	ScanTimeout time.Duration
	// QuotaRefresh is how long quotas read from Service Quotas are kept
	// (default 5 min).
	QuotaRefresh time.Duration
	// SweepInterval spaces the sweeps of leaked volumes, hosts, snapshots,
	// templates and objects (default 1 min).
	SweepInterval time.Duration
	// LeakAge is how old an unused snapshot or S3 object of ours must be
	// before a sweep deletes it (default 6 h: an import may run that long).
	LeakAge time.Duration
	// PollInterval spaces the polls of imports and new images (default 5 s).
	PollInterval time.Duration
	Log          *slog.Logger
}

// Provider is one configured aws provider.
type Provider struct {
	cfg  *config.Provider
	opts Options
	log  *slog.Logger

	ec2 *ec2.Client
	sq  *servicequotas.Client
	s3  *s3.Client
	ebs *ebs.Client

	pace  *pacer
	watch *instanceWatch

	mu        sync.Mutex
	types     map[string]instanceType
	quotas    map[string]int
	quotasAt  time.Time
	amis      map[string]cachedAMI // cloud image name -> AMI found by filters
	templates map[string]bool      // launch templates known to exist
	lastSweep time.Time
}

type instanceType struct {
	VCPUs     int
	MemoryMiB int
}

type cachedAMI struct {
	id string
	at time.Time
}

var _ drivers.Provider = (*Provider)(nil)
var _ drivers.ImageProvider = (*Provider)(nil)
var _ drivers.Paced = (*Provider)(nil)
var _ drivers.Sweeper = (*Provider)(nil)
var _ drivers.Interrupter = (*Provider)(nil)

// New makes the provider's SDK clients and reads what its labels' instance
// types are (vCPUs and memory, for quota). The SDK's configuration comes
// from its default chain (environment, shared config and credentials
// files, the profile-name), as Nodepool's did through boto3.
func New(ctx context.Context, pc *config.Provider, opts Options) (*Provider, error) {
	if opts.RetryMaxAttempts <= 0 {
		opts.RetryMaxAttempts = 3
	}
	if opts.ScanTimeout <= 0 {
		opts.ScanTimeout = 10 * time.Second
	}
	if opts.QuotaRefresh <= 0 {
		opts.QuotaRefresh = 5 * time.Minute
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = time.Minute
	}
	if opts.LeakAge <= 0 {
		opts.LeakAge = 6 * time.Hour
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	p := &Provider{cfg: pc, opts: opts, log: opts.Log.With("provider", pc.Name),
		pace:  newPacer(pc.Rate),
		types: map[string]instanceType{}, amis: map[string]cachedAMI{}, templates: map[string]bool{}}
	p.watch = &instanceWatch{p: p}
	loads := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(pc.RegionName),
		awsconfig.WithRetryer(func() sdkaws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = opts.RetryMaxAttempts
				// The provider's rate is the one pace: no client-side
				// retry quota, and no retries of what the launcher
				// waits out itself.
				o.RateLimiter = ratelimit.None
				o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(noRetry)}, o.Retryables...)
			})
		}),
	}
	if pc.ProfileName != "" {
		loads = append(loads, awsconfig.WithSharedConfigProfile(pc.ProfileName))
	}
	if opts.Credentials != nil {
		loads = append(loads, awsconfig.WithCredentialsProvider(opts.Credentials))
	}
	if opts.HTTPClient != nil {
		loads = append(loads, awsconfig.WithHTTPClient(opts.HTTPClient))
	}
	if opts.Endpoint != "" {
		loads = append(loads, awsconfig.WithBaseEndpoint(opts.Endpoint))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("provider %s: loading the AWS SDK configuration: %w", pc.Name, err)
	}
	cfg.HTTPClient = awsbody.Client(cfg.HTTPClient)
	paced := func(o *ec2.Options) { o.APIOptions = append(o.APIOptions, p.pace.addTo) }
	p.ec2 = ec2.NewFromConfig(cfg, paced)
	p.sq = servicequotas.NewFromConfig(cfg, func(o *servicequotas.Options) { o.APIOptions = append(o.APIOptions, p.pace.addTo) })
	p.s3 = s3.NewFromConfig(cfg, func(o *s3.Options) {
		// A custom endpoint (a dev cloud, an S3-compatible store) is
		// reached by path: its host names carry no buckets.
		o.UsePathStyle = cfg.BaseEndpoint != nil
	})
	p.ebs = ebs.NewFromConfig(cfg)
	// Learn the labels' instance types now; a cloud that does not answer
	// is asked again when a size is needed.
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.loadTypes(tctx, p.labelTypes()); err != nil {
		p.log.Warn("could not read the instance types of the labels; trying again later", "err", err)
	}
	return p, nil
}

// noRetry keeps the SDK from retrying what the launcher waits out with its
// own backoff (throttling, capacity, quota): each retry would be a call
// beyond the provider's rate.
func noRetry(err error) sdkaws.Ternary {
	var ae smithy.APIError
	if asAPIError(err, &ae) {
		switch kindOf(ae.ErrorCode()) {
		case drivers.ErrRateLimited, drivers.ErrCapacity, drivers.ErrQuotaExceeded:
			return sdkaws.FalseTernary
		}
	}
	return sdkaws.UnknownTernary
}

// Close releases nothing: the SDK's clients hold no resources of their own.
func (p *Provider) Close() {}

// Pace makes every call to EC2 and Service Quotas wait for the launcher's
// limiter (the provider's rate shared among launchers).
func (p *Provider) Pace(lim drivers.Limiter) { p.pace.set(lim) }

// pacer holds the limiter every paced call waits for.
type pacer struct {
	mu  sync.Mutex
	lim drivers.Limiter
}

func newPacer(perSecond float64) *pacer {
	p := &pacer{}
	if perSecond > 0 {
		p.lim = rate.NewLimiter(rate.Limit(perSecond), 1)
	}
	return p
}

func (p *pacer) set(lim drivers.Limiter) {
	p.mu.Lock()
	p.lim = lim
	p.mu.Unlock()
}

func (p *pacer) wait(ctx context.Context) error {
	p.mu.Lock()
	lim := p.lim
	p.mu.Unlock()
	if lim == nil {
		return nil
	}
	defer drivers.MeterPacedWait(ctx, time.Now())
	return lim.Wait(ctx)
}

// addTo puts the pacing in an SDK client's stack, in the finalize step
// after the retryer, so that every attempt of every call waits its turn.
func (p *pacer) addTo(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("NodepoolPace",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if err := p.wait(ctx); err != nil {
				return middleware.FinalizeOutput{}, middleware.Metadata{}, err
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// labelTypes lists the instance types the provider's labels may launch.
func (p *Provider) labelTypes() []string {
	seen := map[string]bool{}
	var out []string
	add := func(t string) {
		if t != "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, pool := range p.cfg.Pools {
		for _, pl := range pool.Labels {
			add(pl.InstanceType)
			if pl.Fleet != nil {
				for _, t := range pl.Fleet.InstanceTypes {
					add(t)
				}
			}
		}
	}
	return out
}
