// Command nodepool-devcloud runs clouds on loopback that speak real cloud
// APIs (OpenStack, AWS), and the tests' Kubernetes cluster, for trying
// nodepool's drivers, and for tests and benchmarks, without a cloud. It is a command of its own so that the
// product binary, nodepool, carries no simulator.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot(os.Stdout, os.Stderr).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "nodepool-devcloud:", err)
		os.Exit(1)
	}
}

// app holds what the commands share: where output goes and how to log.
type app struct {
	out, err  io.Writer
	logLevel  string
	logFormat string
}

func newRoot(out, errOut io.Writer) *cobra.Command {
	a := &app{out: out, err: errOut}
	root := &cobra.Command{
		Use:   "nodepool-devcloud",
		Short: "Run a cloud on loopback that speaks a real cloud API (for trying nodepool's drivers without a cloud)",
		Long: `Run a cloud on loopback that speaks a real cloud's API faithfully
enough for its real clients: nodepool's drivers, the cloud's own SDK and
CLI, and other tools. Its state lives in memory until it stops.

Once it listens, it prints on standard output one line of shell exports
that point clients at it (AWS_ENDPOINT_URL and credentials; the
clouds.yaml and cloud name), then runs until SIGINT or SIGTERM.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if _, ok := logLevels[a.logLevel]; !ok {
				return fmt.Errorf("--log-level %q: expected debug, info, warn or error", a.logLevel)
			}
			if a.logFormat != "text" && a.logFormat != "json" {
				return fmt.Errorf("--log-format %q: expected text or json", a.logFormat)
			}
			return nil
		},
	}
	root.SetOut(out)
	root.SetErr(errOut)
	pf := root.PersistentFlags()
	pf.StringVar(&a.logLevel, "log-level", "info", "debug, info, warn or error")
	pf.StringVar(&a.logFormat, "log-format", "text", "text or json")
	root.AddCommand(a.openStackCmd(), a.awsCmd(), a.kubernetesCmd())
	return root
}

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// logger writes the cloud's log to standard error.
func (a *app) logger() *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevels[a.logLevel]}
	if a.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(a.err, opts))
	}
	return slog.New(slog.NewTextHandler(a.err, opts))
}
