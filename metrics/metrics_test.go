package metrics_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

const testConfig = `
labels: [{name: small}, {name: big}]
providers:
  - name: cloud1
    driver: fake
    pools: [{name: main, max-servers: 10, labels: [small, big]}]
`

func testConfigOf(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// statsdServer is a UDP socket that collects the names of the statsd
// lines sent to it.
type statsdServer struct {
	conn  net.PacketConn
	lines chan string
}

func startStatsd(t *testing.T) *statsdServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// What a test sends stays well under this, so that no line is lost.
	if err := conn.(*net.UDPConn).SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	s := &statsdServer{conn: conn, lines: make(chan string, 100000)}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				s.lines <- line
			}
		}
	}()
	return s
}

// names sends a last line through sd and returns the names of every line
// received before it.
func (s *statsdServer) names(t *testing.T, sd *metrics.Statsd) map[string]bool {
	t.Helper()
	sd.Count(1, "test", "end")
	names := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line := <-s.lines:
			name, _, _ := strings.Cut(line, ":")
			if name == "test.end" {
				return names
			}
			names[name] = true
		case <-deadline:
			t.Fatal("the statsd lines never came")
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// series lists the label sets of a metric family, as name{k=v,...}.
func series(t *testing.T, r *metrics.Registry, name string) []string {
	t.Helper()
	fams, err := r.Prometheus().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out = append(out, labelString(m))
		}
	}
	return out
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, lp := range m.GetLabel() {
		parts = append(parts, lp.GetName()+"="+lp.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Launches whose requestor, provider, label or availability zone come from
// outside the configuration make no new series: a requestor is no label,
// a provider or label the configuration lacks is "other", and only the
// first few availability zones and requestors keep their names. Four
// requests of `nodepool request --requestor job-$RANDOM` made four
// histogram sets.
func TestLaunchSeriesAreBounded(t *testing.T) {
	t.Parallel()
	cfg := testConfigOf(t)
	for _, tc := range []struct {
		name   string
		launch func(m *metrics.Launcher, i int)
		want   []string // the launch series, when every launch is ready
	}{
		{"requestors", func(m *metrics.Launcher, i int) {
			m.Launch(metrics.LaunchReady, "cloud1", "az1", "small", "", fmt.Sprintf("job-%d", i), time.Second)
		}, []string{"{az=az1,image=,label=small,provider=cloud1,result=ready}"}},
		{"labels and providers", func(m *metrics.Launcher, i int) {
			m.Launch(metrics.LaunchReady, fmt.Sprintf("cloud-%d", i), "", fmt.Sprintf("label-%d", i), "", "zuul", time.Second)
			m.Launch(metrics.LaunchReady, "cloud1", "", fmt.Sprintf("label-%d", i), "", "zuul", time.Second)
		}, []string{"{az=,image=,label=other,provider=cloud1,result=ready}", "{az=,image=,label=other,provider=other,result=ready}"}},
		{"availability zones", func(m *metrics.Launcher, i int) {
			m.Launch(metrics.LaunchReady, "cloud1", fmt.Sprintf("az-%d", i), "big", "", "zuul", time.Second)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			udp := startStatsd(t)
			sd, err := metrics.NewStatsd(udp.conn.LocalAddr().String(), quiet())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sd.Close)
			reg := metrics.New(sd)
			m := metrics.NewLauncher(reg, func() *config.Config { return cfg })
			const n = 100 // more than the requestors and zones that keep their names
			for i := range n {
				tc.launch(m, i)
			}
			got := series(t, reg, "nodepool_launch_duration_seconds")
			if tc.want != nil && strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("series %v, want %v", got, tc.want)
			}
			if len(got) > 70 {
				t.Errorf("%d launches made %d series", n, len(got))
			}
			for _, s := range got {
				if strings.Contains(s, "requestor") {
					t.Errorf("series %s has a requestor", s)
				}
			}
			names := udp.names(t, sd)
			requestors, azs := 0, 0
			for name := range names {
				switch {
				case strings.HasPrefix(name, "nodepool.launch.requestor."):
					requestors++
				case strings.HasPrefix(name, "nodepool.launch.provider.cloud1.az"):
					azs++
				}
				if strings.Contains(name, "cloud-") || strings.Contains(name, "label-") {
					t.Errorf("statsd name %s is not in the configuration", name)
				}
			}
			if requestors > 21 || azs > 65 || len(names) > 100 {
				t.Errorf("%d launches sent %d statsd names, %d of requestors, %d of availability zones", n, len(names), requestors, azs)
			}
			if !names["nodepool.launch.ready"] || (tc.name == "requestors" && !names["nodepool.launch.requestor.job-0.ready"]) {
				t.Errorf("Nodepool's statsd names are missing: %v", names)
			}
		})
	}
}

