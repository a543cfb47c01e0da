package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/service"
)

// Signals of a running daemon, as Nodepool's: SIGHUP reloads the
// configuration, SIGUSR2 writes every goroutine's stack to the log,
// SIGINT and SIGTERM stop it cleanly (main's context).

// daemonSignals starts listening for SIGHUP and SIGUSR2 (before anything
// else, so that neither kills the process); stop stops listening.
func daemonSignals() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGHUP, syscall.SIGUSR2)
	return ch, func() { signal.Stop(ch) }
}

// reloader reloads the configuration on SIGHUP and when its files change,
// and dumps stacks on SIGUSR2.
type reloader struct {
	a   *app
	s   config.Settings
	p   *service.Process
	log *slog.Logger
	// status is the status server, moved when the webapp section moves
	// it (nil when off).
	status *statusServer

	mu   sync.Mutex
	sum  [32]byte // digest of the files last loaded
	live *config.Config
}

// current is the configuration in force (for the web API).
func (r *reloader) current() *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// run handles signals and file changes until ctx ends.
func (r *reloader) run(ctx context.Context, sigs <-chan os.Signal) {
	changed := r.watch(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				r.reload(ctx, "SIGHUP", true)
			case syscall.SIGUSR2:
				r.stackDump()
			}
		case <-changed:
			r.reload(ctx, "the configuration file changed", false)
		}
	}
}

// files are the files the configuration is read from.
func (r *reloader) files() []string {
	files := []string{r.s.Config}
	if r.s.Secure != "" {
		files = append(files, r.s.Secure)
	}
	return files
}

// digest reads the files' bytes (a file that cannot be read counts as
// empty: loading it says why).
func (r *reloader) digest() [32]byte {
	h := sha256.New()
	for _, f := range r.files() {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// reload loads the files again and, if they are valid, makes them the
// process's configuration; otherwise it logs every problem and the
// configuration in force keeps running. A file change whose bytes are
// those already loaded (an editor's save without a change, a Kubernetes
// ConfigMap's symlinks moving) is not a reload; SIGHUP always is.
func (r *reloader) reload(ctx context.Context, why string, always bool) {
	sum := r.digest()
	r.mu.Lock()
	same := sum == r.sum
	r.mu.Unlock()
	if same && !always {
		return
	}
	log := r.log.With("config", r.s.Config, "why", why)
	cfg, err := r.s.LoadConfig()
	if err != nil {
		var es config.Errors
		if errors.As(err, &es) {
			for _, e := range es {
				log.Error("configuration problem", "err", e.Error())
			}
		}
		log.Error("configuration not reloaded; the one in force keeps running", "problems", max(len(es), 1), "err", err)
		r.mu.Lock()
		r.sum = sum // do not say it again until the files change again
		r.mu.Unlock()
		return
	}
	for _, w := range cfg.Warnings {
		log.Warn("configuration: " + w.Error())
	}
	if err := r.p.Reload(ctx, cfg); err != nil {
		log.Error("configuration not reloaded; the one in force keeps running", "err", err)
		return
	}
	r.mu.Lock()
	r.sum, r.live = sum, cfg
	r.mu.Unlock()
	if r.status != nil {
		r.status.move(r.s.StatusAddr(cfg), log)
	}
}

// watch reports changes of the configuration files. It watches the
// folders that hold them, not the files: editors save by writing a new
// file and renaming it over the old one, and Kubernetes updates a mounted
// ConfigMap by swapping a symlink beside it, and neither would be seen on
// the file itself. Bursts of events (a write, a chmod, a rename) are one
// change once the folder is quiet for a moment.
func (r *reloader) watch(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("cannot watch the configuration file; SIGHUP still reloads it", "err", err)
		return out
	}
	dirs := map[string]bool{}
	for _, f := range r.files() {
		dir := filepath.Dir(f)
		if dirs[dir] {
			continue
		}
		dirs[dir] = true
		if err := w.Add(dir); err != nil {
			r.log.Warn("cannot watch the configuration's folder; SIGHUP still reloads it", "dir", dir, "err", err)
		}
	}
	go func() {
		defer w.Close()
		var quiet <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				quiet = time.After(200 * time.Millisecond)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				r.log.Warn("watching the configuration file", "err", err)
			case <-quiet:
				quiet = nil
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// stackDump writes every goroutine's stack to the log, as Nodepool's
// SIGUSR2 does: a log line, then the stacks as Go prints them (in the
// JSON log format, as one record's "stacks").
func (r *reloader) stackDump() {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := bytes.Count(buf, []byte("\ngoroutine ")) + 1
	if r.s.LogFormat == "json" {
		r.log.Info("stack dump (SIGUSR2)", "goroutines", count, "stacks", string(buf))
		return
	}
	r.log.Info("stack dump (SIGUSR2) follows", "goroutines", count)
	// One write, so that no log line lands inside the dump.
	_, _ = r.a.logOut().Write(append(buf, "-- end of stack dump\n"...))
}

// statusServer is the status API's HTTP server, which a reload may move
// to another address (nodepool.yaml's webapp section).
type statusServer struct {
	mu   sync.Mutex
	addr string
	srv  *http.Server
	h    http.Handler
}

// move listens on addr instead, if it differs: the old server stops only
// once the new one listens; if it cannot, the old one stays.
func (st *statusServer) move(addr string, log *slog.Logger) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if addr == st.addr || addr == "" {
		return
	}
	srv, err := serve(addr, st.h, log, "status API", "NODEPOOL_HTTP_ADDR (or webapp in nodepool.yaml)")
	if err != nil {
		log.Error("the status API stays where it is", "addr", st.addr, "err", err)
		return
	}
	old := st.srv
	st.srv, st.addr = srv, addr
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = old.Shutdown(ctx)
	}()
}

// shutdown stops the server.
func (st *statusServer) shutdown(ctx context.Context) {
	st.mu.Lock()
	defer st.mu.Unlock()
	_ = st.srv.Shutdown(ctx)
}
