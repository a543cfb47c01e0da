package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/kv"
)

// listing describes a command that prints records as a table, or as JSON
// with --json: list, request-list, image-list, dib-image-list,
// image-status, alien-image-list.
type listing[T any] struct {
	use, short string
	// what names the records in --json's help ("the node records").
	what string
	// load reads the records, in the order they are printed.
	load func(ctx context.Context, c *client.Client) ([]T, error)
	// columns heads the table; row gives a record's cells.
	columns []string
	row     func(x T, now time.Time) []string
}

func listCommand[T any](a *app, l listing[T]) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   l.use,
		Short: l.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			records, err := l.load(cmd.Context(), c)
			if err != nil {
				return err
			}
			if asJSON {
				if records == nil {
					records = []T{}
				}
				return writeJSON(a.out, records)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, strings.Join(l.columns, "\t"))
			for _, x := range records {
				fmt.Fprintln(tw, strings.Join(l.row(x, now), "\t"))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print "+l.what+" as JSON")
	return cmd
}

// values takes the records out of entries, sorted by cmp.
func values[T any](entries []kv.Entry[T], err error, cmp func(x, y T) int) ([]T, error) {
	if err != nil {
		return nil, err
	}
	out := make([]T, len(entries))
	for i, e := range entries {
		out[i] = e.Value
	}
	slices.SortFunc(out, cmp)
	return out, nil
}
