// Command nodepool is the one binary of nodepool on NATS: `nodepool run` is
// the daemon (launcher and builder roles), the other commands are for
// operators and scripts.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot(os.Stdout, os.Stderr).ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "nodepool:", err)
		os.Exit(1)
	}
}

// exitError ends the program with a code, its message already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// app holds what every command shares: the settings (environment, then
// flags) and where output goes.
type app struct {
	settings config.Settings
	flags    config.Settings // values given as flags
	out, err io.Writer

	logOnce sync.Once
	logW    *lockedWriter
}

// lockedWriter serializes writes, so that the log's records and a stack
// dump written beside them never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// logOut is where the log goes.
func (a *app) logOut() io.Writer {
	a.logOnce.Do(func() { a.logW = &lockedWriter{w: a.err} })
	return a.logW
}

func newRoot(out, errOut io.Writer) *cobra.Command {
	a := &app{out: out, err: errOut}
	root := &cobra.Command{
		Use:           "nodepool",
		Short:         "Keeps pools of disposable CI machines ready, on NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.loadSettings(cmd)
		},
	}
	root.Version = service.BuildVersion()
	root.SetVersionTemplate("nodepool {{.Version}}\n")
	root.SetOut(out)
	root.SetErr(errOut)
	// Every process setting is also a flag; the NATS ones apply to every
	// command.
	pf := root.PersistentFlags()
	pf.StringVar(&a.flags.NatsURL, "nats-url", "", "NATS server URL(s) [NODEPOOL_NATS_URL]; default: the embedded server's address")
	pf.StringVar(&a.flags.NatsCreds, "nats-creds", "", "NATS credentials file [NODEPOOL_NATS_CREDS]")
	pf.StringVar(&a.flags.NatsTLSCA, "nats-tls-ca", "", "NATS CA certificate [NODEPOOL_NATS_TLS_CA]")
	pf.StringVar(&a.flags.NatsTLSCert, "nats-tls-cert", "", "NATS client certificate [NODEPOOL_NATS_TLS_CERT]")
	pf.StringVar(&a.flags.NatsTLSKey, "nats-tls-key", "", "NATS client key [NODEPOOL_NATS_TLS_KEY]")
	pf.StringVar(&a.flags.NatsListen, "nats-listen", "", "address of the embedded NATS server [NODEPOOL_NATS_LISTEN] (default 127.0.0.1:4222)")
	pf.StringVar(&a.flags.Owner, "owner", "", "requestor identity of the client commands: requests on nodepool.requests.<owner>.new, nodes through nodepool.api.<owner>.* [NODEPOOL_OWNER] (default: the user of the NATS URL, else anonymous)")
	pf.StringVarP(&a.flags.Config, "config", "c", "", "path of nodepool.yaml [NODEPOOL_CONFIG] (default ./nodepool.yaml)")
	pf.StringVarP(&a.flags.Secure, "secure", "s", "", "secure file merged over nodepool.yaml, as Nodepool's -s [NODEPOOL_SECURE] (default none)")
	pf.StringVar(&a.flags.LogLevel, "log-level", "", "debug, info, warn or error [NODEPOOL_LOG_LEVEL] (default info)")
	pf.StringVar(&a.flags.LogFormat, "log-format", "", "text or json [NODEPOOL_LOG_FORMAT] (default text)")

	root.AddCommand(a.runCmd(), a.configValidateCmd(), a.requestCmd(), a.listCmd(), a.requestListCmd(), a.requestDeleteCmd(),
		a.labelListCmd(), a.returnCmd(), a.holdCmd(), a.deleteCmd(), a.infoCmd(), a.eraseCmd(),
		a.exportImageDataCmd(), a.importImageDataCmd(), a.benchCmd(), movedDevCloudCmd())
	root.AddCommand(a.imageCmds()...)
	return root
}

// flagNames maps Settings fields to their flag names.
var flagNames = map[string]string{
	"NatsURL": "nats-url", "NatsCreds": "nats-creds", "NatsTLSCA": "nats-tls-ca", "NatsTLSCert": "nats-tls-cert",
	"NatsTLSKey": "nats-tls-key", "NatsListen": "nats-listen", "Owner": "owner", "Config": "config", "Secure": "secure", "DataDir": "data-dir",
	"Roles": "roles", "ID": "id", "HTTPAddr": "http-addr", "PprofAddr": "pprof-addr", "Replicas": "replicas", "LeaseTTL": "lease-ttl",
	"LogLevel": "log-level", "LogFormat": "log-format", "SyncInterval": "sync-interval", "FailedRequestAge": "failed-request-age",
	"BuildWorkers": "build-workers", "UploadWorkers": "upload-workers",
}

// loadSettings reads the environment, then lets every flag given on the
// command line override its variable.
func (a *app) loadSettings(cmd *cobra.Command) error {
	s, err := config.LoadSettings()
	if err != nil {
		return err
	}
	sv, fv := reflect.ValueOf(&s).Elem(), reflect.ValueOf(&a.flags).Elem()
	for field, name := range flagNames {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			sv.FieldByName(field).Set(fv.FieldByName(field))
		}
	}
	if f := cmd.Flags().Lookup("http-addr"); f != nil && f.Changed {
		s.HTTPAddrSet = true
	}
	a.settings = s
	return nil
}

func (a *app) logger() *slog.Logger {
	level := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[a.settings.LogLevel]
	opts := &slog.HandlerOptions{Level: level}
	if a.settings.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(a.logOut(), opts))
	}
	return slog.New(slog.NewTextHandler(a.logOut(), opts))
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
