package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const valid = `
labels:
  - name: ubuntu-noble
    min-ready: 2
  - name: debian
providers:
  - name: cloud1
    driver: fake
    boot-delay: 0.5
    delete-delay: 2s
    failure-rate: 0.1
    quota:
      instances: 10
    flavors:
      - name: small
        cores: 2
        ram: 2048
    pools:
      - name: main
        max-servers: 5
        labels:
          - name: ubuntu-noble
            flavor-name: small
          - debian
      - name: unlimited
        labels: [debian]
`

func TestParseValid(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Providers[0]
	if p.BootDelay.D() != 500*time.Millisecond || p.DeleteDelay.D() != 2*time.Second {
		t.Errorf("delays = %v, %v", p.BootDelay.D(), p.DeleteDelay.D())
	}
	if p.Cloud != "cloud1" || p.LaunchRetries != DefaultLaunchRetries || p.BootTimeout.D() != DefaultBootTimeout {
		t.Errorf("defaults not applied: %+v", p)
	}
	if p.Pools[0].MaxServers != 5 || p.Pools[1].MaxServers != Unlimited {
		t.Errorf("max-servers = %d, %d", p.Pools[0].MaxServers, p.Pools[1].MaxServers)
	}
	if p.Pools[0].Labels[1].Name != "debian" || p.Pools[0].Labels[0].FlavorName != "small" {
		t.Errorf("pool labels = %+v", p.Pools[0].Labels)
	}
	if cfg.Labels[0].MinReady != 2 {
		t.Errorf("min-ready = %d", cfg.Labels[0].MinReady)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // each must appear in the error text
	}{
		{"unknown top-level key", "labels: []\nprovider: []\n", []string{"nodepool.yaml:2: provider: unknown key; did you mean \"providers\"? (expected one of: build-log-dir, build-log-retention, diskimages, elements-dir, images-dir, labels, max-hold-age, providers, tenant-resource-limits, webapp"}},
		{"zookeeper server without host", "zookeeper-servers:\n  - port: 2181\nlabels: []\n", []string{`nodepool.yaml:2: zookeeper-servers[0]: missing required key "host"`}},
		{"zookeeper chroot not a path", "zookeeper-servers:\n  - host: zk\n    chroot: nodepool\nlabels: []\n", []string{`zookeeper-servers[0].chroot: expected a ZooKeeper path such as /nodepool, got "nodepool"`}},
		{"zookeeper chroots differ", "zookeeper-servers:\n  - {host: zk1, chroot: /a}\n  - {host: zk2, chroot: /b}\nlabels: []\n", []string{"zookeeper-servers: the entries name different chroots: /a (zookeeper-servers[0]), /b (zookeeper-servers[1])"}},
		{"zookeeper port", "zookeeper-servers:\n  - {host: zk1, port: 99999}\nlabels: []\n", []string{"zookeeper-servers[0].port: expected a port from 1 to 65535, got 99999"}},
		{"zookeeper timeout", "zookeeper-servers:\n  - {host: zk1}\nzookeeper-timeout: soon\nlabels: []\n", []string{`zookeeper-timeout: expected a number of seconds, got "soon"`}},
		{"zookeeper tls incomplete", "zookeeper-servers:\n  - {host: zk1}\nzookeeper-tls: {ca: /ca.pem}\nlabels: []\n", []string{`zookeeper-tls: missing required key "cert"`, `zookeeper-tls: missing required key "key"`}},
		{"unknown label key", "labels:\n  - name: a\n    minready: 1\n", []string{`labels[0].minready: unknown key; did you mean "min-ready"? (expected one of: max-ready-age, min-ready, name)`}},
		{"wrong type", strings.Replace(valid, "max-servers: 5", "max-servers: five", 1), []string{`providers[0].pools[0].max-servers: expected an integer, got "five"`}},
		{"wrong type list", "labels: {name: a}\n", []string{"labels: expected a list, got a mapping"}},
		{"bad duration", strings.Replace(valid, "boot-delay: 0.5", "boot-delay: soon", 1), []string{`providers[0].boot-delay: expected a duration`}},
		{"undefined pool label", strings.Replace(valid, "          - debian\n", "          - debian\n          - centos\n", 1), []string{`providers[0].pools[0].labels[2]: label "centos" is not defined`}},
		{"driver-specific key on the wrong driver", "labels: []\nproviders:\n  - name: s\n    driver: static\n    boot-delay: 1\n    pools: []\n", []string{"providers[0].boot-delay: the static driver has no such key (it is a key of the fake driver)"}},
		{"unknown driver", "labels: []\nproviders:\n  - name: s\n    driver: nonesuch\n    boot-delay: 1\n    pools: []\n", []string{`nodepool.yaml:4: providers[0].driver: unknown driver "nonesuch"; expected one of: aws, fake, kubernetes, metastatic, openstack, static`}},
		{"missing name", "labels:\n  - min-ready: 1\n", []string{`labels[0]: missing required key "name"`}},
		{"duplicate provider", strings.Replace(valid, "providers:\n", "providers:\n  - name: cloud1\n    driver: fake\n    pools: [{name: x}]\n", 1), []string{`provider "cloud1" is defined twice`}},
		{"bad failure rate", strings.Replace(valid, "failure-rate: 0.1", "failure-rate: 2", 1), []string{"providers[0].failure-rate: expected a number from 0 to 1, got 2"}},
		{"unknown flavor", strings.Replace(valid, "flavor-name: small", "flavor-name: medium", 1), []string{`flavor "medium" is not defined`}},
		{"bad provider name", strings.Replace(valid, "name: cloud1", "name: cloud/1", 1), []string{`provider name "cloud/1" is not valid`}},
		{"not yaml", "labels: [a\n", []string{"nodepool.yaml:1: not valid YAML"}},
		{"empty", "", []string{"the file is empty"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("nodepool.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			if !IsErrors(err) {
				t.Errorf("error is not config.Errors: %T", err)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "np.yaml")
	if err := os.WriteFile(path, []byte("labels: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":1: labels: expected a list") {
		t.Fatalf("error = %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || IsErrors(err) {
		t.Fatalf("missing file error = %v", err)
	}
}

func TestSettings(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string // "" means valid
	}{
		{"defaults", nil, ""},
		{"bad role", map[string]string{"NODEPOOL_ROLES": "launcher,janitor"}, `unknown role "janitor"`},
		{"bad replicas", map[string]string{"NODEPOOL_REPLICAS": "2"}, "NODEPOOL_REPLICAS: expected 1, 3 or 5, got 2"},
		{"bad id", map[string]string{"NODEPOOL_ID": "a b"}, `NODEPOOL_ID "a b" is not valid`},
		{"creds without url", map[string]string{"NODEPOOL_NATS_CREDS": "/x"}, "set NODEPOOL_NATS_URL too"},
		{"short lease", map[string]string{"NODEPOOL_LEASE_TTL": "100ms"}, "NODEPOOL_LEASE_TTL: expected at least 1s"},
		{"failed request age", map[string]string{"NODEPOOL_FAILED_REQUEST_AGE": "0s"}, "NODEPOOL_FAILED_REQUEST_AGE: expected a positive duration, got 0s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			s, err := LoadSettings()
			if err == nil {
				err = s.Validate()
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error = %v, want %q", err, c.want)
			}
			if c.want == "" {
				if s.NatsListen != "127.0.0.1:4222" || s.Config != "./nodepool.yaml" || s.DataDir != "./data" ||
					len(s.Roles) != 0 || s.ID == "" || s.HTTPAddr != "127.0.0.1:8005" || s.FailedRequestAge != 24*time.Hour {
					t.Errorf("defaults = %+v", s)
				}
			}
		})
	}
	t.Run("default roles follow the file", func(t *testing.T) {
		plain, err := Parse("a.yaml", []byte("labels: []\n"))
		if err != nil {
			t.Fatal(err)
		}
		withZK, err := Parse("b.yaml", []byte("labels: []\nzookeeper-servers: [{host: zk1}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			roles []string
			cfg   *Config
			want  []string
			err   string
		}{
			{nil, plain, []string{RoleLauncher, RoleBuilder}, ""},
			{nil, withZK, []string{RoleLauncher, RoleBuilder, RoleZooKeeper}, ""},
			{[]string{RoleLauncher}, withZK, []string{RoleLauncher}, ""},
			{[]string{RoleZooKeeper}, withZK, []string{RoleZooKeeper}, ""},
			{[]string{RoleZooKeeper}, plain, nil, "a.yaml names no zookeeper-servers"},
		} {
			s := Settings{Roles: c.roles}
			err := s.ResolveRoles(c.cfg)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("roles %v with %s: error %v, want %q", c.roles, c.cfg.File, err, c.err)
				}
				continue
			}
			if err != nil || !slices.Equal(s.Roles, c.want) {
				t.Errorf("roles %v with %s: %v, %v; want %v", c.roles, c.cfg.File, s.Roles, err, c.want)
			}
		}
	})
	t.Run("bad value type", func(t *testing.T) {
		t.Setenv("NODEPOOL_REPLICAS", "three")
		if _, err := LoadSettings(); err == nil || !strings.Contains(err.Error(), "REPLICAS") {
			t.Fatalf("error = %v", err)
		}
	})
}
