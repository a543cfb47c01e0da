package openstack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/utils"
	"golang.org/x/time/rate"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Microversion is the compute API microversion the driver asks for: 2.47
// and later embed the flavor in servers (what an instance holds against
// quota without a flavor lookup), 2.37 and later take networks "auto".
const Microversion = "2.79"

// clients are the service clients of one cloud.
type clients struct {
	provider *gophercloud.ProviderClient
	compute  *gophercloud.ServiceClient
	image    *gophercloud.ServiceClient
	network  *gophercloud.ServiceClient
	// volume is nil when the cloud has no block storage in its catalog.
	volume *gophercloud.ServiceClient
	region string
}

// pacer holds the limiter every API call waits for (none until the
// launcher hands one over).
type pacer struct {
	lim atomic.Pointer[limiterBox]
}

type limiterBox struct{ drivers.Limiter }

// callsPerSecond is the limiter's current rate (0: no limiter, or one
// that does not say).
func (pc *pacer) callsPerSecond() float64 {
	b := pc.lim.Load()
	if b == nil {
		return 0
	}
	if l, ok := b.Limiter.(interface{ Limit() rate.Limit }); ok && l.Limit() != rate.Inf {
		return float64(l.Limit())
	}
	return 0
}

func (pc *pacer) wait(ctx context.Context) error {
	if b := pc.lim.Load(); b != nil {
		defer drivers.MeterPacedWait(ctx, time.Now())
		return b.Wait(ctx)
	}
	return nil
}

// pacedTransport makes every HTTP request to the cloud wait for the
// provider's limiter first: rate paces each API call, as in Nodepool.
type pacedTransport struct {
	base  http.RoundTripper
	pacer *pacer
	calls atomic.Int64
}

func (t *pacedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.pacer.wait(req.Context()); err != nil {
		return nil, err
	}
	t.calls.Add(1)
	return t.base.RoundTrip(req)
}

// connect reads the cloud's entry of clouds.yaml (where openstacksdk looks
// for it: OS_CLIENT_CONFIG_FILE, the current folder, ~/.config/openstack/,
// /etc/openstack/), logs in and finds the services.
func connect(ctx context.Context, cloud, region, cloudsFile string, transport *pacedTransport) (*clients, error) {
	opts := []clouds.ParseOption{clouds.WithCloudName(cloud)}
	if cloudsFile != "" {
		opts = append(opts, clouds.WithLocations(cloudsFile))
	}
	if region != "" {
		opts = append(opts, clouds.WithRegion(region))
	}
	ao, eo, tlsConfig, err := clouds.Parse(opts...)
	if err != nil {
		return nil, fmt.Errorf("cloud %q in clouds.yaml: %w", cloud, err)
	}
	ao.AllowReauth = true
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 64
	if tlsConfig != nil {
		base.TLSClientConfig = tlsConfig.Clone()
	} else {
		base.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	transport.base = base
	pc, err := config.NewProviderClient(ctx, ao, config.WithHTTPClient(http.Client{Transport: transport, Timeout: 5 * time.Minute}))
	if err != nil {
		return nil, fmt.Errorf("logging in to cloud %q at %s: %w", cloud, ao.IdentityEndpoint, describe(err))
	}
	c := &clients{provider: pc, region: eo.Region}
	if c.compute, err = gcos.NewComputeV2(pc, eo); err != nil {
		return nil, fmt.Errorf("cloud %q: no compute service: %w", cloud, err)
	}
	c.compute.Microversion = Microversion
	if mv, err := utils.GetSupportedMicroversions(ctx, c.compute); err == nil {
		if ok, _ := mv.IsSupported(Microversion); !ok {
			c.compute.Microversion = fmt.Sprintf("%d.%d", mv.MaxMajor, mv.MaxMinor)
		}
	}
	if c.image, err = gcos.NewImageV2(pc, eo); err != nil {
		return nil, fmt.Errorf("cloud %q: no image service: %w", cloud, err)
	}
	if c.network, err = gcos.NewNetworkV2(pc, eo); err != nil {
		return nil, fmt.Errorf("cloud %q: no network service: %w", cloud, err)
	}
	if v, err := gcos.NewBlockStorageV3(pc, eo); err == nil {
		c.volume = v
	}
	return c, nil
}

// cloudError is a failure the cloud reported, with the driver error kind
// it maps to (nil: none of them).
type cloudError struct {
	kind       error
	msg        string
	status     int
	retryAfter time.Duration
}

func (e *cloudError) Error() string             { return e.msg }
func (e *cloudError) Unwrap() error             { return e.kind }
func (e *cloudError) RetryAfter() time.Duration { return e.retryAfter }
func (e *cloudError) StatusCode() int           { return e.status }
func statusIs(err error, status int) bool {
	var ce *cloudError
	return errors.As(err, &ce) && ce.status == status
}
func notFound(err error) bool { return statusIs(err, http.StatusNotFound) }
func wrapf(err error, format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, classify(err))...)
}
