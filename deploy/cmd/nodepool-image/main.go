// Command nodepool-image builds nodepool's container image without a
// container engine or a registry: a static nodepool binary (CGO off) on an
// empty base with the files a static Go program needs (a non-root user,
// Mozilla's root certificates from golang.org/x/crypto/x509roots, /tmp),
// written as an image tarball that `docker load`, `podman load`,
// `crane push` and `skopeo copy docker-archive:` take, or as an OCI image
// layout.
//
//	cd deploy && go run ./cmd/nodepool-image --tarball /tmp/nodepool.tar
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The image's layout and user. The user is distroless's "nonroot".
const (
	binaryPath = "/usr/local/bin/nodepool"
	dataDir    = "/var/lib/nodepool"
	configDir  = "/etc/nodepool"
	certsFile  = "/etc/ssl/certs/ca-certificates.crt"
	uid        = 65532
	versionVar = "github.com/nodepool-nats/nodepool/service.Version"
)

type options struct {
	repo      string // the main module, built when binary is empty
	binary    string // a nodepool binary built already
	platform  string // os/arch
	version   string
	tag       string
	tarball   string
	ociLayout string
	created   time.Time
}

func main() {
	var o options
	flag.StringVar(&o.repo, "repo", "..", "the nodepool repository (the main module) to build")
	flag.StringVar(&o.binary, "binary", "", "use this static nodepool binary instead of building one")
	flag.StringVar(&o.platform, "platform", "linux/amd64", "os/arch of the image")
	flag.StringVar(&o.version, "version", "dev", "version stamped into the binary and the image's labels")
	flag.StringVar(&o.tag, "tag", "nodepool:dev", "image name and tag recorded in the tarball or layout")
	flag.StringVar(&o.tarball, "tarball", "", "write the image as a tarball (docker load, podman load, crane push)")
	flag.StringVar(&o.ociLayout, "oci-layout", "", "write the image into this OCI image layout directory")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "nodepool-image: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	o.created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "nodepool-image: SOURCE_DATE_EPOCH %q: expected seconds since 1970\n", s)
			os.Exit(2)
		}
		o.created = time.Unix(sec, 0).UTC()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nodepool-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	if o.tarball == "" && o.ociLayout == "" {
		return errors.New("nothing to write: give --tarball FILE, --oci-layout DIR or both")
	}
	goos, arch, ok := strings.Cut(o.platform, "/")
	if !ok || goos != "linux" || arch == "" || strings.Contains(arch, "/") {
		return fmt.Errorf("--platform %q: expected linux/ARCH, for example linux/amd64 or linux/arm64", o.platform)
	}
	ref, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", o.tag, err)
	}
	bin := o.binary
	if bin == "" {
		dir, err := os.MkdirTemp("", "nodepool-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "nodepool")
		if err := build(ctx, o.repo, bin, arch, o.version); err != nil {
			return err
		}
	}
	if err := checkStatic(bin, arch); err != nil {
		return err
	}
	img, err := image(bin, arch, o)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if o.tarball != "" {
		if err := tarball.WriteToFile(o.tarball, ref, img); err != nil {
			return fmt.Errorf("writing %s: %w", o.tarball, err)
		}
		fmt.Fprintf(out, "wrote %s (%s, %s)\n", o.tarball, ref.Name(), digest)
	}
	if o.ociLayout != "" {
		p, err := layout.FromPath(o.ociLayout)
		if err != nil {
			if p, err = layout.Write(o.ociLayout, empty.Index); err != nil {
				return fmt.Errorf("creating the OCI layout %s: %w", o.ociLayout, err)
			}
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref.TagStr(),
		})); err != nil {
			return fmt.Errorf("writing %s: %w", o.ociLayout, err)
		}
		fmt.Fprintf(out, "wrote %s (%s, %s)\n", o.ociLayout, ref.TagStr(), digest)
	}
	return nil
}

