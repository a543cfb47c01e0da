package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

func (a *app) connect(ctx context.Context) (*client.Client, error) {
	return client.Connect(ctx, a.settings)
}

func (a *app) configValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "config-validate [FILE]",
		Short: "Check a nodepool.yaml; exits non-zero and names every problem",
		Long: `Check a nodepool.yaml (FILE, or -c/NODEPOOL_CONFIG) and the secure file
(-s/NODEPOOL_SECURE) merged over it. Every error is printed with its file,
line and key path, and the command exits 1; a file that looks written for
Nodepool before 3.0 is told so first. Warnings (what Nodepool accepts but
is likely a mistake, or what a cloud will refuse when a label is launched)
are printed with "warning:" and do not fail. A valid file naming a
provider whose driver this build reads but cannot run yet (kubernetes) is
said so and exits 2: "nodepool run" refuses it.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := a.settings.Config
			if len(args) == 1 {
				path = args[0]
			}
			cfg, err := config.LoadFiles(path, a.settings.Secure)
			if err != nil {
				fmt.Fprintln(a.err, err)
				return exitError{code: 1}
			}
			for _, w := range cfg.Warnings {
				fmt.Fprintln(a.err, "warning:", w)
			}
			pools := 0
			for _, p := range cfg.Providers {
				pools += len(p.Pools)
			}
			fmt.Fprintf(a.out, "%s is valid: %d labels, %d providers, %d pools\n", path, len(cfg.Labels), len(cfg.Providers), pools)
			if un := cfg.Unavailable(); len(un) > 0 {
				for _, p := range un {
					fmt.Fprintf(a.err, "%s: %s; nodepool run refuses this file until the provider is removed from it\n", path, config.UnavailableMessage(p))
				}
				return exitError{code: 2}
			}
			return nil
		},
	}
}

func (a *app) requestCmd() *cobra.Command {
	var (
		asJSON    bool
		timeout   time.Duration
		id        string
		requestor string
		holder    string
		priority  int
		provider  string
		noReuse   bool
		lease     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "request LABEL...",
		Short: "Request nodes, wait for them, take them and print them",
		Long: `Request one node per LABEL, wait until the request is fulfilled, take the
nodes (state in-use, held by --holder) and delete the request, as any
requestor does. Give each node back with "nodepool return NODE" when done.

The request carries a lease (--lease), renewed while the command waits:
interrupted (Ctrl-C), past --timeout or failing, the command withdraws its
request and gives back any node it took; killed, its request is deleted
by nodepool once the lease runs out, which frees its nodes.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, labels []string) error {
			ctx := cmd.Context()
			if lease < 0 || (lease > 0 && lease < 3*time.Second) {
				return fmt.Errorf("--lease: expected 0 (no lease) or at least 3s, got %s", lease)
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			m := events.RequestMessage{ID: id, Labels: labels, Requestor: requestor, Provider: provider}
			if cmd.Flags().Changed("priority") {
				m.Priority = &priority
			}
			if noReuse {
				f := false
				m.Reuse = &f
			}
			c.RequestLease = lease
			if lease == 0 {
				c.RequestLease = -1 // no lease
			}
			nodes, err := c.Request(ctx, m, holder)
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) && timeout > 0 {
					return fmt.Errorf("no nodes within --timeout %s; the request was withdrawn: %w", timeout, err)
				}
				if errors.Is(err, context.Canceled) {
					return fmt.Errorf("interrupted; the request was withdrawn: %w", err)
				}
				return err
			}
			if asJSON {
				return writeJSON(a.out, nodes)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tLABEL\tPROVIDER\tPOOL\tSTATE\tIP\tUSERNAME\tPORT\tHOLDER")
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.ID, strings.Join(n.Labels, ","), n.Provider, n.Pool,
					n.State, orDash(n.InterfaceIP), orDash(n.Username), n.ConnectionPort, n.Holder)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print the node records as JSON")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long (0: wait for ever)")
	f.StringVar(&id, "id", "", "request id (default: assigned by the stream)")
	f.StringVar(&requestor, "requestor", "nodepool-cli", "requestor name recorded on the request")
	f.StringVar(&holder, "holder", defaultHolder(), "holder recorded on the nodes taken")
	f.IntVar(&priority, "priority", events.DefaultPriority, "priority (lower is served first)")
	f.StringVar(&provider, "provider", "", "prefer this provider")
	f.BoolVar(&noReuse, "no-reuse", false, "always launch new nodes instead of taking ready ones")
	f.DurationVar(&lease, "lease", client.DefaultRequestLease, "lease of the request, renewed while waiting; a request whose lease ran out is deleted (0: no lease)")
	return cmd
}

