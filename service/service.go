// Package service assembles one nodepool process: it starts the embedded
// NATS server or connects to an external one, creates the streams and
// buckets, constructs the drivers the configuration names, and runs the
// roles the settings ask for until its context ends.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/aws"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/drivers/kubernetes"
	"github.com/nodepool-nats/nodepool/drivers/metastatic"
	"github.com/nodepool-nats/nodepool/drivers/openstack"
	"github.com/nodepool-nats/nodepool/drivers/static"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/clock"
	"github.com/nodepool-nats/nodepool/internal/repair"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
	"github.com/nodepool-nats/nodepool/zkbridge"
)

// InboxPrefix is the prefix of the reply subjects of nodepool's processes
// (nats.go's default is _INBOX, which nats.conf lets requestors read).
const InboxPrefix = "_INBOX_nodepool"

// Version is the version reported in component records.
var Version = "dev"

// Process is a running nodepool process.
type Process struct {
	Settings config.Settings
	Log      *slog.Logger

	// reloadMu serializes reloads; cfg is the configuration in force.
	reloadMu sync.Mutex
	cfg      atomic.Pointer[config.Config]

	server    *server.Server
	lock      *DataDirLock
	nc        *nats.Conn
	js        jetstream.JetStream
	buckets   *kv.Buckets
	views     *kv.Views // the caches its roles and drivers share
	providers map[string]drivers.Provider
	launcher  *consumers.Launcher
	builder   *builder.Builder
	bridge    *zkbridge.Bridge
	metrics   *metrics.Registry
	// keeper makes again the streams, buckets and object stores of the
	// process when they are deleted; fakeKept lists those of the fake
	// clouds (which a reload may change).
	keeper   *repair.Keeper
	fakeKept map[string]bool
}

