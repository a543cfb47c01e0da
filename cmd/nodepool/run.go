package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

func (a *app) runCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: the launcher and builder worker groups",
		Long: `Run the daemon. With NODEPOOL_NATS_URL unset it starts an embedded NATS
server (JetStream, files under NODEPOOL_DATA_DIR, listening on
NODEPOOL_NATS_LISTEN, 127.0.0.1:4222 by default); otherwise it connects to
that server. Every setting is read from its NODEPOOL_* variable and may be
given as a flag instead. SIGINT or SIGTERM stops it cleanly.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.run(cmd.Context()) },
	}
	cmd.Flags().StringSliceVar(&a.flags.Roles, "roles", nil, "worker groups to run: launcher, builder [NODEPOOL_ROLES] (default both)")
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
	f.StringVar(&a.flags.HTTPAddr, "http-addr", "", "status API and metrics; empty turns it off [NODEPOOL_HTTP_ADDR] (default 127.0.0.1:8005)")
	f.IntVar(&a.flags.Replicas, "replicas", 0, "replicas of streams and buckets: 1, 3 or 5 [NODEPOOL_REPLICAS] (default 1)")
	f.DurationVar(&a.flags.LeaseTTL, "lease-ttl", 0, "life of a lease or heartbeat without renewal [NODEPOOL_LEASE_TTL] (default 10s)")
	f.DurationVar(&a.flags.SyncInterval, "sync-interval", 0, "period of the cleanup and reconciliation sweeps [NODEPOOL_SYNC_INTERVAL] (default 5s)")
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
	s.HTTPAddr = s.StatusAddr(cfg)
	p, err := service.Start(ctx, s, cfg, log)
	if err != nil {
		return err
	}
	defer p.Close()

	var srv *http.Server
	if s.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.HTTPAddr)
		if err != nil {
			return fmt.Errorf("status API cannot listen on %s (set NODEPOOL_HTTP_ADDR, or webapp in nodepool.yaml, to another address, or NODEPOOL_HTTP_ADDR empty to turn it off): %w", s.HTTPAddr, err)
		}
		srv = &http.Server{Handler: statusHandler(p), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("status API stopped", "err", err)
			}
		}()
		log.Info("status API listening", "addr", ln.Addr().String())
	}
	log.Info("nodepool running", "config", s.Config, "roles", s.Roles, "nats", natsDescription(s))
	err = p.Run(ctx)
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	return err
}

func natsDescription(s config.Settings) string {
	if s.Embedded() {
		return "embedded on " + s.NatsListen
	}
	return config.RedactURLs(s.NatsURL)
}

// statusHandler serves /healthz, /metrics (Prometheus) and /api/status.
func statusHandler(p *service.Process) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.Conn().IsConnected() {
			http.Error(w, "not connected to NATS", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if l := p.Launcher(); l != nil {
		for _, c := range l.Metrics().Counters() {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.Name, Help: c.Help},
				func() float64 { return float64(c.V.Load()) }))
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nodepool_nodes", Help: "Node records seen by this process."},
			func() float64 { return float64(l.Nodes().Len()) }))
	}
	if b := p.Builder(); b != nil {
		for _, c := range b.Metrics().Counters() {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.Name, Help: c.Help},
				func() float64 { return float64(c.V.Load()) }))
		}
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Profiles and goroutine dumps (Nodepool's SIGUSR2 stack dump).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) {
		st := map[string]any{"id": p.Settings.ID, "roles": p.Settings.Roles, "nats_connected": p.Conn().IsConnected()}
		if l := p.Launcher(); l != nil {
			states := map[kv.NodeState]int{}
			l.Nodes().Range(func(e *kv.Entry[kv.Node]) bool { states[e.Value.State]++; return true })
			st["nodes"] = states
			st["requests"] = l.Requests().Len()
		}
		if b := p.Builder(); b != nil {
			builds := map[kv.ImageState]int{}
			b.Builds().Range(func(e *kv.Entry[kv.ImageBuild]) bool { builds[e.Value.State]++; return true })
			uploads := map[kv.ImageState]int{}
			b.Uploads().Range(func(e *kv.Entry[kv.ImageUpload]) bool { uploads[e.Value.State]++; return true })
			st["image_builds"], st["image_uploads"] = builds, uploads
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	return mux
}
