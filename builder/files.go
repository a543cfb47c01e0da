package builder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
	"github.com/nodepool-nats/nodepool/kv"
)

// FilesBucket is the object store that holds the image files of every
// build, so that an upload worker on any host can read them.
const FilesBucket = "nodepool-image-files"

// EnsureFiles creates (or opens) the image files object store. As for the
// buckets (kv.EnsureBucket), a cluster between two leaders, or one that
// does not know everywhere yet the store another process just created, is
// waited out.
func EnsureFiles(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) (jetstream.ObjectStore, error) {
	_, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      FilesBucket,
			Description: "image files of the builds in nodepool-images",
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		})
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		log.Warn("object store exists with other settings; using it as it is", "bucket", FilesBucket)
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening object store %s: %w", FilesBucket, err)
	}
	obs, err := natsretry.Await(ctx, jetstream.ErrBucketNotFound, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return js.ObjectStore(ctx, FilesBucket)
	})
	if err != nil {
		return nil, fmt.Errorf("opening object store %s: %w", FilesBucket, err)
	}
	return obs, nil
}

// ObjectName is the name of a build's file of one format.
func ObjectName(image, build, format string) string { return image + "/" + build + "." + format }

// storeFiles puts a build's files into the object store, streaming each
// from disk (an object is a series of 128 KiB chunks, so no file is held in
// memory), and returns what was stored. On error, what was stored is
// removed again.
func (b *Builder) storeFiles(ctx context.Context, build *kv.ImageBuild, paths map[string]string) (map[string]kv.ImageFile, int64, error) {
	out := map[string]kv.ImageFile{}
	var total int64
	formats := make([]string, 0, len(paths))
	for f := range paths {
		formats = append(formats, f)
	}
	slices.Sort(formats)
	for _, format := range formats {
		f, err := os.Open(paths[format])
		if err != nil {
			b.deleteFiles(context.WithoutCancel(ctx), build.Image, build.ID)
			return nil, 0, err
		}
		h := sha256.New()
		name := ObjectName(build.Image, build.ID, format)
		data, err := b.paced(ctx, io.TeeReader(f, h))
		if err != nil {
			_ = f.Close()
			return nil, 0, err
		}
		info, err := b.files.Put(ctx, jetstream.ObjectMeta{
			Name:        name,
			Description: fmt.Sprintf("%s build %s, %s", build.Image, build.ID, format),
			Metadata:    map[string]string{"image": build.Image, "build": build.ID, "format": format},
			Opts:        &jetstream.ObjectMetaOptions{ChunkSize: chunkSize},
		}, data)
		_ = f.Close()
		if err != nil {
			b.deleteFiles(context.WithoutCancel(ctx), build.Image, build.ID)
			return nil, 0, fmt.Errorf("storing %s in %s: %w", name, FilesBucket, err)
		}
		out[format] = kv.ImageFile{Object: name, Size: int64(info.Size), SHA256: hex.EncodeToString(h.Sum(nil))}
		total += int64(info.Size)
	}
	return out, total, nil
}

// Storing a file: the object store's Put publishes chunks without waiting
// for each to be stored (up to 4000 in flight, 500 MiB of 128 KiB chunks),
// which overruns the server's ingest queue of a stream (128 MiB by default)
// as soon as the disk is slower than the network: the server then drops
// chunks and Put fails with "too many requests". So the file is read only
// as fast as the stream stores it, at most pacingWindow ahead.
const (
	chunkSize     = 128 * 1024
	pacingWindow  = 32 << 20
	pacingEvery   = 8 << 20
	pacingBackoff = 10 * time.Millisecond
)

// pacedReader hands out a file no faster than the object store's stream
// stores it: every pacingEvery bytes it waits until the stream's last
// sequence shows no more than pacingWindow bytes of chunks outstanding.
type pacedReader struct {
	ctx      context.Context
	r        io.Reader
	stream   jetstream.Stream
	startSeq uint64
	read     int64
	checked  int64
}

func (b *Builder) paced(ctx context.Context, r io.Reader) (io.Reader, error) {
	stream, err := b.js.Stream(ctx, "OBJ_"+FilesBucket)
	if err != nil {
		return nil, fmt.Errorf("opening the stream of %s: %w", FilesBucket, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the stream of %s: %w", FilesBucket, err)
	}
	return &pacedReader{ctx: ctx, r: r, stream: stream, startSeq: info.State.LastSeq}, nil
}

func (p *pacedReader) Read(buf []byte) (int, error) {
	if p.read-p.checked >= pacingEvery {
		if err := p.wait(); err != nil {
			return 0, err
		}
		p.checked = p.read
	}
	n, err := p.r.Read(buf)
	p.read += int64(n)
	return n, err
}

// ahead is how many bytes the reader gave out beyond what the stream
// stored. Other files stored at the same time count as ours: the pace is
// then looser, never stuck.
func (p *pacedReader) ahead() (int64, error) {
	info, err := p.stream.Info(p.ctx)
	if err != nil {
		return 0, fmt.Errorf("pacing the storing of an image file: %w", err)
	}
	return p.read - int64(info.State.LastSeq-p.startSeq)*chunkSize, nil
}

func (p *pacedReader) wait() error {
	for {
		ahead, err := p.ahead()
		if err != nil {
			return err
		}
		if ahead <= pacingWindow {
			return nil
		}
		t := time.NewTimer(pacingBackoff)
		select {
		case <-p.ctx.Done():
			t.Stop()
			return p.ctx.Err()
		case <-t.C:
		}
	}
}

// deleteFiles removes every object of a build (those its record names and
// any a crash left behind).
func (b *Builder) deleteFiles(ctx context.Context, image, build string) error {
	infos, err := b.files.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", FilesBucket, err)
	}
	prefix := image + "/" + build + "."
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			continue
		}
		if err := b.files.Delete(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("deleting %s from %s: %w", info.Name, FilesBucket, err)
		}
	}
	return nil
}

// openFile opens a build's file of one format for reading. The object
// store bounds a whole read by its context's deadline (5 s without one),
// so the read gets one that fits the file: an hour, or a second per MiB.
func (b *Builder) openFile(ctx context.Context, file kv.ImageFile) (io.ReadCloser, error) {
	gctx, cancel := context.WithTimeout(ctx, max(time.Hour, time.Duration(file.Size>>20)*time.Second))
	r, err := b.files.Get(gctx, file.Object)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("reading %s from %s: %w", file.Object, FilesBucket, err)
	}
	return &closeCancel{ReadCloser: r, cancel: cancel}, nil
}

// closeCancel ends a read's context when the reader is closed.
type closeCancel struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *closeCancel) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
