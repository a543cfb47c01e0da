package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/status"
)

// tableCmd is a command that prints one of Nodepool's tables (list,
// request-list, label-list, image-list, dib-image-list, image-status), the
// same table the web API serves under the same name: bordered text, or JSON
// objects with --json; --fields picks and orders the columns.
func (a *app) tableCmd(use, table, short string) *cobra.Command {
	var (
		asJSON, detail bool
		fields         string
	)
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			// The configuration adds its images and their pause to the
			// image tables; without one the records say all there is.
			cfg, _ := config.Load(a.settings.Config)
			t, err := status.Load(ctx, status.Buckets{JS: c.JetStream(), Buckets: c.Buckets()}, table, status.Options{Config: cfg})
			if err != nil {
				return err
			}
			sel := status.ParseFields(fields)
			if _, err := t.Select(sel); err != nil {
				return fmt.Errorf("--fields: %w", err)
			}
			if asJSON {
				return t.WriteJSON(a.out, sel)
			}
			if len(sel) == 0 && !detail {
				sel = t.Default
			}
			return t.WriteText(a.out, sel)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON objects, as the web API does with Accept: application/json")
	f.StringVar(&fields, "fields", "", "comma separated fields to show, in that order (as the web API's ?fields=)")
	if table == "node-list" || table == "request-list" {
		f.BoolVar(&detail, "detail", false, "show every field")
	}
	return cmd
}

func (a *app) listCmd() *cobra.Command {
	return a.tableCmd("list", "node-list", "List nodes (the web API's /node-list)")
}

func (a *app) requestListCmd() *cobra.Command {
	return a.tableCmd("request-list", "request-list", "List node requests (/request-list)")
}

func (a *app) labelListCmd() *cobra.Command {
	return a.tableCmd("label-list", "label-list", "List the labels the live launchers serve (/label-list)")
}

func (a *app) dibImageListCmd() *cobra.Command {
	return a.tableCmd("dib-image-list", "dib-image-list", "List image builds (/dib-image-list)")
}

func (a *app) imageListCmd() *cobra.Command {
	return a.tableCmd("image-list", "image-list", "List image uploads to providers (/image-list)")
}

func (a *app) imageStatusCmd() *cobra.Command {
	return a.tableCmd("image-status", "image-status", "Show each image: paused, build requests waiting, its newest build (/image-status)")
}
