package aws_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	awsdriver "github.com/nodepool-nats/nodepool/drivers/aws"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/awsbody"
	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

// system is a nats-server, a dev cloud and a launcher whose only
// provider is the aws driver against that cloud.
type system struct {
	t      *testing.T
	cloud  *devaws.Cloud
	ec2    *ec2.Client
	client *client.Client
	nodes  *kv.Cache[kv.Node]
	reqs   *kv.Cache[kv.Request]
	log    *logtest.Recorder // the launcher's
}

func startSystem(t *testing.T, k devaws.Knobs, yaml string) *system {
	t.Helper()
	cloud := devaws.New(devaws.Options{Knobs: k})
	srv, err := devaws.Listen("127.0.0.1:0", cloud)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg, err := config.Parse("nodepool.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	log, rec := logtest.New(t)
	creds := credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", "")
	opts := awsdriver.Options{Endpoint: srv.URL(), Credentials: creds, RetryMaxAttempts: 2, PollInterval: 20 * time.Millisecond, SweepInterval: time.Nanosecond, Log: log}
	drv, err := awsdriver.New(t.Context(), &cfg.Providers[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	nc, js := ns.Connect(t)
	if err := events.Ensure(t.Context(), js, 1, log); err != nil {
		t.Fatal(err)
	}
	b, err := kv.Ensure(t.Context(), js, kv.Options{Replicas: 1, LeaseTTL: 2 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(t.Context(), nc)
	if err != nil {
		t.Fatal(err)
	}
	l, err := consumers.NewLauncher(js, b, consumers.Options{ID: "launcher-1", Config: cfg,
		Providers: map[string]drivers.Provider{cfg.Providers[0].Name: drv}, LeaseTTL: 2 * time.Second, SyncInterval: 200 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Run(ctx); err != nil {
			t.Errorf("launcher: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	s := &system{t: t, cloud: cloud, client: c, log: rec, nodes: kv.NewCache(b.Nodes, log), reqs: kv.NewCache(b.Requests, log),
		ec2: ec2.NewFromConfig(sdkaws.Config{Region: "us-east-1", Credentials: creds, BaseEndpoint: sdkaws.String(srv.URL()), HTTPClient: awsbody.Client(nil)})}
	for _, start := range []func() func(){s.nodes.Start, s.reqs.Start} {
		t.Cleanup(start())
	}
	return s
}

// until waits for cond, checking it at every change of the records.
func (s *system) until(what string, cond func() bool) {
	s.t.Helper()
	sn, sr := s.nodes.Subscribe(), s.reqs.Subscribe()
	defer s.nodes.Unsubscribe(sn)
	defer s.reqs.Unsubscribe(sr)
	waitfor.Until(s.t, 30*time.Second, what, cond,
		waitfor.Every(100*time.Millisecond), // the cloud changes without records changing
		waitfor.Changes(sn), waitfor.Changes(sr),
		waitfor.Detail(func() string {
			var b strings.Builder
			s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
				fmt.Fprintf(&b, "  node %s %s %v alloc=%s ext=%s reason=%q\n", e.Key, e.Value.State, e.Value.Labels, e.Value.AllocatedTo, e.Value.ExternalID, e.Value.Reason)
				return true
			})
			s.reqs.Range(func(e *kv.Entry[kv.Request]) bool {
				fmt.Fprintf(&b, "  request %s %s %v reason=%q\n", e.Key, e.Value.State, e.Value.Nodes, e.Value.Reason)
				return true
			})
			return b.String()
		}))
}

// readyNodes lists the ready, unallocated nodes of a label.
func (s *system) readyNodes(label string) []kv.Node {
	var out []kv.Node
	s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.State == kv.NodeReady && e.Value.AllocatedTo == "" && e.Value.HasLabel(label) {
			out = append(out, e.Value)
		}
		return true
	})
	return out
}

const spotSystem = `
labels:
  - name: spot
    min-ready: 1
  - name: spot-used
providers:
  - name: ec2
    driver: aws
    region-name: us-east-1
    rate: 1000
    cloud-images:
      - name: debian
        image-id: ami-0a1b2c3d4e5f60001
    pools:
      - name: main
        host-key-checking: false
        labels:
          - name: spot
            cloud-image: debian
            instance-type: t3.medium
            key-name: zuul
            use-spot: true
          - name: spot-used
            cloud-image: debian
            instance-type: t3.medium
            key-name: zuul
            use-spot: true
`

// EC2 interrupts spot instances: the ready node is replaced before anyone
// takes it; the node in use stays with its holder, who finds the reason
// on it.
func TestSpotInterruptionOfReadyAndInUseNodes(t *testing.T) {
	t.Parallel()
	k := devaws.DefaultKnobs()
	k.BootTime, k.TerminateTime, k.InstanceAddress = devaws.Duration(50*time.Millisecond), devaws.Duration(20*time.Millisecond), "127.0.0.1"
	s := startSystem(t, k, spotSystem)
	s.until("a ready min-ready node", func() bool { return len(s.readyNodes("spot")) == 1 })
	ready := s.readyNodes("spot")[0]
	nodes, err := s.client.Request(t.Context(), events.RequestMessage{Labels: []string{"spot-used"}}, "me")
	if err != nil {
		t.Fatal(err)
	}
	used := nodes[0]
	if err := s.cloud.Interrupt(ready.ExternalID, devaws.InterruptNotice); err != nil {
		t.Fatal(err)
	}
	if err := s.cloud.Interrupt(used.ExternalID, devaws.InterruptNotice); err != nil {
		t.Fatal(err)
	}
	s.until("the ready node replaced", func() bool {
		_, old := s.nodes.Get(ready.ID)
		fresh := s.readyNodes("spot")
		return !old && len(fresh) == 1 && fresh[0].ID != ready.ID
	})
	s.until("the holder told", func() bool {
		e, ok := s.nodes.Get(used.ID)
		return ok && e.Value.State == kv.NodeInUse && strings.Contains(e.Value.Reason, "spot interruption notice")
	})
	// The old instance is gone (terminated by the delete), the holder's
	// is still running until EC2 takes it.
	out, err := s.ec2.DescribeInstances(t.Context(), &ec2.DescribeInstancesInput{InstanceIds: []string{ready.ExternalID, used.ExternalID}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if *in.InstanceId == ready.ExternalID && in.State.Name != ec2types.InstanceStateNameTerminated && in.State.Name != ec2types.InstanceStateNameShuttingDown {
				t.Errorf("the replaced node's instance is %s", in.State.Name)
			}
		}
	}
	if err := s.client.Return(t.Context(), used.ID); err != nil {
		t.Fatal(err)
	}
	s.until("the returned node deleted", func() bool { _, ok := s.nodes.Get(used.ID); return !ok })
}

const quotaSystem = `
labels:
  - name: small
providers:
  - name: ec2
    driver: aws
    region-name: us-east-1
    rate: 1000
    cloud-images:
      - name: debian
        image-id: ami-0a1b2c3d4e5f60001
    pools:
      - name: main
        host-key-checking: false
        labels:
          - name: small
            cloud-image: debian
            instance-type: t3.medium
            key-name: zuul
`

// The account's vCPU quota (2 vCPUs of standard instances, one t3.medium)
// holds the second request until the first node is given back; an
// instance that is not ours counts against it too; and an instance
// tagged as ours that no node accounts for is deleted.
func TestQuotaWaitAndLeak(t *testing.T) {
	t.Parallel()
	k := devaws.DefaultKnobs()
	k.BootTime, k.TerminateTime, k.InstanceAddress = devaws.Duration(50*time.Millisecond), devaws.Duration(20*time.Millisecond), "127.0.0.1"
	k.Quotas = map[string]float64{"L-1216C47A": 4}
	s := startSystem(t, k, quotaSystem)
	ctx := t.Context()
	// Someone else's t3.micro holds 2 of the 4 vCPUs.
	if _, err := s.ec2.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: sdkaws.String("ami-0a1b2c3d4e5f60001"), InstanceType: "t3.micro", MinCount: sdkaws.Int32(1), MaxCount: sdkaws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	first, err := s.client.Request(ctx, events.RequestMessage{Labels: []string{"small"}}, "me")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.client.Submit(ctx, events.RequestMessage{Labels: []string{"small"}})
	if err != nil {
		t.Fatal(err)
	}
	// It waits: no second node is created while the quota is full.
	s.until("the second request waiting", func() bool {
		e, ok := s.reqs.Get(second)
		return ok && e.Value.State == kv.RequestRequested && s.nodes.Len() == 1
	})
	if err := s.client.Return(ctx, first[0].ID); err != nil {
		t.Fatal(err)
	}
	s.until("the second request fulfilled", func() bool {
		e, ok := s.reqs.Get(second)
		return ok && e.Value.State == kv.RequestFulfilled
	})
	// A leaked instance: tagged as ours, its node unknown.
	s.cloud.SetKnobs(func(k *devaws.Knobs) { k.Quotas["L-1216C47A"] = 64 })
	run, err := s.ec2.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: sdkaws.String("ami-0a1b2c3d4e5f60001"), InstanceType: "t3.micro", MinCount: sdkaws.Int32(1), MaxCount: sdkaws.Int32(1),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstance, Tags: []ec2types.Tag{
			{Key: sdkaws.String(drivers.TagProvider), Value: sdkaws.String("ec2")}, {Key: sdkaws.String(drivers.TagNode), Value: sdkaws.String("nobody")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	s.until("the leaked instance terminated", func() bool {
		out, err := s.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{*run.Instances[0].InstanceId}})
		return err == nil && out.Reservations[0].Instances[0].State.Name == ec2types.InstanceStateNameTerminated
	})
}
