package main

import (
	"github.com/spf13/cobra"
)

// devCloudCmd is the parent of the clouds on loopback: each speaks a
// cloud's real API so that the real driver can be watched at work without
// a cloud.
func (a *app) devCloudCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev-cloud",
		Short: "Run a cloud on loopback that speaks a real cloud API (for trying the drivers without a cloud)",
		Long: `Run a cloud on loopback that speaks a real cloud's API faithfully
enough for its real clients: the driver's SDK, and the cloud's own CLI.
Its state lives in memory until it stops.`,
	}
	cmd.AddCommand(a.devCloudOpenStackCmd(), a.devCloudAWSCmd())
	return cmd
}
