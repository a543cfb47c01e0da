package main

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/builder"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// imageCmds are the image builder's commands, as in Nodepool.
func (a *app) imageCmds() []*cobra.Command {
	return []*cobra.Command{a.builderCmd(), a.imageBuildCmd(), a.dibImageListCmd(), a.imageListCmd(), a.imageStatusCmd(),
		a.imageDeleteCmd(), a.dibImageDeleteCmd(), a.imagePauseCmd(true), a.imagePauseCmd(false), a.alienImageListCmd()}
}

// diskimage checks that an image is one the configuration builds.
func (a *app) diskimage(name string) (*config.Config, error) {
	cfg, err := a.settings.LoadConfig()
	if err != nil {
		return nil, err
	}
	di, ok := cfg.Diskimage(name)
	if !ok || di.Abstract {
		return nil, fmt.Errorf("no image %q in %s; expected one of: %s", name, a.settings.Config, strings.Join(cfg.DiskimageNames(), ", "))
	}
	return cfg, nil
}

func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "nodepool"
}

func (a *app) imageBuildCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "image-build IMAGE",
		Short: "Ask for a build of an image now (a build in progress answers it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			image := args[0]
			if _, err := a.diskimage(image); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.RequestBuild(ctx, image, currentUser()); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "build of %s requested\n", image)
			builds, err := c.Images().Builds.Filtered(kv.BuildKeys(image)).List(ctx)
			if err == nil {
				for _, e := range builds {
					if e.Value.State == kv.ImageBuilding {
						fmt.Fprintf(a.out, "build %s-%s is in progress on %s; it answers this request\n", image, e.Value.ID, e.Value.Builder)
					}
				}
			}
			return nil
		},
	}
}

func (a *app) imageDeleteCmd() *cobra.Command {
	var provider, image, build, upload string
	cmd := &cobra.Command{
		Use:   "image-delete --provider P --image I --build-id B --upload-id U",
		Short: "Delete an upload from its provider; launches fall back to the previous upload",
		Long: `Delete an upload from its provider. The build is not uploaded to that
provider again, so new nodes boot from the previous upload: this is how a
bad image is rolled back on one provider (dib-image-delete does it for
every provider).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			err = c.DeleteUpload(ctx, image, build, provider, upload)
			if errors.Is(err, kv.ErrNotFound) {
				return fmt.Errorf("no upload %s of build %s of %s to %s (see nodepool image-list)", upload, build, image, provider)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "upload %s marked for deletion\n", kv.UploadKey(image, build, provider, upload))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&provider, "provider", "", "provider name")
	f.StringVar(&image, "image", "", "image name")
	f.StringVar(&build, "build-id", "", "build id (as image-list shows it)")
	f.StringVar(&upload, "upload-id", "", "upload id (as image-list shows it)")
	for _, name := range []string{"provider", "image", "build-id", "upload-id"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func (a *app) dibImageDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dib-image-delete IMAGE-BUILDID",
		Short: "Delete a build: its uploads from every provider, then its files",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			image, build, err := kv.ParseBuildName(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			err = c.DeleteBuild(ctx, image, build)
			if errors.Is(err, kv.ErrNotFound) {
				return fmt.Errorf("no build %s (see nodepool dib-image-list)", args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "build %s marked for deletion\n", args[0])
			return nil
		},
	}
}

func (a *app) imagePauseCmd(pause bool) *cobra.Command {
	use, short, done := "image-pause IMAGE", "Stop building an image (its uploads stay in use)", "paused"
	if !pause {
		use, short, done = "image-unpause IMAGE", "Resume building an image", "unpaused"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.diskimage(args[0]); err != nil {
				return err
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.PauseImage(cmd.Context(), args[0], pause, currentUser()); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s %s\n", args[0], done)
			return nil
		},
	}
}

func (a *app) alienImageListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "alien-image-list [PROVIDER]",
		Short: "List images in providers tagged as nodepool's that no upload accounts for",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cfg, err := a.settings.LoadConfig()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				if _, ok := cfg.Provider(args[0]); !ok {
					return fmt.Errorf("no provider %q in %s", args[0], a.settings.Config)
				}
			}
			c, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			entries, err := c.Images().Uploads.List(ctx)
			if err != nil {
				return err
			}
			uploads := make([]kv.ImageUpload, len(entries))
			for i, e := range entries {
				uploads[i] = e.Value
			}
			providers, err := service.NewProviders(ctx, c.JetStream(), cfg, service.DriverOptions{Replicas: a.settings.Replicas, Log: a.logger()})
			if err != nil {
				return err
			}
			defer func() {
				for _, p := range providers {
					p.Close()
				}
			}()
			type alien struct {
				Provider string        `json:"provider"`
				Image    drivers.Image `json:"image"`
			}
			var out []alien
			for _, p := range cfg.Providers {
				if len(args) == 1 && p.Name != args[0] {
					continue
				}
				ip, ok := providers[p.Name].(drivers.ImageProvider)
				if !ok {
					continue
				}
				aliens, err := listAliens(ctx, p.Name, ip, uploads)
				if err != nil {
					return fmt.Errorf("provider %s: %w", p.Name, err)
				}
				for _, img := range aliens {
					out = append(out, alien{Provider: p.Name, Image: img})
				}
			}
			if asJSON {
				return writeJSON(a.out, out)
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROVIDER\tNAME\tIMAGE ID\tUPLOAD")
			for _, al := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", al.Provider, al.Image.Name, al.Image.ExternalID, orDash(al.Image.Tags[drivers.TagUpload]))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the images as JSON")
	return cmd
}

func listAliens(ctx context.Context, provider string, ip drivers.ImageProvider, uploads []kv.ImageUpload) ([]drivers.Image, error) {
	return builder.AlienImages(ctx, provider, ip, uploads)
}
