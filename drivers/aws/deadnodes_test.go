package aws_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
)

const minReadySystem = `
labels:
  - name: small
    min-ready: 1
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

// A ready node whose instance someone terminates or stops (through EC2's
// API) is failed with EC2's state as the reason, its instance terminated,
// and min-ready replaces it.
func TestDeadInstanceIsReplaced(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		kill    func(ctx context.Context, cl *ec2.Client, id string) error
		reasons []string // what the listing may catch it as
	}{
		{"terminated", func(ctx context.Context, cl *ec2.Client, id string) error {
			_, err := cl.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
			return err
		}, []string{"instance gone from the cloud", "instance is shutting-down"}},
		{"stopped", func(ctx context.Context, cl *ec2.Client, id string) error {
			_, err := cl.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}})
			return err
		}, []string{"instance is stopped", "instance is stopping"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := devaws.DefaultKnobs()
			k.BootTime, k.TerminateTime, k.InstanceAddress = devaws.Duration(50*time.Millisecond), devaws.Duration(20*time.Millisecond), "127.0.0.1"
			s := startSystem(t, k, minReadySystem)
			s.until("a ready node", func() bool { return len(s.readyNodes("small")) == 1 })
			dead := s.readyNodes("small")[0]
			if err := c.kill(t.Context(), s.ec2, dead.ExternalID); err != nil {
				t.Fatal(err)
			}
			// The launcher's log says the node failed, and why: a cache
			// need not see the failed state, which lasts a moment (a watch
			// started again resumes after it once the delete overwrote it).
			failedLine := func() string {
				if l := s.log.Lines("the node failed", "node="+dead.ID); len(l) > 0 {
					return l[0]
				}
				return ""
			}
			s.until(fmt.Sprintf("the dead node %s (instance %s) failed and replaced", dead.ID, dead.ExternalID), func() bool {
				_, old := s.nodes.Get(dead.ID)
				fresh := s.readyNodes("small")
				return failedLine() != "" && !old && len(fresh) == 1 && fresh[0].ID != dead.ID
			})
			line := failedLine()
			if !slices.ContainsFunc(c.reasons, func(r string) bool { return strings.Contains(line, "why="+r+" ") }) {
				t.Errorf("failed with %q, want one of the reasons %q", line, c.reasons)
			}
			s.until("the dead node's instance terminated", func() bool {
				out, err := s.ec2.DescribeInstances(t.Context(), &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
					{Name: sdkaws.String("instance-id"), Values: []string{dead.ExternalID}}}})
				return err == nil && (len(out.Reservations) == 0 || out.Reservations[0].Instances[0].State.Name == ec2types.InstanceStateNameTerminated)
			})
		})
	}
}