// Start brings a process up to the point where its roles can run: NATS
// (embedded or external), streams, buckets and drivers.
func Start(ctx context.Context, s config.Settings, cfg *config.Config, log *slog.Logger) (*Process, error) {
	if len(s.Roles) == 0 {
		if err := s.ResolveRoles(cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.Runnable(); err != nil {
		return nil, err
	}
	p := &Process{Settings: s, Log: log}
	p.cfg.Store(cfg)
	sd, err := metrics.StatsdFromEnv(nil, log)
	if err != nil {
		return nil, err
	}
	if sd != nil {
		log.Info("sending Nodepool's statsd metrics", "statsd", os.Getenv("STATSD_HOST")+":"+os.Getenv("STATSD_PORT"))
	}
	p.metrics = metrics.New(sd)
	ok := false
	defer func() {
		if !ok {
			p.Close()
		}
	}()
	url, opts := client.ConnectOptions(s, "nodepool "+s.ID)
	// Replies to nodepool's processes go to inboxes of their own, so that a
	// user who may subscribe to _INBOX.> (nats.conf's requestor) cannot
	// read them.
	opts = append(opts, nats.CustomInboxPrefix(InboxPrefix), connectionLog(log))
	if s.Embedded() {
		lock, err := LockDataDir(s.DataDir, fmt.Sprintf("id %s, NATS on %s", s.ID, s.NatsListen))
		if err != nil {
			return nil, err
		}
		p.lock = lock
		ns, err := StartEmbedded(s.NatsListen, filepath.Join(s.DataDir, "jetstream"), log)
		if err != nil {
			return nil, err
		}
		p.server = ns
		url = ns.ClientURL()
		log.Info("embedded NATS server running", "url", url, "store", filepath.Join(s.DataDir, "jetstream"))
	}
	// While the connection is being re-established, nothing is buffered:
	// a write made then fails at once (and is made again by its caller)
	// instead of reaching the server late, after this process may have
	// lost the leases and nodes it was written for.
	opts = append(opts, nats.ReconnectBufSize(-1))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", config.RedactURLs(url), err)
	}
	p.nc = nc
	if p.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	if err := events.Ensure(ctx, p.js, s.Replicas, log); err != nil {
		return nil, err
	}
	// The keeper runs with the roles (Run); made now, the stores, caches
	// and consumers tell it when they find what they use gone.
	p.keeper = repair.New(p.js, 0, log)
	if p.buckets, err = kv.Ensure(ctx, p.js, kv.Options{Replicas: s.Replicas, LeaseTTL: s.LeaseTTL, Missing: p.keeper.Missing}, log); err != nil {
		return nil, err
	}
	if ttl := p.buckets.LeaseTTL; ttl > 0 && ttl != s.LeaseTTL {
		s.LeaseTTL = ttl // Ensure said so
		p.Settings.LeaseTTL = ttl
	}
	// One cache per bucket for the whole process: its roles and the
	// static and metastatic drivers share them, fed by one watch each.
	p.views = kv.NewViews(p.buckets, log)
	// Drivers are for the roles that drive machines: a process serving
	// Zuul alone needs none.
	p.providers = map[string]drivers.Provider{}
	if s.HasRole(config.RoleLauncher) || s.HasRole(config.RoleBuilder) {
		if p.providers, err = NewProviders(ctx, p.js, cfg, p.driverOptions()); err != nil {
			return nil, err
		}
	}
	for name, drv := range p.providers {
		p.providers[name] = drivers.Share(drivers.Measured(drv, name, p.metrics.DriverCalls()))
	}
	// One pacer for every role: the launcher's and the builder's calls to
	// a provider share its rate.
	pacer := drivers.NewPacer(log)
	if s.HasRole(config.RoleLauncher) {
		p.launcher, err = consumers.NewLauncher(p.js, p.buckets, consumers.Options{
			ID: s.ID, Config: cfg, Providers: p.providers, Pacer: pacer, Views: p.views,
			LeaseTTL: s.LeaseTTL, SyncInterval: s.SyncInterval, FailedRequestAge: s.FailedRequestAge,
			Version: Version, Roles: s.Roles, Log: log, Metrics: p.metrics,
			NewDriver: func(ctx context.Context, pc *config.Provider) (drivers.Provider, error) {
				drv, err := NewProvider(ctx, p.js, pc, p.driverOptions())
				if err != nil {
					return nil, err
				}
				return drivers.Share(drivers.Measured(drv, pc.Name, p.metrics.DriverCalls())), nil
			},
		})
		if err != nil {
			return nil, err
		}
	}
	if s.HasRole(config.RoleBuilder) {
		if p.builder, err = NewBuilder(p.js, p.buckets, s, cfg, p.providers, pacer, p.metrics, p.views, log); err != nil {
			return nil, err
		}
	}
	if s.HasRole(config.RoleZooKeeper) {
		if cfg.ZooKeeper() == nil {
			return nil, fmt.Errorf("the zookeeper role serves Zuul in the ZooKeeper that %s names, but it names no zookeeper-servers", cfg.File)
		}
		if p.bridge, err = zkbridge.New(p.buckets, zkbridge.Options{
			ID: s.ID, Config: cfg, SyncInterval: s.SyncInterval, Version: Version, Log: log, Views: p.views,
		}); err != nil {
			return nil, err
		}
	}
	if s.HasRole(config.RoleBuilder) {
		// The builder opens it again when it runs; made now, the keeper
		// looks after it from the start.
		if _, err := builder.EnsureFiles(ctx, p.js, s.Replicas, log); err != nil {
			return nil, err
		}
	}
	p.keep(cfg)
	ok = true
	return p, nil
}

// keep has the keeper look after the streams, buckets and object store of
// the process's roles, and the fake clouds' buckets of a configuration,
// which exist by now.
func (p *Process) keep(cfg *config.Config) {
	s := p.Settings
	for _, sc := range events.StreamConfigs(s.Replicas) {
		// The keeper follows a stream's last sequence by a subscription
		// to its subjects (a copy of every message to every process):
		// only where records name messages by it.
		var follow []string
		if events.NamedBySequence(sc.Name) {
			follow = sc.Subjects
		}
		p.keeper.Keep(sc.Name, "stream "+sc.Name, follow, func(ctx context.Context, last uint64) error {
			return events.Remake(ctx, p.js, sc, last, p.Log)
		})
	}
	for _, bc := range kv.BucketConfigs(kv.Options{Replicas: s.Replicas, LeaseTTL: s.LeaseTTL}) {
		p.keepBucket(bc)
	}
	if s.HasRole(config.RoleBuilder) {
		p.keeper.Keep("OBJ_"+builder.FilesBucket, "object store "+builder.FilesBucket, nil, func(ctx context.Context, _ uint64) error {
			_, err := builder.EnsureFiles(ctx, p.js, s.Replicas, p.Log)
			return err
		})
	}
	p.keepFake(cfg)
}

func (p *Process) keepBucket(bc jetstream.KeyValueConfig) {
	p.keeper.Keep("KV_"+bc.Bucket, "bucket "+bc.Bucket, nil, func(ctx context.Context, _ uint64) error {
		_, err := kv.EnsureBucket(ctx, p.js, bc, p.Log)
		return err
	})
}

// keepFake looks after the buckets of the fake clouds of a
// configuration, and no longer after those of clouds it dropped.
func (p *Process) keepFake(cfg *config.Config) {
	next := map[string]bool{}
	if p.Settings.HasRole(config.RoleLauncher) || p.Settings.HasRole(config.RoleBuilder) {
		for i := range cfg.Providers {
			pc := &cfg.Providers[i]
			if pc.Driver != "fake" {
				continue
			}
			for _, bc := range fake.BucketConfigs(pc, p.Settings.Replicas).All() {
				next["KV_"+bc.Bucket] = true
				p.keepBucket(bc)
			}
		}
	}
	for stream := range p.fakeKept {
		if !next[stream] {
			p.keeper.Forget(stream)
		}
	}
	p.fakeKept = next
}

// DriverOptions are what the drivers of a configuration's providers are
// made with besides their configuration.
type DriverOptions struct {
	// Replicas of the buckets a driver makes (the fake cloud's).
	Replicas int
	// Views are the process's views of the records, which the static and
	// metastatic drivers read instead of caches of their own (nil: their
	// own).
	Views *kv.Views
	// Buckets are the process's buckets (nil: opened for the static and
	// metastatic drivers' views).
	Buckets *kv.Buckets
	// Clock is the time the metastatic driver goes by (nil: the real
	// one); a launcher given a fake clock in a test gives its
	// metastatic providers the same.
	Clock clock.Clock
	Log   *slog.Logger
}

// driverOptions are what the process gives every driver it makes: its
// replicas, views and buckets.
func (p *Process) driverOptions() DriverOptions {
	return DriverOptions{Replicas: p.Settings.Replicas, Views: p.views, Buckets: p.buckets, Log: p.Log}
}

// NewProviders constructs the driver of every provider of the
// configuration.
func NewProviders(ctx context.Context, js jetstream.JetStream, cfg *config.Config, o DriverOptions) (map[string]drivers.Provider, error) {
	out := map[string]drivers.Provider{}
	for i := range cfg.Providers {
		pc := &cfg.Providers[i]
		p, err := NewProvider(ctx, js, pc, o)
		if err != nil {
			for _, q := range out {
				q.Close()
			}
			return nil, err
		}
		out[pc.Name] = p
	}
	return out, nil
}

// NewProvider constructs the driver of one provider.
func NewProvider(ctx context.Context, js jetstream.JetStream, pc *config.Provider, o DriverOptions) (drivers.Provider, error) {
	log := o.Log
	switch pc.Driver {
	case "fake":
		return fake.New(ctx, js, pc, fake.Options{Replicas: o.Replicas, Missing: o.Buckets.ReportMissing}, log)
	case "static", "metastatic":
		b := o.Buckets
		if b == nil {
			var err error
			if b, err = kv.Open(ctx, js); err != nil {
				return nil, fmt.Errorf("provider %s: %w", pc.Name, err)
			}
		}
		if pc.Driver == "static" {
			return static.New(pc, static.Options{Nodes: o.Views.Nodes(b, log), Clock: o.Clock, Log: log})
		}
		return metastatic.New(js, pc, metastatic.Options{Nodes: o.Views.Nodes(b, log), Requests: o.Views.Requests(b, log), Clock: o.Clock, Log: log})
	case "aws":
		return aws.New(ctx, pc, aws.Options{Log: log})
	case "openstack":
		return openstack.New(ctx, pc, log)
	case "kubernetes":
		return kubernetes.New(pc, kubernetes.Options{Log: log})
	}
	if !config.DriverAvailable(pc.Driver) {
		return nil, errors.New(config.UnavailableMessage(pc))
	}
	return nil, fmt.Errorf("provider %s: driver %q is not available", pc.Name, pc.Driver)
}

// NewBuilder prepares the builder role: image files go under the
// configuration's images-dir (default <data dir>/images), build logs under
// build-log-dir (default <data dir>/build-logs).
func NewBuilder(js jetstream.JetStream, b *kv.Buckets, s config.Settings, cfg *config.Config, providers map[string]drivers.Provider,
	pacer *drivers.Pacer, reg *metrics.Registry, views *kv.Views, log *slog.Logger) (*builder.Builder, error) {
	imagesDir, logDir := cfg.ImagesDir, cfg.BuildLogDir
	if imagesDir == "" {
		imagesDir = filepath.Join(s.DataDir, "images")
	}
	if logDir == "" {
		logDir = filepath.Join(s.DataDir, "build-logs")
	}
	return builder.New(js, b, builder.Options{
		ID: s.ID, Config: cfg, Providers: providers, LeaseTTL: s.LeaseTTL, SyncInterval: s.SyncInterval,
		BuildWorkers: s.BuildWorkers, UploadWorkers: s.UploadWorkers, ImagesDir: imagesDir, BuildLogDir: logDir,
		Replicas: s.Replicas, Register: !s.HasRole(config.RoleLauncher), Pacer: pacer, Version: Version, Log: log, Metrics: reg,
		Leases: views.Leases(), Views: views,
	})
}

// Config is the configuration in force.
func (p *Process) Config() *config.Config { return p.cfg.Load() }

// Reload makes a new configuration the process's, without a restart:
// providers whose configuration is unchanged keep their driver (and the
// machines in flight on it); a changed provider gets a new driver, and
// its old one is closed once the work in flight on it ended; a removed
// provider's driver likewise. The launcher restarts the pool schedulers
// whose configuration changed, and the builder schedules by the new
// diskimages. If a driver cannot be made, nothing changes and the error
// says why.
func (p *Process) Reload(ctx context.Context, cfg *config.Config) error {
	if err := cfg.Runnable(); err != nil {
		return err
	}
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	old := p.Config()
	if p.bridge != nil && cfg.ZooKeeper() == nil {
		return errors.New("the zookeeper role is running and the new configuration names no zookeeper-servers; restart nodepool with other roles to stop serving Zuul")
	}
	next := map[string]drivers.Provider{}
	if p.launcher == nil && p.builder == nil {
		if p.bridge != nil {
			_ = p.bridge.Reload(cfg)
		}
		p.cfg.Store(cfg)
		p.Log.Info("configuration reloaded", "config", cfg.File)
		return nil
	}
	var made []drivers.Provider
	var added, changed, removed []string
	undo := func() {
		for _, d := range made {
			d.Close()
		}
	}
	for i := range cfg.Providers {
		pc := &cfg.Providers[i]
		oc, existed := old.Provider(pc.Name)
		if existed && reflect.DeepEqual(*oc, *pc) {
			next[pc.Name] = p.providers[pc.Name]
			continue
		}
		drv, err := NewProvider(ctx, p.js, pc, p.driverOptions())
		if err != nil {
			undo()
			return err
		}
		d := drivers.Share(drivers.Measured(drv, pc.Name, p.metrics.DriverCalls()))
		made = append(made, d)
		next[pc.Name] = d
		if existed {
			changed = append(changed, pc.Name)
		} else {
			added = append(added, pc.Name)
		}
	}
	if p.launcher != nil {
		if err := p.launcher.Reload(cfg, next); err != nil {
			undo()
			return err
		}
	}
	if p.builder != nil {
		p.builder.Reload(cfg, next)
	}
	if p.bridge != nil {
		_ = p.bridge.Reload(cfg)
	}
	for name, d := range p.providers {
		if next[name] != d {
			d.Close() // once the work in flight on it ended
			if _, ok := next[name]; !ok {
				removed = append(removed, name)
			}
		}
	}
	p.providers = next
	p.cfg.Store(cfg)
	p.keepFake(cfg)
	slices.Sort(added)
	slices.Sort(changed)
	slices.Sort(removed)
	p.Log.Info("configuration reloaded", "config", cfg.File, "providers_added", added, "providers_changed", changed, "providers_removed", removed)
	return nil
}

// Metrics is the process's metrics registry.
func (p *Process) Metrics() *metrics.Registry { return p.metrics }

// Builder is the builder role (nil if the process does not run it).
func (p *Process) Builder() *builder.Builder { return p.builder }

// Views are the caches the process's roles and drivers share.
func (p *Process) Views() *kv.Views { return p.views }

// Conn is the process's NATS connection.
func (p *Process) Conn() *nats.Conn { return p.nc }

// JetStream is the process's JetStream context.
func (p *Process) JetStream() jetstream.JetStream { return p.js }

// Buckets are the process's stores.
func (p *Process) Buckets() *kv.Buckets { return p.buckets }

// Providers are the constructed drivers.
func (p *Process) Providers() map[string]drivers.Provider {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	return maps.Clone(p.providers)
}

// Bridge is the zookeeper role (nil if the process does not run it).
func (p *Process) Bridge() *zkbridge.Bridge { return p.bridge }

// Launcher is the launcher role (nil if the process does not run it).
func (p *Process) Launcher() *consumers.Launcher { return p.launcher }

// Ready returns nil once the process serves: connected to NATS, and every
// role it runs started (its drivers constructed, its worker groups up);
// otherwise it says what is missing. A role that is stopping is not ready.
func (p *Process) Ready() error {
	if p.nc == nil || !p.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	if p.launcher != nil && !p.launcher.Running() {
		return errors.New("the launcher is not running (starting or stopping)")
	}
	if p.builder != nil && !p.builder.Running() {
		return errors.New("the builder is not running (starting or stopping)")
	}
	if p.bridge != nil && !p.bridge.Running() {
		return errors.New("the zookeeper role is not serving Zuul (no ZooKeeper session yet, or stopping)")
	}
	return nil
}

// Alive returns nil unless the process cannot recover by itself: its NATS
// connection is closed for good (a connection that is reconnecting is
// alive, only not ready).
func (p *Process) Alive() error {
	if p.nc == nil || p.nc.IsClosed() {
		return errors.New("the NATS connection is closed")
	}
	return nil
}

// Run runs the roles until ctx ends, then shuts them down cleanly.
func (p *Process) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	// The keeper runs as long as the roles: what it makes again, they use.
	kctx, stopKeeper := context.WithCancel(ctx)
	var keeper sync.WaitGroup
	keeper.Go(func() { p.keeper.Run(kctx) })
	defer func() {
		stopKeeper()
		keeper.Wait()
	}()
	if l := p.launcher; l != nil {
		wg.Go(func() {
			if err := l.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("launcher: %w", err)
			}
		})
	}
	if b := p.builder; b != nil {
		wg.Go(func() {
			if err := b.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("builder: %w", err)
			}
		})
	}
	if br := p.bridge; br != nil {
		wg.Go(func() {
			if err := br.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("zookeeper: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Close drains the connection and stops the embedded server.
func (p *Process) Close() {
	p.reloadMu.Lock()
	for _, d := range p.providers {
		d.Close()
	}
	p.reloadMu.Unlock()
	if p.nc != nil {
		_ = p.nc.Drain()
		deadline := time.Now().Add(5 * time.Second)
		for !p.nc.IsClosed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	p.metrics.Statsd().Close()
	if p.server != nil {
		p.server.Shutdown()
		p.server.WaitForShutdown()
	}
	p.lock.Release()
}

// connectionLog logs, at the default level, each time the process loses
// its NATS connection, gets it back, or loses it for good.
func connectionLog(log *slog.Logger) nats.Option {
	return func(o *nats.Options) error {
		o.DisconnectedErrCB = func(nc *nats.Conn, err error) {
			if err == nil {
				return // the process closes its own connection
			}
			log.Warn("NATS disconnected; reconnecting", "server", nc.ConnectedUrlRedacted(), "err", err)
		}
		o.ReconnectedCB = func(nc *nats.Conn) {
			log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted(), "server_id", nc.ConnectedServerId())
		}
		o.ClosedCB = func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Error("NATS connection closed", "err", err)
			}
		}
		return nil
	}
}

// StartEmbedded starts a nats-server with JetStream on addr (host:port),
// storing under storeDir.
func StartEmbedded(addr, storeDir string, log *slog.Logger) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("NODEPOOL_NATS_LISTEN %q: expected host:port: %w", addr, err)
	}
	var port int
	if _, err := fmt.Sscanf(portStr, "%d", &port); err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("NODEPOOL_NATS_LISTEN %q: expected a port from 0 to 65535", addr)
	}
	if port != 0 {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("the embedded NATS server cannot listen on %s (another `nodepool run` there? point this one at it with NODEPOOL_NATS_URL=nats://%s, or set NODEPOOL_NATS_LISTEN): %w", addr, addr, err)
		}
		_ = ln.Close()
	} else {
		port = -1
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "nodepool",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	ns.SetLoggerV2(&serverLog{log: log.With("component", "nats-server")}, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("the embedded NATS server did not start on %s", addr)
	}
	return ns, nil
}

// serverLog sends nats-server's log to slog (notices at debug level).
type serverLog struct{ log *slog.Logger }

func (l *serverLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *serverLog) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *serverLog) Debugf(format string, v ...any)  {}
func (l *serverLog) Tracef(format string, v ...any)  {}