func defaultHolder() string {
	name := "nodepool"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return client.Holder(name, host)
}

// guardFlags are the flags of return and delete: who the operator is, and
// --force to act on a node that is someone else's or on hold.
func guardFlags(cmd *cobra.Command, g *client.Guard) {
	cmd.Flags().StringVar(&g.Holder, "holder", defaultHolder(), "who you are: nodes taken by this holder are yours")
	cmd.Flags().BoolVar(&g.Force, "force", false, "also act on a node someone else holds, allocated to a request, or on hold")
}

func (a *app) returnCmd() *cobra.Command {
	var g client.Guard
	cmd := &cobra.Command{
		Use:   "return NODE...",
		Short: "Give nodes back (state used); nodepool deletes them",
		Long: `Give nodes back (state used); nodepool then deletes them. A node that
someone else holds (in use by another holder, or ready and allocated to a
request), or that is on hold, is refused unless --force. Without --force
the node goes back through the requestor's return endpoint
(nodepool.api.<owner>.return), which lets a requestor give back only the
nodes it took; --force writes the node's record directly, which only
operators' (and the service's) credentials may do.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			return a.eachNode(cmd.Context(), ids, "return", "returned", func(c *client.Client, id string) error {
				return c.ReturnAs(cmd.Context(), id, g)
			})
		},
	}
	guardFlags(cmd, &g)
	return cmd
}

func (a *app) holdCmd() *cobra.Command {
	var (
		reason string
		expire time.Duration
	)
	cmd := &cobra.Command{
		Use:   "hold NODE...",
		Short: "Keep nodes out of service (for debugging) until deleted or expired",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if expire < 0 {
				return fmt.Errorf("--expire: expected a positive duration such as 2h, got %s", expire)
			}
			return a.eachNode(cmd.Context(), ids, "hold", "held", func(c *client.Client, id string) error {
				_, err := c.HoldAny(cmd.Context(), id, reason, expire)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the node is held (shown in the comment column)")
	cmd.Flags().DurationVar(&expire, "expire", 0, "delete the node after this long (e.g. 2h); 0 keeps it until deleted or max-hold-age")
	return cmd
}

func (a *app) deleteCmd() *cobra.Command {
	var g client.Guard
	cmd := &cobra.Command{
		Use:   "delete NODE...",
		Short: "Delete nodes (a held node, or one someone else holds, only with --force)",
		Long: `Delete nodes whatever their state, as Nodepool's delete did, except that
a node someone else holds (in use by another holder, or ready and
allocated to a request) or that is on hold is refused unless --force.
Deleting a held node with --force is how a hold ends early.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			return a.eachNode(cmd.Context(), ids, "delete", "marked for deletion", func(c *client.Client, id string) error {
				return c.DeleteNodeAs(cmd.Context(), id, g)
			})
		},
	}
	guardFlags(cmd, &g)
	return cmd
}

func (a *app) requestDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "request-delete REQUEST...",
		Short: "Delete node requests; nodes allocated to them and not taken go back to the pool",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			failed := 0
			for _, id := range ids {
				err := c.DeleteAnyRequest(cmd.Context(), id)
				if errors.Is(err, kv.ErrNotFound) {
					err = fmt.Errorf("no request %q (see nodepool request-list)", id)
				}
				if err != nil {
					fmt.Fprintf(a.err, "%s: %v\n", id, err)
					failed++
					continue
				}
				fmt.Fprintf(a.out, "%s deleted\n", id)
			}
			if failed > 0 {
				return exitError{code: 1}
			}
			return nil
		},
	}
}

// eachNode applies fn to each node id and reports each outcome; it fails if
// any failed.
func (a *app) eachNode(ctx context.Context, ids []string, verb, done string, fn func(*client.Client, string) error) error {
	c, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	failed := 0
	for _, id := range ids {
		if err := fn(c, id); err != nil {
			if errors.Is(err, kv.ErrNotFound) {
				err = fmt.Errorf("no node %q", id)
			}
			if errors.Is(err, client.ErrHeldByOther) || errors.Is(err, client.ErrOnHold) {
				err = fmt.Errorf("%w; refused (--force to %s it anyway)", err, verb)
			}
			fmt.Fprintf(a.err, "%s: %v\n", id, err)
			failed++
			continue
		}
		fmt.Fprintf(a.out, "%s %s\n", id, done)
	}
	if failed > 0 {
		return exitError{code: 1}
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
