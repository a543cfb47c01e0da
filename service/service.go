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
	"net"
	"path/filepath"
	"sync"
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
	"github.com/nodepool-nats/nodepool/drivers/metastatic"
	"github.com/nodepool-nats/nodepool/drivers/static"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// InboxPrefix is the prefix of the reply subjects of nodepool's processes
// (nats.go's default is _INBOX, which nats.conf lets requestors read).
const InboxPrefix = "_INBOX_nodepool"

// Version is the version reported in component records.
var Version = "dev"

// Process is a running nodepool process.
type Process struct {
	Settings config.Settings
	Config   *config.Config
	Log      *slog.Logger

	server    *server.Server
	lock      *DataDirLock
	nc        *nats.Conn
	js        jetstream.JetStream
	buckets   *kv.Buckets
	providers map[string]drivers.Provider
	launcher  *consumers.Launcher
	builder   *builder.Builder
}

// Start brings a process up to the point where its roles can run: NATS
// (embedded or external), streams, buckets and drivers.
func Start(ctx context.Context, s config.Settings, cfg *config.Config, log *slog.Logger) (*Process, error) {
	p := &Process{Settings: s, Config: cfg, Log: log}
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
	opts = append(opts, nats.CustomInboxPrefix(InboxPrefix))
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
	if p.buckets, err = kv.Ensure(ctx, p.js, kv.Options{Replicas: s.Replicas, LeaseTTL: s.LeaseTTL}, log); err != nil {
		return nil, err
	}
	if p.providers, err = NewProviders(ctx, p.js, cfg, s.Replicas, log); err != nil {
		return nil, err
	}
	if s.HasRole(config.RoleLauncher) {
		p.launcher, err = consumers.NewLauncher(p.js, p.buckets, consumers.Options{
			ID: s.ID, Config: cfg, Providers: p.providers,
			LeaseTTL: s.LeaseTTL, SyncInterval: s.SyncInterval,
			Version: Version, Roles: s.Roles, Log: log,
		})
		if err != nil {
			return nil, err
		}
	}
	if s.HasRole(config.RoleBuilder) {
		if p.builder, err = NewBuilder(p.js, p.buckets, s, cfg, p.providers, log); err != nil {
			return nil, err
		}
	}
	ok = true
	return p, nil
}

// NewProviders constructs the driver of every provider of the
// configuration.
func NewProviders(ctx context.Context, js jetstream.JetStream, cfg *config.Config, replicas int, log *slog.Logger) (map[string]drivers.Provider, error) {
	out := map[string]drivers.Provider{}
	for i := range cfg.Providers {
		pc := &cfg.Providers[i]
		var (
			p   drivers.Provider
			err error
		)
		switch pc.Driver {
		case "fake":
			p, err = fake.New(ctx, js, pc, replicas, log)
		case "static":
			p, err = static.New(ctx, js, pc, log)
		case "metastatic":
			p, err = metastatic.New(ctx, js, pc, log)
		case "aws":
			p, err = aws.New(ctx, pc, aws.Options{Log: log})
		default:
			err = fmt.Errorf("provider %s: driver %q is not available", pc.Name, pc.Driver)
		}
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

// NewBuilder prepares the builder role: image files go under the
// configuration's images-dir (default <data dir>/images), build logs under
// build-log-dir (default <data dir>/build-logs).
func NewBuilder(js jetstream.JetStream, b *kv.Buckets, s config.Settings, cfg *config.Config, providers map[string]drivers.Provider, log *slog.Logger) (*builder.Builder, error) {
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
		Replicas: s.Replicas, Register: !s.HasRole(config.RoleLauncher), Version: Version, Log: log,
	})
}

// Builder is the builder role (nil if the process does not run it).
func (p *Process) Builder() *builder.Builder { return p.builder }

// Conn is the process's NATS connection.
func (p *Process) Conn() *nats.Conn { return p.nc }

// JetStream is the process's JetStream context.
func (p *Process) JetStream() jetstream.JetStream { return p.js }

// Buckets are the process's stores.
func (p *Process) Buckets() *kv.Buckets { return p.buckets }

// Providers are the constructed drivers.
func (p *Process) Providers() map[string]drivers.Provider { return p.providers }

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
	errs := make(chan error, 2)
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
	wg.Wait()
	close(errs)
	return <-errs
}

// Close drains the connection and stops the embedded server.
func (p *Process) Close() {
	for _, d := range p.providers {
		d.Close()
	}
	if p.nc != nil {
		_ = p.nc.Drain()
		deadline := time.Now().Add(5 * time.Second)
		for !p.nc.IsClosed() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if p.server != nil {
		p.server.Shutdown()
		p.server.WaitForShutdown()
	}
	p.lock.Release()
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
