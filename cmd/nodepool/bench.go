package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/bench"
)

func (a *app) benchCmd() *cobra.Command {
	var (
		n           int
		runs        int
		replicas    int
		asJSON      bool
		workDir     string
		printConfig bool
		cloud       bench.CloudOptions
		devcloud    string
	)
	var names []string
	for _, s := range bench.Scenarios() {
		names = append(names, s.Name)
	}
	cmd := &cobra.Command{
		Use:   "bench SCENARIO",
		Short: "Measure nodepool through the public contract: " + strings.Join(names, ", "),
		Long: `Measure nodepool as users feel it, through the public contract only: publish
requests, watch the request and node buckets, take and give back nodes.

By default the bench starts what it measures: a NATS server of its own and
launcher processes (this binary's "run") with the scenario's configuration
(see --print-config). With --nats-url (or NODEPOOL_NATS_URL) it drives a
running system instead, which must run the scenario's configuration; the
launchers' CPU and RSS are then read from /proc when they run on this
machine. Each run also measures the raw rate of revision-checked KV updates
on the same server and prints the throughput as a ratio to it.

Scenarios:
` + scenarioHelp(),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, ok := bench.Lookup(args[0])
			if !ok {
				return fmt.Errorf("unknown scenario %q; expected one of: %s", args[0], strings.Join(names, ", "))
			}
			if n == 0 {
				n = sc.DefaultN
			}
			if n < 1 || runs < 1 {
				return fmt.Errorf("--n and --runs must be 1 or more")
			}
			if replicas != 1 && replicas != 3 && replicas != 5 {
				return fmt.Errorf("--replicas is %d; expected 1, 3 or 5", replicas)
			}
			if replicas > 1 && a.settings.NatsURL != "" {
				return fmt.Errorf("--replicas starts a cluster of the bench's own; a running system (--nats-url) has the replicas it was started with")
			}
			if printConfig {
				fmt.Fprint(a.out, sc.Config(n))
				return nil
			}
			binary, err := os.Executable()
			if err != nil {
				return err
			}
			keep := func() {}
			if workDir == "" {
				if workDir, err = os.MkdirTemp("", "nodepool-bench-"); err != nil {
					return err
				}
				// A temporary folder goes once every run passed; a failed
				// run's logs stay where the error says.
				kept := false
				defer func() {
					if !kept {
						os.RemoveAll(workDir)
					}
				}()
				keep = func() { kept = true }
			}
			var all []bench.Result
			for i := range runs {
				dir := fmt.Sprintf("%s/run-%d", workDir, i)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				fmt.Fprintf(a.err, "run %d of %d: %s, n=%d\n", i+1, runs, sc.Name, n)
				rs, err := sc.Run(cmd.Context(), bench.Options{URL: a.settings.NatsURL, Binary: binary, WorkDir: dir, Log: a.logger(),
					Cloud: cloud, DevCloud: devcloudBinary(binary, devcloud), Replicas: replicas}, n)
				all = append(all, rs...)
				if err != nil {
					keep()
					return fmt.Errorf("run %d: %w (launcher logs in %s)", i+1, err, dir)
				}
			}
			if asJSON {
				return writeJSON(a.out, all)
			}
			return printResults(a.out, all)
		},
	}
	f := cmd.Flags()
	f.IntVar(&n, "n", 0, "size: requests, or nodes for scale (default per scenario)")
	f.IntVar(&runs, "runs", 1, "runs on fresh systems; with more than one, medians with min and max are printed too")
	f.IntVar(&replicas, "replicas", 1, "1, or 3 or 5: the bench's NATS is a cluster of that many servers (in its process) and streams and buckets have that many replicas, as in production (for scale, the launcher then runs without an embedded server, and its RSS is its own)")
	f.BoolVar(&asJSON, "json", false, "print every run's figures as JSON")
	f.StringVar(&workDir, "work-dir", "", "where to keep configurations, data and launcher logs (default: a temporary folder)")
	f.BoolVar(&printConfig, "print-config", false, "print the scenario's nodepool.yaml and exit")
	f.StringVar(&cloud.Name, "cloud", "", "cloud scenario: the cloud on loopback whose real driver runs (aws, openstack; default openstack)")
	f.DurationVar(&cloud.Latency, "cloud-latency", 50*time.Millisecond, "cloud scenario: latency of every API call")
	f.DurationVar(&cloud.Boot, "cloud-boot", 2*time.Second, "cloud scenario: boot time of a server")
	f.StringVar(&devcloud, "devcloud", "", "cloud scenario: the nodepool-devcloud binary that runs the cloud (default: the one beside this binary, else on PATH)")
	f.Float64Var(&cloud.RateLimit, "cloud-rate", 100, "cloud scenario: API calls per second of the runs with a rate (the provider's rate key, in the driver's own unit); 0 leaves those runs out")
	return cmd
}

