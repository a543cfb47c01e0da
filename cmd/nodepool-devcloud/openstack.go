package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
)

func (a *app) openStackCmd() *cobra.Command {
	var (
		listen, name, cloudsFile string
		opts                     devos.Options
		quota                    = devos.DefaultQuota
		flavors                  []string
	)
	cmd := &cobra.Command{
		Use:   "openstack",
		Short: "Run an OpenStack (Keystone v3, Nova, Glance v2, Neutron, Cinder v3) on loopback",
		Long: `Run an OpenStack cloud on loopback: Keystone v3 (password and application
credential authentication), Nova, Glance v2, Neutron and Cinder v3 over
their REST APIs, with their status codes, error bodies, microversions and
pagination. Servers stay in BUILD for --boot-time, then go ACTIVE (or
ERROR with a fault, for a share of them given by --error-rate).

It prints a clouds.yaml for itself on standard output, or writes it to
--clouds-yaml and prints the line of exports that points clients at it:
point OS_CLIENT_CONFIG_FILE at it and both nodepool's openstack driver and
the openstack CLI use it:

  nodepool-devcloud openstack --listen 127.0.0.1:5000 --clouds-yaml /tmp/clouds.yaml
  export OS_CLIENT_CONFIG_FILE=/tmp/clouds.yaml OS_CLOUD=devcloud
  openstack server list

Its own API, for scripts and benchmarks (not OpenStack's): GET
/_devcloud/stats counts the calls per service and those refused for the
rate limit; GET /_devcloud/servers lists the servers with their creation
and launch times.

It runs until SIGINT or SIGTERM; its state is kept in memory only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, f := range flavors {
				fl, err := parseFlavor(f)
				if err != nil {
					return err
				}
				opts.Flavors = append(opts.Flavors, fl)
			}
			if opts.ErrorRate < 0 || opts.ErrorRate > 1 {
				return fmt.Errorf("--error-rate must be from 0 to 1, got %g", opts.ErrorRate)
			}
			if opts.RateLimit < 0 {
				return fmt.Errorf("--rate-limit must be 0 (no limit) or more calls per second, got %g", opts.RateLimit)
			}
			opts.Quota = &quota
			opts.Log = a.logger()
			srv, err := devos.Start(listen, opts)
			if err != nil {
				return err
			}
			defer srv.Close()
			if cloudsFile != "" {
				if _, err := srv.WriteCloudsYAML(cloudsFile, name); err != nil {
					return err
				}
				fmt.Fprintf(a.err, "wrote %s\n", cloudsFile)
				fmt.Fprintf(a.out, "export OS_CLIENT_CONFIG_FILE=%s OS_CLOUD=%s\n", shellQuote(cloudsFile), shellQuote(name))
			} else {
				fmt.Fprint(a.out, srv.CloudsYAML(name))
			}
			fmt.Fprintf(a.err, "dev cloud (OpenStack) listening on %s; auth_url %s; cloud %q; stop with Ctrl-C\n", srv.URL, srv.AuthURL(), name)
			<-cmd.Context().Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:5000", "address to serve every API on (port 0 picks a free one)")
	f.StringVar(&name, "cloud-name", "devcloud", "name of the cloud in the printed clouds.yaml")
	f.StringVar(&cloudsFile, "clouds-yaml", "", "write the clouds.yaml to this file instead of standard output")
	f.StringVar(&opts.Region, "region", devos.DefaultRegion, "region name")
	f.StringVar(&opts.User, "user", devos.DefaultUser, "user name")
	f.StringVar(&opts.Password, "password", devos.DefaultPassword, "user's password")
	f.StringVar(&opts.Project, "project", devos.DefaultProject, "project name")
	f.StringVar(&opts.AppCredentialID, "app-credential-id", "nodepool-appcred", "an application credential's id (a second cloud, <name>-appcred, uses it; empty: none)")
	f.StringVar(&opts.AppCredentialSecret, "app-credential-secret", "appcred-secret", "the application credential's secret")
	f.DurationVar(&opts.Latency, "latency", 0, "time added to every API call (e.g. 50ms)")
	f.DurationVar(&opts.BootTime, "boot-time", 2*time.Second, "how long a server stays in BUILD")
	f.DurationVar(&opts.DeleteTime, "delete-time", 500*time.Millisecond, "how long a deleted server stays visible")
	f.DurationVar(&opts.VolumeTime, "volume-time", 500*time.Millisecond, "how long a volume stays creating or deleting")
	f.Float64Var(&opts.ErrorRate, "error-rate", 0, "share of servers that go to ERROR (No valid host) instead of ACTIVE, 0 to 1")
	f.Float64Var(&opts.RateLimit, "rate-limit", 0, "API calls per second taken from all clients together, beyond which 429 with Retry-After (0: no limit)")
	f.IntVar(&quota.Instances, "quota-instances", quota.Instances, "instances quota (-1: unlimited)")
	f.IntVar(&quota.Cores, "quota-cores", quota.Cores, "cores quota (-1: unlimited)")
	f.IntVar(&quota.RAM, "quota-ram", quota.RAM, "RAM quota in MiB (-1: unlimited)")
	f.IntVar(&quota.Volumes, "quota-volumes", quota.Volumes, "volumes quota (-1: unlimited)")
	f.IntVar(&quota.Gigabytes, "quota-gigabytes", quota.Gigabytes, "volume gigabytes quota (-1: unlimited)")
	f.IntVar(&quota.FloatingIPs, "quota-floating-ips", quota.FloatingIPs, "floating IPs quota (-1: unlimited)")
	f.StringSliceVar(&flavors, "flavor", nil, "a flavor NAME:VCPUS:RAM_MIB:DISK_GIB (repeatable; default DevStack's m1.tiny to m1.xlarge)")
	f.StringSliceVar(&opts.AvailabilityZones, "availability-zone", nil, "availability zones (repeatable; default nova)")
	f.StringSliceVar(&opts.Images, "image", nil, "cloud images present from the start (repeatable; default cirros-0.6.2-x86_64-disk)")
	f.StringVar(&opts.HostIP, "host-ip", "", "address every server gets, fixed and floating (default: from the subnets 10.0.0.0/22 and 172.24.4.0/24)")
	f.IntVar(&opts.PageSize, "page-size", devos.DefaultPageSize, "most items one page of a listing holds")
	return cmd
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:,=@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// parseFlavor reads NAME:VCPUS:RAM:DISK.
func parseFlavor(s string) (devos.Flavor, error) {
	parts := strings.Split(s, ":")
	var f devos.Flavor
	if len(parts) != 4 {
		return f, fmt.Errorf("--flavor %q: expected NAME:VCPUS:RAM_MIB:DISK_GIB, such as m1.small:1:2048:20", s)
	}
	f.Name, f.ID = parts[0], parts[0]
	if _, err := fmt.Sscanf(parts[1]+" "+parts[2]+" "+parts[3], "%d %d %d", &f.VCPUs, &f.RAM, &f.Disk); err != nil || f.VCPUs < 1 || f.RAM < 1 || f.Disk < 0 {
		return f, fmt.Errorf("--flavor %q: expected NAME:VCPUS:RAM_MIB:DISK_GIB with positive numbers, such as m1.small:1:2048:20", s)
	}
	return f, nil
}
