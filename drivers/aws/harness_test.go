package aws

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
)

// fastKnobs make the dev cloud quick enough for unit tests.
func fastKnobs() devaws.Knobs {
	k := devaws.DefaultKnobs()
	k.BootTime = devaws.Duration(100 * time.Millisecond)
	k.TerminateTime = devaws.Duration(50 * time.Millisecond)
	k.ImportTime = devaws.Duration(200 * time.Millisecond)
	k.PageSize = 3 // every listing crosses pages
	k.InstanceAddress = "127.0.0.1"
	return k
}

// startCloud runs a dev cloud on 127.0.0.1:0 for the test.
func startCloud(t *testing.T, k devaws.Knobs) (*devaws.Cloud, string) {
	t.Helper()
	c := devaws.New(devaws.Options{Knobs: k})
	srv, err := devaws.Listen("127.0.0.1:0", c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return c, srv.URL()
}

// testOptions reach the dev cloud with static credentials and one SDK
// retry of a call that failed in transit (production's default is 3).
// Throttling and capacity errors are never retried by the SDK.
func testOptions(endpoint string) Options {
	return Options{Endpoint: endpoint, Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		RetryMaxAttempts: 2, ScanTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		SweepInterval: time.Nanosecond, LeakAge: time.Nanosecond}
}

var _ = sdkaws.String

// newProvider parses a configuration whose provider is the aws one and
// makes its driver against the dev cloud.
func newProvider(t *testing.T, endpoint, yaml string) *Provider {
	t.Helper()
	cfg, err := config.Parse("nodepool.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Providers {
		if cfg.Providers[i].Driver == "aws" {
			p, err := New(t.Context(), &cfg.Providers[i], testOptions(endpoint))
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatal("no aws provider")
	return nil
}

func request(node, pool, label string, attempt int) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: node, Hostname: "np" + node, Provider: "ec2", Pool: pool, Label: label, Attempt: attempt,
		Tags: map[string]string{drivers.TagProvider: "ec2", drivers.TagPool: pool, drivers.TagNode: node, drivers.TagLabel: label}}
}

// advance runs a machine until it is done, fails, or asks to wait on the
// cloud (quota, capacity, rate): then that error.
func advance(ctx context.Context, sm drivers.StateMachine) (drivers.Step, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		step, err := sm.Advance(ctx)
		if err != nil || step.Done {
			return step, err
		}
		t := time.NewTimer(min(step.Wait, 50*time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			return step, fmt.Errorf("machine not done: %w", ctx.Err())
		}
	}
}

func mustAdvance(t *testing.T, sm drivers.StateMachine) *drivers.Instance {
	t.Helper()
	step, err := advance(t.Context(), sm)
	if err != nil {
		t.Fatal(err)
	}
	return step.Instance
}

func isKind(err, kind error) bool { return errors.Is(err, kind) }

func mustConfig(t testing.TB, yaml string) *config.Provider {
	cfg, err := config.Parse("nodepool.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return &cfg.Providers[0]
}