// build compiles cmd/nodepool as ko and the Dockerfile do: CGO off (a
// static binary), -trimpath, the version stamped in.
func build(ctx context.Context, repo, out, arch, version string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X "+versionVar+"="+version, "-o", out, "./cmd/nodepool")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building nodepool in %s (is --repo the repository's root?): %w", repo, err)
	}
	return nil
}

// elfMachines are the architectures the image may be built for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV}

// checkStatic refuses a binary that could not run on the empty base: one
// for another architecture, one linked dynamically (it needs a loader and
// a C library), or one built with cgo.
func checkStatic(path, arch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not a Linux executable: %w", path, err)
	}
	defer f.Close()
	if want, ok := elfMachines[arch]; !ok || f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s", path, f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically (it names a program interpreter); build it with CGO_ENABLED=0", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; build it with CGO_ENABLED=0", path, libs)
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s is not a Go binary with build information: %w", path, err)
	}
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" && s.Value != "0" {
			return fmt.Errorf("%s was built with CGO_ENABLED=%s; build it with CGO_ENABLED=0", path, s.Value)
		}
	}
	return nil
}

// image assembles the image: one layer with the file system, and a config
// that runs `nodepool run` as the non-root user.
func image(bin, arch string, o options) (v1.Image, error) {
	fsTar, err := rootFS(bin, o.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(fsTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "nodepool-image", Comment: "nodepool " + o.version},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: o.created}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", uid, uid),
		Entrypoint: []string{binaryPath},
		Cmd:        []string{"run"},
		WorkingDir: dataDir,
		Env: []string{
			"PATH=/usr/local/bin",
			"HOME=/home/nonroot",
			"SSL_CERT_FILE=" + certsFile,
			"NODEPOOL_CONFIG=" + configDir + "/nodepool.yaml",
			"NODEPOOL_DATA_DIR=" + dataDir,
		},
		ExposedPorts: map[string]struct{}{"8005/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "nodepool",
			"org.opencontainers.image.description": "nodepool on NATS JetStream",
			"org.opencontainers.image.version":     o.version,
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootFS is the image's file system as a tar archive, with fixed times
// and owners so that the same binary gives the same layer.
func rootFS(bin string, created time.Time) ([]byte, error) {
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	certs, err := rootCertificates()
	if err != nil {
		return nil, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)
	type entry struct {
		path     string
		mode     int64
		owner    int
		contents []byte // nil for a directory
	}
	entries := []entry{
		{"etc/", 0o755, 0, nil},
		{"etc/group", 0o644, 0, []byte(group)},
		{"etc/nodepool/", 0o755, 0, nil},
		{"etc/passwd", 0o644, 0, []byte(passwd)},
		{"etc/ssl/", 0o755, 0, nil},
		{"etc/ssl/certs/", 0o755, 0, nil},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, 0, certs},
		{"home/", 0o755, 0, nil},
		{"home/nonroot/", 0o700, uid, nil},
		{"tmp/", 0o1777, 0, nil},
		{"usr/", 0o755, 0, nil},
		{"usr/local/", 0o755, 0, nil},
		{"usr/local/bin/", 0o755, 0, nil},
		{"usr/local/bin/nodepool", 0o755, 0, binary},
		{"var/", 0o755, 0, nil},
		{"var/lib/", 0o755, 0, nil},
		{"var/lib/nodepool/", 0o700, uid, nil},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.path, Mode: e.mode, Uid: e.owner, Gid: e.owner, ModTime: created, Format: tar.FormatPAX}
		if e.contents == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.contents); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// rootCertificates is Mozilla's root store (NSS) as a PEM bundle, taken
// from Go's golang.org/x/crypto/x509roots/fallback/bundle so that the
// image needs nothing from the building host. Roots that NSS trusts only
// with constraints a PEM file cannot carry (a distrust date) are left out.
func rootCertificates() ([]byte, error) {
	var buf bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, fmt.Errorf("a root certificate of the bundle does not parse: %w", err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	if buf.Len() == 0 {
		return nil, errors.New("the root certificate bundle is empty")
	}
	return buf.Bytes(), nil
}
