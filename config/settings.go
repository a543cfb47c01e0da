package config

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Roles a process can run.
const (
	RoleLauncher = "launcher"
	RoleBuilder  = "builder"
	// RoleZooKeeper serves Zuul in the ZooKeeper ensemble nodepool.yaml
	// names (zookeeper-servers), as a Nodepool launcher does.
	RoleZooKeeper = "zookeeper"
)

// EnvPrefix is the prefix of every process setting in the environment.
const EnvPrefix = "NODEPOOL"

// Settings are the process settings: where NATS is, which worker groups to
// run, who this process is. They come from NODEPOOL_* environment variables
// (see the README) and may be overridden by flags of `nodepool run`.
type Settings struct {
	NatsURL     string `envconfig:"NATS_URL" desc:"NATS server URL(s), comma separated; empty starts an embedded server"`
	NatsCreds   string `envconfig:"NATS_CREDS" desc:"credentials file for an external NATS server"`
	NatsTLSCA   string `envconfig:"NATS_TLS_CA" desc:"CA certificate for an external NATS server"`
	NatsTLSCert string `envconfig:"NATS_TLS_CERT" desc:"client certificate for an external NATS server"`
	NatsTLSKey  string `envconfig:"NATS_TLS_KEY" desc:"client key for an external NATS server"`
	NatsListen  string `envconfig:"NATS_LISTEN" default:"127.0.0.1:4222" desc:"address of the embedded NATS server"`
	// Owner is the requestor identity of the client commands (request,
	// return, hold): requests are published on
	// nodepool.requests.<owner>.new, and nodes and requests acted on
	// through nodepool.api.<owner>.<verb>.
	Owner    string   `envconfig:"OWNER" desc:"requestor identity of the client commands; default: the user of NODEPOOL_NATS_URL, else anonymous"`
	Config   string   `envconfig:"CONFIG" default:"./nodepool.yaml" desc:"path of nodepool.yaml"`
	Secure   string   `envconfig:"SECURE" desc:"path of the secure file merged over nodepool.yaml (diskimage env-vars); empty: none"`
	DataDir  string   `envconfig:"DATA_DIR" default:"./data" desc:"embedded JetStream store and image files"`
	Roles    []string `envconfig:"ROLES" desc:"worker groups to run: launcher, builder, zookeeper; empty: launcher and builder, and zookeeper when nodepool.yaml names zookeeper-servers"`
	ID       string   `envconfig:"ID" desc:"this process's identity in records and leases (default hostname-pid)"`
	HTTPAddr string   `envconfig:"HTTP_ADDR" default:"127.0.0.1:8005" desc:"status API and Prometheus metrics address; empty turns it off"`
	// HTTPAddrSet tells whether NODEPOOL_HTTP_ADDR (or --http-addr) was
	// given; if not, nodepool.yaml's webapp section may set the address.
	HTTPAddrSet  bool          `ignored:"true"`
	PprofAddr    string        `envconfig:"PPROF_ADDR" desc:"address of Go's profiling endpoints (/debug/pprof/); empty (the default) turns them off"`
	Replicas     int           `envconfig:"REPLICAS" default:"1" desc:"replicas for streams and buckets: 1, 3 or 5"`
	LeaseTTL     time.Duration `envconfig:"LEASE_TTL" default:"10s" desc:"how long a lease or heartbeat lives without renewal"`
	LogLevel     string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat    string        `envconfig:"LOG_FORMAT" default:"text" desc:"text or json"`
	SyncInterval time.Duration `envconfig:"SYNC_INTERVAL" default:"5s" desc:"how often periodic sweeps run (cleanup, min-ready, lost work)"`
	// FailedRequestAge is how long a failed request record is kept (from
	// its state_time) before cleanup deletes it.
	FailedRequestAge time.Duration `envconfig:"FAILED_REQUEST_AGE" default:"24h" desc:"how long a failed request is kept before cleanup deletes it"`
	// The builder role's worker groups: builds and uploads this process
	// runs at once (0: none).
	BuildWorkers  int `envconfig:"BUILD_WORKERS" default:"1" desc:"image builds this process runs at once (builder role)"`
	UploadWorkers int `envconfig:"UPLOAD_WORKERS" default:"4" desc:"image uploads this process runs at once (builder role)"`
}

// LoadSettings reads the settings from the environment and fills in the
// defaults that depend on the machine.
func LoadSettings() (Settings, error) {
	var s Settings
	if err := envconfig.Process(EnvPrefix, &s); err != nil {
		return s, fmt.Errorf("reading %s_* settings: %w", EnvPrefix, err)
	}
	_, s.HTTPAddrSet = os.LookupEnv(EnvPrefix + "_HTTP_ADDR")
	return s, nil
}

// StatusAddr is where the status API listens: NODEPOOL_HTTP_ADDR when it
// is given (empty: nowhere); otherwise nodepool.yaml's webapp section, as
// in Nodepool; otherwise the default, 127.0.0.1:8005.
func (s *Settings) StatusAddr(cfg *Config) string {
	if !s.HTTPAddrSet && cfg != nil && cfg.Webapp != nil {
		return cfg.Webapp.Addr()
	}
	return s.HTTPAddr
}

// LoadConfig loads the configuration the settings name: NODEPOOL_CONFIG
// with NODEPOOL_SECURE merged over it.
func (s *Settings) LoadConfig() (*Config, error) { return LoadFiles(s.Config, s.Secure) }

// idRE is what a process id may hold: it becomes a KV key.
var idRE = regexp.MustCompile(`^[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,127}$`)

