package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/status"
)

// tableCmd is a command that prints one of Nodepool's tables (list,
// request-list, label-list, image-list, dib-image-list, image-status), the
// same table the web API serves under the same name: bordered text, or JSON
// objects with --json; --fields picks and orders the columns. A running
// nodepool process makes the table from its caches, brought up to date
// with the buckets first (status.Serve); the command reads the buckets
// itself when none answers, when its credentials may not ask (a
// requestor's), or with --from-buckets.
func (a *app) tableCmd(use, table, short string) *cobra.Command {
	var (
		q           status.Query
		fields      string
		fromBuckets bool
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
			q.Fields = status.ParseFields(fields)
			if !fromBuckets {
				err := status.Fetch(ctx, c.Conn(), table, q, tableWait, a.out)
				if !errors.Is(err, status.ErrNoServer) {
					return err
				}
				a.logger().Debug("reading the buckets", "table", table, "because", err)
			}
			// The configuration adds its images and their pause to the
			// image tables; without one the records say all there is.
			cfg, _ := config.Load(a.settings.Config)
			t, err := status.Load(ctx, status.Buckets{JS: c.JetStream(), Buckets: c.Buckets()}, table, status.Options{Config: cfg})
			if err != nil {
				return err
			}
			return q.Write(a.out, t)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&q.JSON, "json", false, "print JSON objects, as the web API does with Accept: application/json")
	f.StringVar(&fields, "fields", "", "comma separated fields to show, in that order (as the web API's ?fields=)")
	f.BoolVar(&fromBuckets, "from-buckets", false, "read the records from the buckets, instead of asking a running nodepool process for the table")
	if table == "node-list" || table == "request-list" {
		f.BoolVar(&q.Detail, "detail", false, "show every field")
	}
	return cmd
}

// tableWait bounds the wait for a running process to send a table (one of
// 100,000 nodes takes it about a second); without an answer the CLI reads
// the buckets itself. No process, or credentials that may not ask, are
// known at once.
const tableWait = 10 * time.Second

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
