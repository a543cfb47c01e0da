package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/service"
	"github.com/nodepool-nats/nodepool/status"
	"github.com/nodepool-nats/nodepool/web"
)

func (a *app) runCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: the launcher, builder and ZooKeeper (Zuul) worker groups",
		Long: `Run the daemon. With NODEPOOL_NATS_URL unset it starts an embedded NATS
server (JetStream, files under NODEPOOL_DATA_DIR, listening on
NODEPOOL_NATS_LISTEN, 127.0.0.1:4222 by default); otherwise it connects to
that server. Every setting is read from its NODEPOOL_* variable and may be
given as a flag instead. SIGINT or SIGTERM stops it cleanly; SIGHUP, or a
change of the configuration file, reloads the configuration (a file with
errors is refused, and the configuration in force keeps running); SIGUSR2
writes every goroutine's stack to the log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd.Context()) },
	}
	cmd.Flags().StringSliceVar(&a.flags.Roles, "roles", nil, "worker groups to run: launcher, builder, zookeeper [NODEPOOL_ROLES] (default launcher and builder, and zookeeper when nodepool.yaml names zookeeper-servers)")
	a.daemonFlags(cmd)
	return cmd
}

// builderCmd is `nodepool run` with the builder role alone, as Nodepool's
// nodepool-builder.
func (a *app) builderCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "builder",
		Short: "Run the image builder only: build and upload worker groups (nodepool run --roles builder)",
		Long: `Run the image builder: build workers run diskimage-builder for the
build triggers (nodepool.builds.<image>), upload workers upload builds to
the providers (nodepool.uploads.<image>.<provider>), and one builder at a
time schedules builds and uploads and deletes old ones. Same settings as
"nodepool run"; NODEPOOL_BUILD_WORKERS and NODEPOOL_UPLOAD_WORKERS set
this process's share of the worker groups.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a.settings.Roles = []string{config.RoleBuilder}
			return a.run(cmd.Context())
		},
	}
	a.daemonFlags(cmd)
	return cmd
}

// daemonFlags are the settings flags of run and builder.
func (a *app) daemonFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&a.flags.DataDir, "data-dir", "", "embedded JetStream store and image files [NODEPOOL_DATA_DIR] (default ./data)")
	f.IntVar(&a.flags.BuildWorkers, "build-workers", 0, "image builds this process runs at once [NODEPOOL_BUILD_WORKERS] (default 1)")
	f.IntVar(&a.flags.UploadWorkers, "upload-workers", 0, "image uploads this process runs at once [NODEPOOL_UPLOAD_WORKERS] (default 4)")
	f.StringVar(&a.flags.ID, "id", "", "this process's identity [NODEPOOL_ID] (default hostname-pid)")
	f.StringVar(&a.flags.HTTPAddr, "http-addr", "", "status API, metrics and dashboard; empty turns it off [NODEPOOL_HTTP_ADDR] (default 127.0.0.1:8005)")
	f.StringVar(&a.flags.PprofAddr, "pprof-addr", "", "address of Go's profiling endpoints /debug/pprof/ [NODEPOOL_PPROF_ADDR] (default: off)")
	f.IntVar(&a.flags.Replicas, "replicas", 0, "replicas of streams and buckets: 1, 3 or 5 [NODEPOOL_REPLICAS] (default 1)")
	f.DurationVar(&a.flags.LeaseTTL, "lease-ttl", 0, "life of a lease or heartbeat without renewal [NODEPOOL_LEASE_TTL] (default 10s)")
	f.DurationVar(&a.flags.SyncInterval, "sync-interval", 0, "period of the cleanup and reconciliation sweeps [NODEPOOL_SYNC_INTERVAL] (default 5s)")
	f.DurationVar(&a.flags.FailedRequestAge, "failed-request-age", 0, "how long a failed request is kept before cleanup deletes it [NODEPOOL_FAILED_REQUEST_AGE] (default 24h)")
}

// gcPercent is the launcher's default GOGC: it holds every record in
// memory, so a smaller heap headroom than Go's 100% keeps its RSS near what
// it holds (126 MiB instead of 212 MiB with 10,000 nodes and the embedded
// server) for a little more GC work. GOGC in the environment wins.
const gcPercent = 50