// DefaultID is hostname-pid, with characters a KV key cannot hold replaced.
func DefaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "nodepool"
	}
	host = regexp.MustCompile(`[^A-Za-z0-9_=.-]`).ReplaceAllString(host, "-")
	return fmt.Sprintf("%s-%d", strings.Trim(host, "."), os.Getpid())
}

// Validate checks the settings and fills in the process id if unset.
func (s *Settings) Validate() error {
	var problems []string
	if s.ID == "" {
		s.ID = DefaultID()
	}
	if !idRE.MatchString(s.ID) {
		problems = append(problems, fmt.Sprintf("NODEPOOL_ID %q is not valid; expected 1 to 128 of A-Z a-z 0-9 _ = . - (not starting with a dot)", s.ID))
	}
	for _, r := range s.Roles {
		if r != RoleLauncher && r != RoleBuilder && r != RoleZooKeeper {
			problems = append(problems, fmt.Sprintf("NODEPOOL_ROLES: unknown role %q; expected launcher, builder, zookeeper, or several of them comma separated", r))
		}
	}
	if s.Replicas != 1 && s.Replicas != 3 && s.Replicas != 5 {
		problems = append(problems, fmt.Sprintf("NODEPOOL_REPLICAS: expected 1, 3 or 5, got %d", s.Replicas))
	}
	if s.LeaseTTL < time.Second {
		problems = append(problems, fmt.Sprintf("NODEPOOL_LEASE_TTL: expected at least 1s, got %s", s.LeaseTTL))
	}
	if s.SyncInterval <= 0 {
		problems = append(problems, fmt.Sprintf("NODEPOOL_SYNC_INTERVAL: expected a positive duration, got %s", s.SyncInterval))
	}
	if s.FailedRequestAge <= 0 {
		problems = append(problems, fmt.Sprintf("NODEPOOL_FAILED_REQUEST_AGE: expected a positive duration, got %s", s.FailedRequestAge))
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, s.LogLevel) {
		problems = append(problems, fmt.Sprintf("NODEPOOL_LOG_LEVEL: expected debug, info, warn or error, got %q", s.LogLevel))
	}
	if s.LogFormat != "text" && s.LogFormat != "json" {
		problems = append(problems, fmt.Sprintf("NODEPOOL_LOG_FORMAT: expected text or json, got %q", s.LogFormat))
	}
	if s.BuildWorkers < 0 || s.UploadWorkers < 0 {
		problems = append(problems, fmt.Sprintf("NODEPOOL_BUILD_WORKERS and NODEPOOL_UPLOAD_WORKERS: expected 0 or more, got %d and %d", s.BuildWorkers, s.UploadWorkers))
	}
	if s.Owner != "" && !ownerRE.MatchString(s.Owner) {
		problems = append(problems, fmt.Sprintf("NODEPOOL_OWNER %q is not valid; expected 1 to 64 of A-Z a-z 0-9 _ -", s.Owner))
	}
	if s.NatsURL == "" && (s.NatsCreds != "" || s.NatsTLSCert != "") {
		problems = append(problems, "NODEPOOL_NATS_CREDS and NODEPOOL_NATS_TLS_* apply to an external server; set NODEPOOL_NATS_URL too")
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid settings:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// ResolveRoles fills in the roles when none are set (the default):
// launcher and builder, and zookeeper when the configuration names
// zookeeper-servers. It refuses the zookeeper role without them.
func (s *Settings) ResolveRoles(cfg *Config) error {
	if len(s.Roles) == 0 {
		s.Roles = []string{RoleLauncher, RoleBuilder}
		if cfg != nil && cfg.ZooKeeper() != nil {
			s.Roles = append(s.Roles, RoleZooKeeper)
		}
		return nil
	}
	if s.HasRole(RoleZooKeeper) && (cfg == nil || cfg.ZooKeeper() == nil) {
		file := ""
		if cfg != nil {
			file = cfg.File + " "
		}
		return fmt.Errorf("NODEPOOL_ROLES: the zookeeper role serves Zuul in the ZooKeeper that nodepool.yaml names, but %snames no zookeeper-servers", file)
	}
	return nil
}

// RequestorIdentity is the client commands' identity: NODEPOOL_OWNER, else
// the user name of the first NATS URL when it can be one, else "" (the
// client's default, anonymous).
func (s *Settings) RequestorIdentity() string {
	if s.Owner != "" {
		return s.Owner
	}
	first, _, _ := strings.Cut(s.NatsURL, ",")
	if u, err := url.Parse(strings.TrimSpace(first)); err == nil && u.User != nil {
		if name := u.User.Username(); ownerRE.MatchString(name) {
			if _, hasPassword := u.User.Password(); hasPassword {
				return name // nats://user:password@host: a user, not a token
			}
		}
	}
	return ""
}

// ownerRE is a valid requestor identity (events.ValidOwner).
var ownerRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// HasRole reports whether the process runs a role.
func (s *Settings) HasRole(role string) bool { return slices.Contains(s.Roles, role) }

// Embedded reports whether the process starts its own NATS server.
func (s *Settings) Embedded() bool { return s.NatsURL == "" }

// RedactURLs returns a comma-separated list of NATS URLs with the secret
// of each replaced by "xxxxx", for logs and error messages: a URL may carry
// a user and password (nats://user:password@host:4222) or a token
// (nats://token@host:4222).
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err == nil && u.User == nil:
		case err == nil:
			if _, ok := u.User.Password(); ok {
				parts[i] = u.Redacted()
			} else {
				u.User = url.User("xxxxx")
				parts[i] = u.String()
			}
		case strings.Contains(p, "@"):
			parts[i] = "(a URL that does not parse)"
		}
	}
	return strings.Join(parts, ",")
}