// devcloudBinary is the nodepool-devcloud binary the cloud scenario runs:
// the one named, else the one beside nodepool, else the one on PATH ("":
// none, which the scenario says when it needs one).
func devcloudBinary(nodepool, named string) string {
	if named != "" {
		return named
	}
	beside := filepath.Join(filepath.Dir(nodepool), "nodepool-devcloud")
	if st, err := os.Stat(beside); err == nil && !st.IsDir() {
		return beside
	}
	path, _ := exec.LookPath("nodepool-devcloud")
	return path
}

func scenarioHelp() string {
	var b strings.Builder
	for _, s := range bench.Scenarios() {
		fmt.Fprintf(&b, "  %-9s %s (default N=%d)\n", s.Name, s.Description, s.DefaultN)
	}
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func printResults(w interface{ Write([]byte) (int, error) }, rs []bench.Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trequests\tmakespan s\treq/s\tlat min ms\tp50\tp95\tp99\tmax\tcleanup s\tCPU s\tpeak RSS MiB\tKV upd/s\tratio\textra\t")
	for _, r := range rs {
		var extra []string
		keys := make([]string, 0, len(r.Extra))
		for k := range r.Extra {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			extra = append(extra, fmt.Sprintf("%s=%.3g", k, r.Extra[k]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.2f\t%.1f\t%.0f\t%.4f\t%s\t\n",
			r.Scenario, r.Requests, r.Makespan.Seconds(), r.Throughput,
			ms(r.Latency.Min), ms(r.Latency.P50), ms(r.Latency.P95), ms(r.Latency.P99), ms(r.Latency.Max),
			r.Cleanup.Seconds(), r.LauncherCPU.Seconds(), float64(r.LauncherPeakRSS)/(1<<20), r.KVUpdateRate, r.Ratio, strings.Join(extra, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Medians over runs, per scenario.
	byName := map[string][]bench.Result{}
	var order []string
	for _, r := range rs {
		if _, ok := byName[r.Scenario]; !ok {
			order = append(order, r.Scenario)
		}
		byName[r.Scenario] = append(byName[r.Scenario], r)
	}
	if len(rs) == len(order) {
		return nil
	}
	fmt.Fprintln(w, "\nmedian [min, max] over runs:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\truns\treq/s\tp50 ms\tp95 ms\tp99 ms\tmakespan s\tcleanup s\tratio")
	for _, name := range order {
		group := byName[name]
		pick := func(f func(bench.Result) float64) string {
			var v []float64
			for _, r := range group {
				v = append(v, f(r))
			}
			m := bench.Summarize(v)
			return fmt.Sprintf("%.4g [%.4g, %.4g]", m.Median, m.Min, m.Max)
		}
		msf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, len(group),
			pick(func(r bench.Result) float64 { return r.Throughput }),
			pick(func(r bench.Result) float64 { return msf(r.Latency.P50) }),
			pick(func(r bench.Result) float64 { return msf(r.Latency.P95) }),
			pick(func(r bench.Result) float64 { return msf(r.Latency.P99) }),
			pick(func(r bench.Result) float64 { return r.Makespan.Seconds() }),
			pick(func(r bench.Result) float64 { return r.Cleanup.Seconds() }),
			pick(func(r bench.Result) float64 { return r.Ratio }))
	}
	return tw.Flush()
}
