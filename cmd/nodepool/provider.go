package main

import (
	"bufio"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/status"
)

// providerTables are info's two tables: the provider's uploads, and its
// nodes.
func providerTables(d client.ProviderData, now time.Time) (*status.Table, *status.Table) {
	uploads := &status.Table{Columns: []status.Column{{Key: "image", Header: "Image Name"}, {Key: "build_id", Header: "Build ID"},
		{Key: "upload_id", Header: "Upload ID"}, {Key: "state", Header: "State"}, {Key: "external_id", Header: "Provider Image ID"}}}
	for _, u := range d.Uploads {
		uploads.Rows = append(uploads.Rows, []status.Cell{
			{JSON: u.Image, Text: u.Image}, {JSON: u.BuildID, Text: u.BuildID}, {JSON: u.ID, Text: u.ID},
			{JSON: string(u.State), Text: string(u.State)}, {JSON: u.ExternalID, Text: u.ExternalID}})
	}
	ns := status.Pointers(d.Nodes)
	status.SortNodes(ns)
	nodes := status.NodeList(ns, func(string) bool { return true }, now)
	nodes.Default = []string{"id", "server_id", "label", "state", "age", "node_age"}
	return uploads, nodes
}

func (a *app) infoCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "info PROVIDER",
		Short: "Show the records the buckets hold for a provider: its image uploads and its nodes",
		Long: `Show what the buckets hold for a provider, configured or not: its image
uploads (nodepool-images) and its nodes (nodepool-nodes). Nodepool's info
showed the same from ZooKeeper; use it before "nodepool erase".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.ProviderData(ctx, args[0])
			if err != nil {
				return err
			}
			uploads, nodes := providerTables(d, time.Now())
			if asJSON {
				fmt.Fprint(a.out, `{"uploads": `)
				if err := uploads.WriteJSON(a.out, nil); err != nil {
					return err
				}
				fmt.Fprint(a.out, `, "nodes": `)
				if err := nodes.WriteJSON(a.out, nodes.Default); err != nil {
					return err
				}
				fmt.Fprintln(a.out, "}")
				return nil
			}
			fmt.Fprintf(a.out, "Records of provider %s\n", args[0])
			if len(d.ServedBy) > 0 {
				fmt.Fprintf(a.out, "Served by the live launchers %s\n", strings.Join(d.ServedBy, ", "))
			} else if cfg, err := config.Load(a.settings.Config); err == nil {
				if _, ok := cfg.Provider(args[0]); !ok {
					fmt.Fprintf(a.out, "Not in %s, and no live launcher serves it\n", a.settings.Config)
				}
			}
			if r := d.Remembered; r != nil {
				switch {
				case r.DrainingSince != nil && r.Problem != "":
					fmt.Fprintf(a.out, "Removed, draining since %s; the drain cannot go on since %s: %s\n(\"nodepool erase %s\" gives it up)\n",
						r.DrainingSince.Format(time.RFC3339), r.ProblemSince.Format(time.RFC3339), r.Problem, args[0])
				case r.DrainingSince != nil:
					fmt.Fprintf(a.out, "Removed, draining since %s: its nodes, instances and uploads are being deleted\n", r.DrainingSince.Format(time.RFC3339))
				case len(r.Section) > 0:
					fmt.Fprintf(a.out, "Configuration remembered (driver %s) by %s at %s\n", r.Driver, r.Launcher, r.Recorded.Format(time.RFC3339))
				}
			}
			fmt.Fprintln(a.out, "\nImage uploads:")
			if err := uploads.WriteText(a.out, nil); err != nil {
				return err
			}
			fmt.Fprintln(a.out, "\nNodes:")
			return nodes.WriteText(a.out, nodes.Default)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"uploads": [...], "nodes": [...]}`)
	return cmd
}

func (a *app) eraseCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "erase PROVIDER",
		Short: "Remove a provider's node and upload records and its remembered configuration (not its instances or images)",
		Long: `Remove the node records and image upload records of a provider from the
buckets, as Nodepool's erase removed its ZooKeeper data, and the
configuration section the launchers remember of it (nodepool-providers).
Nothing in the cloud is touched. A provider removed from the
configuration is drained by the launchers on their own (its nodes,
instances and uploads deleted through the remembered section, which is
then forgotten): erase is how to give up a drain that cannot go on, when
the provider's cloud is gone for good; instances and images still there
are left. Erase refuses a provider that a live launcher still serves and
asks before it erases, unless --force.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			provider := args[0]
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.ProviderData(ctx, provider)
			if err != nil {
				return err
			}
			if len(d.Nodes) == 0 && len(d.Uploads) == 0 && d.Remembered == nil {
				fmt.Fprintf(a.out, "no records of provider %s\n", provider)
				return nil
			}
			if !force {
				if len(d.ServedBy) > 0 {
					return fmt.Errorf("provider %s is served by the live launchers %s: remove it from their configuration first, or erase with --force (its nodes in use would be lost to their holders)",
						provider, strings.Join(d.ServedBy, ", "))
				}
				fmt.Fprintf(a.out, "Erase %d node records and %d upload records of provider %s? [y/N] ", len(d.Nodes), len(d.Uploads), provider)
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if ans := strings.ToLower(strings.TrimSpace(answer)); ans != "y" && ans != "yes" {
					fmt.Fprintln(a.out)
					return fmt.Errorf("not erased (answer y, or give --force)")
				}
			}
			nodes, uploads, err := c.EraseProvider(ctx, provider)
			if err != nil {
				return fmt.Errorf("after erasing %d node records and %d upload records: %w", nodes, uploads, err)
			}
			fmt.Fprintf(a.out, "erased %d node records and %d upload records of provider %s", nodes, uploads, provider)
			if d.Remembered != nil {
				fmt.Fprint(a.out, ", and its remembered configuration")
			}
			fmt.Fprintln(a.out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "do not ask, and erase even if a live launcher serves the provider")
	return cmd
}
