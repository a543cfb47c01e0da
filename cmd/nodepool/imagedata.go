package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/nodepool-nats/nodepool/kv"
)

func (a *app) exportImageDataCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "export-image-data FILE",
		Short: "Save the image records (builds, uploads, id counters) to FILE",
		Long: `Save every record of the nodepool-images bucket (images with their pause
and id counters, builds, uploads with the providers' image ids) to FILE as
JSON, as Nodepool's export-image-data saved its ZooKeeper image data. The
image files and the node records are not in it. import-image-data puts the
records into a rebuilt cluster, so it keeps its builds and uploads.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.ExportImageData(cmd.Context())
			if err != nil {
				return err
			}
			data, err := json.MarshalIndent(d, "", "  ")
			if err != nil {
				return err
			}
			// Write a new file next to FILE and rename it, so FILE is
			// never half written.
			tmp, err := os.CreateTemp(filepath.Dir(args[0]), filepath.Base(args[0])+".*")
			if err != nil {
				return fmt.Errorf("writing %s: %w", args[0], err)
			}
			defer os.Remove(tmp.Name())
			if _, err := tmp.Write(append(data, '\n')); err != nil {
				tmp.Close()
				return fmt.Errorf("writing %s: %w", args[0], err)
			}
			if err := tmp.Close(); err != nil {
				return fmt.Errorf("writing %s: %w", args[0], err)
			}
			if err := os.Rename(tmp.Name(), args[0]); err != nil {
				return fmt.Errorf("writing %s: %w", args[0], err)
			}
			fmt.Fprintf(a.out, "exported %d images, %d builds and %d uploads to %s\n", len(d.Images), len(d.Builds), len(d.Uploads), args[0])
			return nil
		},
	}
}

func (a *app) importImageDataCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "import-image-data FILE",
		Short: "Put the image records of FILE (from export-image-data) into the buckets",
		Long: `Put the image records saved by export-image-data into the nodepool-images
bucket. Each image's id counters are raised first, so new builds and uploads
never reuse an imported id. A record that already exists is kept as it is;
one that differs from FILE is reported, and the command then exits 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			d, err := kv.ParseImageData(data)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.ImportImageData(cmd.Context(), d)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "imported %s: %d records created, %d already there\n", args[0], res.Created, res.Unchanged)
			for _, key := range res.Conflicts {
				fmt.Fprintf(a.err, "%s: exists with other content; kept as it is\n", key)
			}
			if len(res.Conflicts) > 0 {
				return exitError{code: 1}
			}
			return nil
		},
	}
}
