package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/bench"
)

// `nodepool bench` runs each scenario end to end on a system it starts and
// reports figures that hang together.
func TestBenchScenarios(t *testing.T) {
	t.Parallel()
	cases := []struct {
		scenario string
		n        string
		results  int
		args     []string
	}{
		{"fresh", "20", 1, nil},
		{"fresh", "20", 1, []string{"--replicas", "3"}}, // a cluster of three servers, as production runs
		{"ready", "20", 2, nil},
		{"churn", "30", 1, nil},
		{"scale", "300", 1, nil},
		{"scale", "300", 1, []string{"--replicas", "3"}}, // the launcher without an embedded server
		{"scaleout", "20", 2, nil},
		{"queued", "40", 1, nil},
		{"cloud", "10", 2, []string{"--cloud", "aws", "--cloud-rate", "0", "--cloud-boot", "200ms", "--cloud-latency", "5ms"}},
		{"cloud", "10", 2, []string{"--cloud", "openstack", "--cloud-rate", "0", "--cloud-boot", "200ms", "--cloud-latency", "5ms"}},
	}
	for _, c := range cases {
		name := c.scenario
		replicas := 1.0
		switch {
		case len(c.args) > 1 && c.args[0] == "--cloud":
			name += "-" + c.args[1]
		case len(c.args) > 1 && c.args[0] == "--replicas":
			name += "-replicas-" + c.args[1]
			replicas = 3
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if c.scenario == "cloud" {
				buildDevCloud(t)
			}
			out, errOut, code := nodepool(t, nil, append([]string{"bench", c.scenario, "--n", c.n, "--json", "--work-dir", t.TempDir()}, c.args...)...)
			if code != 0 {
				t.Fatalf("bench %s: exit %d\n%s", c.scenario, code, errOut)
			}
			var rs []bench.Result
			if err := json.Unmarshal([]byte(out), &rs); err != nil {
				t.Fatalf("output is not JSON results: %v\n%s", err, out)
			}
			if len(rs) != c.results {
				t.Fatalf("%d results, want %d", len(rs), c.results)
			}
			for _, r := range rs {
				l := r.Latency
				if r.Requests == 0 || r.Throughput <= 0 || r.Makespan <= 0 || l.Min <= 0 || l.Min > l.P50 || l.P50 > l.P99 || l.P99 > l.Max {
					t.Errorf("implausible figures: %+v", r)
				}
				if r.KVUpdateRate <= 0 || r.Ratio <= 0 || r.LauncherCPU <= 0 || r.LauncherPeakRSS <= 0 {
					t.Errorf("missing KV rate, ratio or launcher usage: %+v", r)
				}
				// The nodes bucket's replicas, as the servers report them.
				if got, ok := r.Extra["replicas"]; !strings.HasPrefix(r.Scenario, "scale,") && (!ok || got != replicas) {
					t.Errorf("the nodes bucket has %v replicas (reported: %v), want %v", got, ok, replicas)
				}
				// A launch and a delete per request, each a message of the
				// work stream delivered at least once.
				if r.Scenario == "queued" && (r.Extra["work_deliveries_per_request"] < 2 || r.Extra["work_messages_per_request"] < 2 || r.Extra["writes_per_request"] < 5) {
					t.Errorf("queued extras: %+v", r.Extra)
				}
				if strings.HasPrefix(r.Scenario, "scale,") && (r.Extra["list_seconds"] <= 0 || r.Extra["restart_seconds"] <= 0 || r.Extra["list_lines"] < 300) {
					t.Errorf("scale extras: %+v", r.Extra)
				}
				// Against a cluster, the restart's requests as the servers
				// saw them: at least the buckets' and the streams'.
				if _, ok := r.Extra["restart_api_requests"]; strings.HasPrefix(r.Scenario, "scale,") && (replicas > 1) != ok ||
					ok && r.Extra["restart_api_requests"] < 12 {
					t.Errorf("scale's API requests at restart (replicas %v): %+v", replicas, r.Extra)
				}
				// What the cloud, a process of nodepool-devcloud, counted and
				// timed.
				if strings.HasPrefix(r.Scenario, "cloud ") && (r.Extra["api_calls_per_node"] <= 0 || r.Extra["boot_p50_ms"] < 200) {
					t.Errorf("cloud extras: %+v", r.Extra)
				}
			}
		})
	}
	_, errOut, code := nodepool(t, nil, "bench", "nosuch")
	if code == 0 || !strings.Contains(errOut, `unknown scenario "nosuch"; expected one of: fresh, ready, churn, scale, scaleout, queued, cloud`) {
		t.Errorf("unknown scenario: exit %d, %q", code, errOut)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "fresh", "--replicas", "2"}, "--replicas is 2; expected 1, 3 or 5"},
	} {
		if _, errOut, code := nodepool(t, nil, bad.args...); code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("%v: exit %d, %q; want an error saying %q", bad.args, code, errOut, bad.want)
		}
	}
	out, _, code := nodepool(t, nil, "bench", "churn", "--print-config")
	if code != 0 || !strings.Contains(out, "max-servers: 20") {
		t.Errorf("print-config: %q", out)
	}
}
