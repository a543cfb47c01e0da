package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// standIn builds a small Go program in place of nodepool (building the
// real one takes minutes; `go run ./cmd/nodepool-image` does that), with
// the given environment.
func standIn(t *testing.T, env ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod":  "module standin\n\ngo 1.22\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"nodepool stand-in\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", "standin", ".")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false"), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in: %v\n%s", err, out)
	}
	return filepath.Join(dir, "standin")
}

// The image runs the binary as a non-root user, with `run` as its
// command, and holds what a static binary needs; the same binary gives
// the same image, in the tarball and in the OCI layout.
func TestImage(t *testing.T) {
	bin := standIn(t, "CGO_ENABLED=0")
	dir := t.TempDir()
	o := options{binary: bin, platform: "linux/amd64", version: "v1.2.3", tag: "registry.example.com/nodepool:v1.2.3",
		tarball: filepath.Join(dir, "nodepool.tar"), ociLayout: filepath.Join(dir, "layout"), created: time.Unix(0, 0).UTC()}
	var out bytes.Buffer
	if err := run(t.Context(), o, &out); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(o.tarball, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{binaryPath}) || !slices.Equal(c.Cmd, []string{"run"}) {
		t.Errorf("config: user %q, entrypoint %q, cmd %q; want a non-root user running %s run", c.User, c.Entrypoint, c.Cmd, binaryPath)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || c.Labels["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("config: %s/%s, labels %v", cf.OS, cf.Architecture, c.Labels)
	}
	if !slices.Contains(c.Env, "NODEPOOL_DATA_DIR="+dataDir) {
		t.Errorf("env %v does not set the data dir", c.Env)
	}

	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(h.Name)
		files[name] = h
		contents[name], _ = io.ReadAll(tr)
	}
	want, _ := os.ReadFile(bin)
	if h := files["usr/local/bin/nodepool"]; h == nil || h.Mode != 0o755 || !bytes.Equal(contents["usr/local/bin/nodepool"], want) {
		t.Errorf("the binary is not at %s, executable", binaryPath)
	}
	if !strings.Contains(string(contents["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user:\n%s", contents["etc/passwd"])
	}
	if h := files["var/lib/nodepool"]; h == nil || h.Uid != 65532 {
		t.Errorf("the data dir is not the non-root user's")
	}
	if h := files["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp is missing or not writable by all")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(contents["etc/ssl/certs/ca-certificates.crt"]) || bytes.Count(contents["etc/ssl/certs/ca-certificates.crt"], []byte("BEGIN CERTIFICATE")) < 100 {
		t.Errorf("no root certificates in %s", certsFile)
	}

	// The OCI layout holds the same image (its config and layer), named
	// by its tag. (A tarball keeps no manifest: the one read back is
	// made anew, so manifests are not compared.)
	idx, err := layout.ImageIndexFromPath(o.ociLayout)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.2.3" {
		t.Fatalf("OCI layout index %+v; want one image tagged v1.2.3", m.Manifests)
	}
	fromLayout, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := img.ConfigName()
	c2, _ := fromLayout.ConfigName()
	l1, _ := img.Layers()
	l2, _ := fromLayout.Layers()
	if c1 != c2 || len(l1) != 1 || len(l2) != 1 {
		t.Fatalf("the OCI layout's image (config %s, %d layers) is not the tarball's (config %s, %d layers)", c2, len(l2), c1, len(l1))
	}
	ld1, _ := l1[0].Digest()
	ld2, _ := l2[0].Digest()
	if ld1 != ld2 {
		t.Errorf("the layers differ: %s and %s", ld1, ld2)
	}

	// Reproducible: the same inputs give the same digest.
	o.tarball, o.ociLayout = filepath.Join(dir, "again.tar"), ""
	if err := run(t.Context(), o, &out); err != nil {
		t.Fatal(err)
	}
	again, err := tarball.ImageFromPath(o.tarball, nil)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	if d2, _ := again.Digest(); d1 != d2 {
		t.Errorf("two builds of one binary differ: %s and %s", d1, d2)
	}
}

// What would not run on the empty base, or asks for nothing, is refused
// with the reason.
func TestImageRefuses(t *testing.T) {
	dir := t.TempDir()
	static := standIn(t, "CGO_ENABLED=0")
	for _, tc := range []struct {
		name string
		o    options
		want string
	}{
		{"built with cgo", options{binary: standIn(t, "CGO_ENABLED=1"), platform: "linux/amd64"}, "CGO_ENABLED=1"},
		{"another architecture", options{binary: static, platform: "linux/arm64"}, "not arm64"},
		{"not an executable", options{binary: filepath.Join(dir, "x.tar"), platform: "linux/amd64"}, "not a Linux executable"},
		{"not Linux", options{binary: static, platform: "darwin/arm64"}, "expected linux/ARCH"},
		{"no output", options{binary: static, platform: "linux/amd64"}, "nothing to write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.tag = "nodepool:dev"
			if tc.want != "nothing to write" {
				tc.o.tarball = filepath.Join(dir, "x.tar")
			}
			err := run(t.Context(), tc.o, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	// A dynamically linked program of the host, where there is one.
	if _, err := os.Stat("/bin/sh"); err == nil {
		if err := checkStatic("/bin/sh", "amd64"); err == nil || !strings.Contains(err.Error(), "dynamically") && !strings.Contains(err.Error(), "not amd64") {
			t.Errorf("/bin/sh: got %v, want a refusal", err)
		}
	}
}
