package config

import (
	"strings"
	"testing"
	"time"
)

const hostKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"

const staticAndMeta = `
labels:
  - name: big
  - name: small
  - name: static-a
  - name: static-b
providers:
  - name: cloud
    driver: fake
    pools:
      - name: main
        labels: [big]
  - name: rack
    driver: static
    pools:
      - name: main
        nodes:
          - name: host1.example.com
            labels: static-a
            host-key: "` + hostKey + ` root@host1"
          - name: 192.0.2.7
            labels: [static-b, static-a]
            username: ci
            connection-port: 2222
            timeout: 13
            host-key-checking: false
            max-parallel-jobs: 3
          - name: win.example.com
            labels: [static-b]
            connection-type: winrm
  - name: meta
    driver: metastatic
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 8
            grace-time: 0
            min-retention-time: 2m
            max-age: 1h
`

func TestParseStaticAndMetastatic(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(staticAndMeta))
	if err != nil {
		t.Fatal(err)
	}
	rack, _ := cfg.Provider("rack")
	pool := rack.Pools[0]
	var labels []string
	for _, l := range pool.Labels {
		labels = append(labels, l.Name)
	}
	if strings.Join(labels, ",") != "static-a,static-b" {
		t.Errorf("static pool labels = %v, want the nodes' labels static-a,static-b", labels)
	}
	if pool.MaxServers != Unlimited {
		t.Errorf("static pool max-servers = %d", pool.MaxServers)
	}
	tests := []struct {
		node            StaticNode
		user, ctype     string
		port, jobs      int
		timeout         time.Duration
		checks, gathers bool
		keys            int
		wantLabels      string
	}{
		{pool.Nodes[0], "zuul", "ssh", 22, 1, 5 * time.Second, true, true, 1, "static-a"},
		{pool.Nodes[1], "ci", "ssh", 2222, 3, 13 * time.Second, false, true, 0, "static-b,static-a"},
		{pool.Nodes[2], "zuul", "winrm", 5986, 1, 5 * time.Second, true, false, 0, "static-b"},
	}
	for _, tc := range tests {
		n := tc.node
		if n.Username != tc.user || n.ConnectionType != tc.ctype || n.ConnectionPort != tc.port || n.MaxParallelJobs != tc.jobs ||
			n.Timeout.D() != tc.timeout || n.ChecksHostKey() != tc.checks || n.GathersHostKeys() != tc.gathers ||
			len(n.HostKey) != tc.keys || strings.Join(n.Labels, ",") != tc.wantLabels {
			t.Errorf("node %s = %+v", n.Name, n)
		}
	}
	meta, _ := cfg.Provider("meta")
	ml := meta.Pools[0].Labels[0]
	if ml.BackingLabel != "big" || ml.MaxParallelJobs != 8 || ml.GraceTime != 0 || ml.MinRetentionTime.D() != 2*time.Minute || ml.MaxAge.D() != time.Hour {
		t.Errorf("metastatic label = %+v", ml)
	}

	// Defaults of a metastatic label given as a plain mapping.
	cfg, err = Parse("nodepool.yaml", []byte(strings.Replace(staticAndMeta, "            max-parallel-jobs: 8\n            grace-time: 0\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	meta, _ = cfg.Provider("meta")
	if ml := meta.Pools[0].Labels[0]; ml.MaxParallelJobs != 1 || ml.GraceTime.D() != time.Minute {
		t.Errorf("metastatic defaults = %+v, want max-parallel-jobs 1 and grace-time 60s", ml)
	}
}

func TestParseHostKey(t *testing.T) {
	got, err := ParseHostKey(hostKey + " comment here")
	if err != nil || got != hostKey {
		t.Errorf("ParseHostKey = %q, %v; want %q", got, err, hostKey)
	}
	if _, err := ParseHostKey("fake-key"); err == nil {
		t.Error("ParseHostKey accepted fake-key")
	}
}

func TestParseStaticAndMetastaticErrors(t *testing.T) {
	cases := []struct {
		name, from, to string
		want           []string
	}{
		{"labels in a static pool", "        nodes:\n          - name: host1", "        labels: [static-a]\n        nodes:\n          - name: host1",
			[]string{"providers[1].pools[0].labels: the static driver has no such key; expected one of: max-servers, name, node-attributes, nodes, priority"}},
		{"node without labels", "            labels: static-a\n", "",
			[]string{`providers[1].pools[0].nodes[0]: missing required key "labels"`}},
		{"undefined node label", "labels: [static-b, static-a]", "labels: [static-b, static-c]",
			[]string{`providers[1].pools[0].nodes[1].labels[1]: label "static-c" is not defined`}},
		{"bad connection type", "connection-type: winrm", "connection-type: tel net",
			[]string{`nodes[2].connection-type: expected a connection type such as ssh, winrm or network_cli, got "tel net"`}},
		{"bad port", "connection-port: 2222", "connection-port: 0",
			[]string{"nodes[1].connection-port: expected a port from 1 to 65535, got 0"}},
		{"duplicate host", "          - name: win.example.com", "          - name: host1.example.com\n            labels: static-a\n          - name: win.example.com",
			[]string{"providers[1].pools[0].nodes[2]: host host1.example.com (username zuul, port 22) is listed twice (also providers[1].pools[0].nodes[0])"}},
		{"missing backing label", "            backing-label: big\n", "",
			[]string{`providers[2].pools[0].labels[0]: missing required key "backing-label"`}},
		{"undefined backing label", "backing-label: big", "backing-label: huge",
			[]string{`providers[2].pools[0].labels[0].backing-label: label "huge" is not defined`}},
		{"metastatic backing label", "backing-label: big", "backing-label: small",
			[]string{`backing-label: label "small" is itself served by metastatic pool meta/main`}},
		{"max-age below min-retention", "max-age: 1h", "max-age: 1m",
			[]string{"labels[0].max-age: max-age (1m0s) must be at least min-retention-time (2m0s)"}},
		{"metastatic key on a fake pool", "        labels: [big]\n", "        labels:\n          - name: big\n            grace-time: 5\n",
			[]string{"providers[0].pools[0].labels[0].grace-time: the fake driver has no such key (it is a key of the metastatic driver)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(staticAndMeta, tc.from) {
				t.Fatalf("test setup: %q not in the base configuration", tc.from)
			}
			_, err := Parse("nodepool.yaml", []byte(strings.Replace(staticAndMeta, tc.from, tc.to, 1)))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}
