package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// movedDevCloudCmd answers `nodepool dev-cloud ...`, which is a command
// of its own now: the product binary carries no simulator.
func movedDevCloudCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "dev-cloud",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("the dev clouds are a command of their own: run nodepool-devcloud with the same arguments (nodepool-devcloud openstack ..., nodepool-devcloud aws ...); build it with `go build ./cmd/nodepool-devcloud`")
		},
	}
}
