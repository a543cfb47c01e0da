package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
)

func (a *app) awsCmd() *cobra.Command {
	var (
		listen, region, account string
		apiLatency, bootTime    time.Duration
		terminateTime           time.Duration
		importTime, spotNotice  time.Duration
		rateLimit               float64
		pageSize                int
		address                 string
		quotas, noCapacity      []string
		images, buckets         []string
	)
	cmd := &cobra.Command{
		Use:   "aws",
		Short: "Run an AWS (EC2, Service Quotas, EBS direct, S3) on loopback",
		Long: `Run an AWS region on loopback: EC2 over its Query protocol (form-encoded
requests, XML responses, EC2's error envelope, NextToken pagination),
Service Quotas over JSON 1.1, the EBS direct API and S3 (gofakes3), all on
one address. Requests are routed by the service named in their SigV4
signature, so one endpoint URL serves every client; any credentials are
taken. Instances are pending for --boot-time, then running; imports,
snapshots and images complete after --import-time.

Point the SDK or the aws CLI at it:

  nodepool-devcloud aws --listen 127.0.0.1:4566
  export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev AWS_DEFAULT_REGION=us-east-1
  aws ec2 describe-instances
  aws service-quotas get-service-quota --service-code ec2 --quota-code L-1216C47A
  aws service-quotas list-service-quotas --service-code ebs

Service Quotas serves EC2's vCPU quotas (enforced by RunInstances and
CreateFleet) and dedicated host quotas, and EBS's storage and IOPS quotas
per volume type (reported), with AWS's codes, names and default values.

Knobs can be changed while it runs: GET or PUT /_devcloud/knobs (JSON);
POST /_devcloud/interrupt {"instance_id": "i-...", "kind": "notice"} has EC2
interrupt a spot instance ("notice": the two-minute warning, then the
termination; "terminate": at once; "rebalance": a rebalance
recommendation); GET /_devcloud/calls counts the calls per action;
GET /_devcloud/instances lists the instances not terminated, with their
launch and running times.

It runs until SIGINT or SIGTERM; its state is kept in memory only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k := devaws.DefaultKnobs()
			k.APILatency, k.BootTime, k.TerminateTime = devaws.Duration(apiLatency), devaws.Duration(bootTime), devaws.Duration(terminateTime)
			k.ImportTime, k.SpotNotice = devaws.Duration(importTime), devaws.Duration(spotNotice)
			k.RateLimit, k.PageSize, k.InstanceAddress = rateLimit, pageSize, address
			if rateLimit < 0 {
				return fmt.Errorf("--rate-limit must be 0 (no limit) or more calls per second, got %g", rateLimit)
			}
			if pageSize < 1 || pageSize > 1000 {
				return fmt.Errorf("--page-size must be from 1 to 1000, got %d", pageSize)
			}
			for _, q := range quotas {
				code, val, ok := strings.Cut(q, "=")
				v, err := strconv.ParseFloat(val, 64)
				if !ok || err != nil || v < 0 || !strings.HasPrefix(code, "L-") {
					return fmt.Errorf("--quota %q: expected CODE=VALUE, such as L-1216C47A=64 (vCPUs) or L-7A658B76=100 (TiB of gp3 volumes)", q)
				}
				k.Quotas[code] = v
			}
			for _, nc := range noCapacity {
				typ, count, hasCount := strings.Cut(nc, "=")
				n := -1
				if hasCount {
					var err error
					if n, err = strconv.Atoi(count); err != nil || n < -1 {
						return fmt.Errorf("--no-capacity %q: expected TYPE or TYPE=COUNT (COUNT -1: always), such as t3.large=3 or spot/m5.large", nc)
					}
				}
				if typ == "" {
					return fmt.Errorf("--no-capacity %q: expected an instance type", nc)
				}
				k.NoCapacity[typ] = n
			}
			opts := devaws.Options{Region: region, AccountID: account, Knobs: k, Buckets: buckets, Log: a.logger()}
			for _, im := range images {
				id, name, ok := strings.Cut(im, "=")
				if !ok || !strings.HasPrefix(id, "ami-") || name == "" {
					return fmt.Errorf("--image %q: expected AMI_ID=NAME, such as ami-0123456789abcdef0=debian-12", im)
				}
				opts.Images = append(opts.Images, devaws.SeedImage{ID: id, Name: name})
			}
			if len(opts.Images) > 0 {
				opts.Images = append(opts.Images, devaws.DefaultImages...)
			}
			srv, err := devaws.Listen(listen, devaws.New(opts))
			if err != nil {
				return err
			}
			defer srv.Close()
			fmt.Fprintf(a.out, "export AWS_ENDPOINT_URL=%s AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev AWS_DEFAULT_REGION=%s\n", srv.URL(), srv.Cloud.Region())
			fmt.Fprintf(a.err, "dev cloud (AWS %s, account %s) listening on %s; stop with Ctrl-C\n", srv.Cloud.Region(), srv.Cloud.AccountID(), srv.URL())
			<-cmd.Context().Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:4566", "address to serve every service on (port 0 picks a free one)")
	f.StringVar(&region, "region", "us-east-1", "the region it simulates")
	f.StringVar(&account, "account-id", "123456789012", "the account that owns what clients create")
	f.DurationVar(&apiLatency, "api-latency", 0, "time added to every call (e.g. 50ms)")
	f.DurationVar(&bootTime, "boot-time", 2*time.Second, "how long an instance stays pending")
	f.DurationVar(&terminateTime, "terminate-time", time.Second, "how long an instance stays shutting-down")
	f.DurationVar(&importTime, "import-time", 2*time.Second, "how long an import task takes (new snapshots and images take less)")
	f.DurationVar(&spotNotice, "spot-notice", 2*time.Minute, "time from a spot interruption notice to the termination")
	f.Float64Var(&rateLimit, "rate-limit", 0, "calls per second taken from all clients together, beyond which RequestLimitExceeded (0: no limit)")
	f.IntVar(&pageSize, "page-size", 1000, "most items a page of a Describe call holds")
	f.StringVar(&address, "instance-address", "127.0.0.1", "address every instance gets, private and public (\"\": 10.0.x.y and 203.0.113.z, which nothing answers)")
	f.StringSliceVar(&buckets, "bucket", nil, "an S3 bucket present from the start (repeatable), such as the object-storage bucket-name of a provider")
	f.StringSliceVar(&quotas, "quota", nil, "a Service Quotas value CODE=VALUE (repeatable): EC2's vCPU quotas, enforced, such as L-1216C47A=64 (standard on-demand) or L-34B43A08=32 (standard spot); others reported as set, such as L-7A658B76=100 (TiB of gp3 volumes)")
	f.StringSliceVar(&noCapacity, "no-capacity", nil, "refuse launches of an instance type with InsufficientInstanceCapacity: TYPE[=COUNT] (repeatable; spot/TYPE for spot, host/TYPE for dedicated hosts; no COUNT: always)")
	f.StringSliceVar(&images, "image", nil, "a public AMI present from the start, AMI_ID=NAME (repeatable; the default Debian and Ubuntu AMIs stay)")
	return cmd
}