// Failed launches are counted by provider and kind, from zero, with names
// from the configuration and a fixed list of kinds.
func TestLaunchFailures(t *testing.T) {
	t.Parallel()
	cfg := testConfigOf(t)
	reg := metrics.New(nil)
	m := metrics.NewLauncher(reg, func() *config.Config { return cfg })
	if got := len(series(t, reg, "nodepool_launch_failures_total")); got != len(metrics.LaunchFailureKinds) {
		t.Errorf("%d series before any failure, want one per kind (%d)", got, len(metrics.LaunchFailureKinds))
	}
	for _, tc := range []struct {
		provider, kind string
		want           string
	}{
		{"cloud1", "quota", "provider=cloud1,kind=quota"},
		{"cloud1", "boot_timeout", "provider=cloud1,kind=boot_timeout"},
		{"cloud1", "no-such-kind", "provider=cloud1,kind=other"},
		{"gone", "fatal", "provider=other,kind=fatal"},
	} {
		before := reg.Sum("nodepool_launch_failures_total", strings.Split(tc.want, ",")...)
		m.LaunchFailed(tc.provider, tc.kind)
		if got := reg.Sum("nodepool_launch_failures_total", strings.Split(tc.want, ",")...); got != before+1 {
			t.Errorf("LaunchFailed(%q, %q): %s counts %v, want %v", tc.provider, tc.kind, tc.want, got, before+1)
		}
	}
	if got := len(series(t, reg, "nodepool_launch_failures_total")); got != len(metrics.LaunchFailureKinds)+1 {
		t.Errorf("%d series, want %d", got, len(metrics.LaunchFailureKinds)+1)
	}
}

// The gauges of the whole system count records whose provider, pool,
// label or state neither the configuration nor a live pool has as
// "other", in Prometheus and statsd.
func TestSystemGaugesAreBounded(t *testing.T) {
	t.Parallel()
	cfg := testConfigOf(t)
	udp := startStatsd(t)
	sd, err := metrics.NewStatsd(udp.conn.LocalAddr().String(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sd.Close)
	nodes := []kv.Node{
		{ID: "1", State: kv.NodeReady, Provider: "cloud1", Pool: "main", Labels: []string{"small"}},
		{ID: "2", State: kv.NodeReady, Provider: "cloud2", Pool: "live", Labels: []string{"theirs"}}, // a live pool of another process
	}
	requests := []kv.Request{{ID: "r1", State: kv.RequestFailed, Labels: []string{"small"}}}
	for i := range 200 {
		nodes = append(nodes, kv.Node{ID: fmt.Sprint("x", i), State: kv.NodeState(fmt.Sprint("exploding-", i)),
			Provider: fmt.Sprint("p-", i), Pool: fmt.Sprint("pool-", i), Labels: []string{fmt.Sprint("label-", i)}})
		nodes = append(nodes, kv.Node{ID: fmt.Sprint("y", i), State: kv.NodeInUse,
			Provider: "cloud1", Pool: fmt.Sprint("pool-", i), Labels: []string{"big"}})
		requests = append(requests, kv.Request{ID: fmt.Sprint("r", i), State: kv.RequestState(fmt.Sprint("weird-", i))})
	}
	reg := metrics.New(sd)
	sys := metrics.NewSystem(reg, metrics.SystemSource{
		Leader: func() bool { return true },
		Nodes: func(yield func(*kv.Node) bool) {
			for i := range nodes {
				if !yield(&nodes[i]) {
					return
				}
			}
		},
		Requests: func(yield func(*kv.Request) bool) {
			for i := range requests {
				if !yield(&requests[i]) {
					return
				}
			}
		},
		Pools: func() []kv.ComponentPool {
			return []kv.ComponentPool{{Provider: "cloud1", Pool: "main", Labels: []string{"small", "big"}}, {Provider: "cloud2", Pool: "live", Labels: []string{"theirs"}}}
		},
		Config: func() *config.Config { return cfg },
	})
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"nodepool_nodes", []string{"provider=cloud1", "pool=main", "state=ready"}, 1},
		{"nodepool_nodes", []string{"provider=cloud2", "pool=live", "state=ready"}, 1},
		{"nodepool_nodes", []string{"provider=other", "pool=other", "state=other"}, 200},
		{"nodepool_nodes", []string{"provider=cloud1", "pool=other", "state=in-use"}, 200},
		{"nodepool_label_nodes", []string{"provider=other", "label=other", "state=other"}, 200},
		{"nodepool_label_nodes", []string{"provider=cloud2", "label=theirs", "state=ready"}, 1},
		{"nodepool_label_nodes", []string{"provider=cloud1", "label=big", "state=in-use"}, 200},
		{"nodepool_requests", []string{"state=failed"}, 1},
		{"nodepool_requests", []string{"state=other"}, 200},
	} {
		if got := reg.Sum(tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	for _, name := range []string{"nodepool_nodes", "nodepool_label_nodes", "nodepool_requests"} {
		got := series(t, reg, name)
		if len(got) > 60 {
			t.Errorf("%s has %d series", name, len(got))
		}
		for _, s := range got {
			if strings.Contains(s, "-1") {
				t.Errorf("%s%s names what is not in the configuration", name, s)
			}
		}
	}
	sys.Send()
	names := udp.names(t, sd)
	for name := range names {
		if strings.Contains(name, "p-") || strings.Contains(name, "label-") || strings.Contains(name, "exploding") {
			t.Errorf("statsd name %s is not in the configuration", name)
		}
	}
	if !names["nodepool.label.other.nodes.other"] || !names["nodepool.provider.cloud1.nodes.ready"] {
		t.Errorf("statsd names: %v", names)
	}
}
