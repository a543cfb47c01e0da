package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nodepool-nats/nodepool/internal/token"
	"github.com/nodepool-nats/nodepool/kv"
)

// ExportImageData reads every record of the nodepool-images bucket
// (`nodepool export-image-data`).
func (c *Client) ExportImageData(ctx context.Context) (*kv.ImageData, error) {
	s := c.Images()
	d := &kv.ImageData{Format: kv.ImageDataFormat, Version: kv.ImageDataVersion, Exported: time.Now().UTC(),
		Images: []kv.DiskImage{}, Builds: []kv.ImageBuild{}, Uploads: []kv.ImageUpload{}}
	imgs, err := s.Images.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range imgs {
		img := e.Value
		if img.Name == "" {
			img.Name = token.Decode(e.Key)
		}
		d.Images = append(d.Images, img)
	}
	builds, err := s.Builds.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range builds {
		d.Builds = append(d.Builds, e.Value)
	}
	uploads, err := s.Uploads.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range uploads {
		d.Uploads = append(d.Uploads, e.Value)
	}
	return d, nil
}

// ImportResult says what an import did.
type ImportResult struct {
	// Created records, and records already there as they are in the file.
	Created, Unchanged int
	// Conflicts are the keys of records that exist with other content:
	// they are kept as they are.
	Conflicts []string
}

// ImportImageData writes the records of an image data file into the
// nodepool-images bucket (`nodepool import-image-data`). Each image's id
// counters are raised to at least the highest build and upload id of the
// file first, so that builds and uploads made after the import never reuse
// an imported id. A build or upload already in the bucket is left as it
// is (a conflict if it differs from the file).
func (c *Client) ImportImageData(ctx context.Context, d *kv.ImageData) (ImportResult, error) {
	var res ImportResult
	s := c.Images()
	type seqs struct{ build, upload uint64 }
	want := map[string]seqs{}
	byName := map[string]kv.DiskImage{}
	for _, img := range d.Images {
		byName[img.Name] = img
		want[img.Name] = seqs{img.BuildSeq, img.UploadSeq}
	}
	for _, b := range d.Builds {
		n, _ := strconv.ParseUint(b.ID, 10, 64)
		w := want[b.Image]
		w.build = max(w.build, n)
		want[b.Image] = w
	}
	for _, u := range d.Uploads {
		nb, _ := strconv.ParseUint(u.BuildID, 10, 64)
		nu, _ := strconv.ParseUint(u.ID, 10, 64)
		w := want[u.Image]
		w.build, w.upload = max(w.build, nb), max(w.upload, nu)
		want[u.Image] = w
	}
	for name, w := range want {
		created := false
		_, err := s.Images.Upsert(ctx, kv.DiskImageKey(name), func(cur *kv.DiskImage, found bool) {
			if !found {
				*cur = byName[name]
				cur.Name = name
				created = true
			}
			cur.BuildSeq, cur.UploadSeq = max(cur.BuildSeq, w.build), max(cur.UploadSeq, w.upload)
		})
		if err != nil {
			return res, fmt.Errorf("image %s: %w", name, err)
		}
		if created {
			res.Created++
		} else {
			res.Unchanged++
		}
	}
	for _, b := range d.Builds {
		if err := importRecord(ctx, s.Builds, b.Key(), &b, &res); err != nil {
			return res, err
		}
	}
	for _, u := range d.Uploads {
		if err := importRecord(ctx, s.Uploads, u.Key(), &u, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func importRecord[T any](ctx context.Context, s *kv.Store[T], key string, v *T, res *ImportResult) error {
	_, err := s.Create(ctx, key, v)
	if err == nil {
		res.Created++
		return nil
	}
	if !errors.Is(err, kv.ErrExists) {
		return err
	}
	cur, err := s.Get(ctx, key)
	if err != nil && !errors.Is(err, kv.ErrBadRecord) {
		return err
	}
	a, _ := json.Marshal(cur.Value)
	b, _ := json.Marshal(v)
	if err == nil && string(a) == string(b) {
		res.Unchanged++
	} else {
		res.Conflicts = append(res.Conflicts, key)
	}
	return nil
}
