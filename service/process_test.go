package service_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/service"
)

// runProcess starts a whole process and runs it until the test ends.
func runProcess(t *testing.T, settings config.Settings, cfg *config.Config, log *slog.Logger) *service.Process {
	t.Helper()
	p, err := service.Start(t.Context(), settings, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; p.Close() })
	return p
}
