package builder

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/kv"
)

// BenchmarkImageFiles measures the path of an image file through the
// object store: a build storing it (from disk, hashing it on the way) and
// an upload worker reading it back, on an embedded server with file
// storage. The figure (MB/s) bounds how long a multi-GB image spends in
// the store. NODEPOOL_BENCH_IMAGE_MB sets the file's size (default 256):
//
//	NODEPOOL_BENCH_IMAGE_MB=2048 go test -run '^$' -bench ImageFiles -benchtime=2x ./builder
func BenchmarkImageFiles(b *testing.B) {
	size := int64(256 << 20)
	if mb, err := strconv.Atoi(os.Getenv("NODEPOOL_BENCH_IMAGE_MB")); err == nil && mb > 0 {
		size = int64(mb) << 20
	}
	srv := natstest.Start(b)
	_, js := srv.Connect(b)
	obs, err := EnsureFiles(b.Context(), js, 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "image.qcow2")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	_ = f.Close()
	bl := &Builder{js: js, files: obs, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		build := &kv.ImageBuild{Image: "bench", ID: kv.ImageSeqID(uint64(i + 1))}
		files, total, err := bl.storeFiles(b.Context(), build, map[string]string{"qcow2": path})
		if err != nil || total != size {
			b.Fatalf("store: %d bytes, %v", total, err)
		}
		r, err := bl.openFile(b.Context(), files["qcow2"])
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		if n, err := io.Copy(h, r); err != nil || n != size {
			b.Fatalf("read back %d bytes: %v", n, err)
		}
		_ = r.Close()
		if hex.EncodeToString(h.Sum(nil)) != files["qcow2"].SHA256 {
			b.Fatal("the file read back differs from the file stored")
		}
		if err := bl.deleteFiles(b.Context(), build.Image, build.ID); err != nil {
			b.Fatal(err)
		}
	}
}