func (a *app) run(ctx context.Context) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	sigs, stopSignals := daemonSignals()
	defer stopSignals()
	s := a.settings
	if err := s.Validate(); err != nil {
		return err
	}
	log := a.logger().With("id", s.ID)
	cfg, err := s.LoadConfig()
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		log.Warn("configuration: " + w.Error())
	}
	if err := s.ResolveRoles(cfg); err != nil {
		return err
	}
	s.HTTPAddr = s.StatusAddr(cfg)
	p, err := service.Start(ctx, s, cfg, log)
	if err != nil {
		return err
	}
	defer p.Close()

	rl := &reloader{a: a, s: s, p: p, log: log, live: cfg}
	rl.sum = rl.digest()
	var servers []*http.Server
	// A launcher serves the tables over NATS from the caches it keeps
	// anyway; a process with the status port serves them from the caches
	// the port keeps. A builder without the port keeps no caches of nodes
	// for them.
	var views *web.Views
	if s.HTTPAddr != "" || slices.Contains(s.Roles, config.RoleLauncher) {
		views = processViews(p, s.HTTPAddr != "", log)
		go views.Run(ctx)
		go serveTables(ctx, p, views, rl.current, log)
	}
	if s.HTTPAddr != "" {
		h := web.Handler(web.Options{Views: views, Config: rl.current, Ready: p.Ready, Alive: p.Alive, Metrics: metricsHandler(p),
			ID: s.ID, Roles: s.Roles, Connected: p.Conn().IsConnected, Log: log})
		srv, err := serve(s.HTTPAddr, h, log, "status API", "NODEPOOL_HTTP_ADDR (or webapp in nodepool.yaml)")
		if err != nil {
			return err
		}
		rl.status = &statusServer{addr: s.HTTPAddr, srv: srv, h: h}
	}
	if s.PprofAddr != "" {
		srv, err := serve(s.PprofAddr, web.Pprof(), log, "profiling endpoints", "NODEPOOL_PPROF_ADDR")
		if err != nil {
			return err
		}
		servers = append(servers, srv)
	}
	log.Info("nodepool running", "config", s.Config, "roles", s.Roles, "nats", natsDescription(s), "version", service.BuildVersion())
	rctx, stopReloads := context.WithCancel(ctx)
	var reloads sync.WaitGroup
	reloads.Go(func() { rl.run(rctx, sigs) })
	err = p.Run(ctx)
	stopReloads()
	reloads.Wait()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if rl.status != nil {
		rl.status.shutdown(sctx)
	}
	for _, srv := range servers {
		_ = srv.Shutdown(sctx)
	}
	return err
}

// serve starts an HTTP server on addr; setting names what to change if it
// cannot listen.
func serve(addr string, h http.Handler, log *slog.Logger, what, setting string) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s cannot listen on %s (set %s to another address, or empty to turn it off): %w", what, addr, setting, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(what+" stopped", "err", err)
		}
	}()
	log.Info(what+" listening", "addr", ln.Addr().String())
	return srv, nil
}

// processViews are the web API's caches: the process's, shared with its
// roles and drivers (one watch per bucket).
// Without the status port (dashboard false) they are the tables' alone,
// without the dashboard's history of every change.
func processViews(p *service.Process, dashboard bool, log *slog.Logger) *web.Views {
	pv, b := p.Views(), p.Buckets()
	img := pv.Images(b, log)
	shared := web.Views{Nodes: pv.Nodes(b, log), Requests: pv.Requests(b, log), Components: pv.Components(b, log),
		Images: img.Images, Builds: img.Builds, Uploads: img.Uploads}
	if b.Providers != nil {
		shared.Providers = pv.Providers(b, log)
	}
	if !dashboard {
		return web.NewTableViews(p.JetStream(), b, shared, log)
	}
	return web.NewViews(p.JetStream(), b, shared, log)
}

// serveTables answers `nodepool list` and the other tables' commands over
// NATS from the process's caches, once they hold every record (a process
// that is still reading them leaves the queries to the others; the
// caller's --from-buckets or its wait of 10 s covers a process that never
// gets there).
func serveTables(ctx context.Context, p *service.Process, views *web.Views, cfg func() *config.Config, log *slog.Logger) {
	if err := views.WaitSynced(ctx); err != nil {
		return
	}
	opts := func() status.Options { return status.Options{Config: cfg()} }
	stop, err := status.Serve(p.Conn(), views.Source(), status.ServeOptions{Options: opts, Log: log})
	if err != nil {
		log.Warn("the tables are not served over NATS; `nodepool list` reads the buckets itself", "err", err)
		return
	}
	<-ctx.Done()
	stop()
}

func natsDescription(s config.Settings) string {
	if s.Embedded() {
		return "embedded on " + s.NatsListen
	}
	return config.RedactURLs(s.NatsURL)
}
