package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const withImages = `
elements-dir: /etc/nodepool/elements
build-log-retention: 3
diskimages:
  - name: base
    abstract: true
    elements: [vm, simple-init]
    release: 12
    env-vars:
      DIB_CHECKSUM: '1'
      TMPDIR: /opt/dib_tmp
    rebuild-age: 3600
    username: admin
  - name: debian
    parent: base
    elements: [debian-minimal]
    release: bookworm
    env-vars:
      TMPDIR: /var/tmp
    formats: [raw]
  - name: debian-big
    parent: debian
    elements: [growroot]
    build-timeout: 90m
    pause: true
    dib-cmd: /usr/local/bin/dib --no-tmpfs
    python-path: /usr/bin/python3
    shell-type: sh
labels:
  - name: debian
  - name: ubuntu
providers:
  - name: cloud1
    driver: fake
    image-format: vhd
    diskimages:
      - name: debian
      - name: debian-big
        pause: true
    pools:
      - name: main
        labels:
          - name: debian
            diskimage: debian
          - name: ubuntu
            cloud-image: ubuntu-noble
  - name: cloud2
    driver: fake
    diskimages: [debian]
    pools:
      - name: main
        labels: [{name: debian, diskimage: debian}]
`

func TestDiskimagesInheritance(t *testing.T) {
	cfg, err := Parse("nodepool.yaml", []byte(withImages))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.DiskimageNames(); !slices.Equal(got, []string{"debian", "debian-big"}) {
		t.Errorf("built images = %v (abstract ones must not be listed)", got)
	}
	deb, _ := cfg.Diskimage("debian")
	big, _ := cfg.Diskimage("debian-big")
	cases := []struct {
		what      string
		got, want any
	}{
		{"elements are added to the parent's", deb.Elements, []string{"vm", "simple-init", "debian-minimal"}},
		{"elements across two generations", big.Elements, []string{"vm", "simple-init", "debian-minimal", "growroot"}},
		{"own release wins", deb.Release, "bookworm"},
		{"release inherited", big.Release, "bookworm"},
		{"env-vars merged, own wins", deb.EnvVars, map[string]string{"DIB_CHECKSUM": "1", "TMPDIR": "/var/tmp"}},
		{"rebuild-age inherited", big.RebuildAge.D(), time.Hour},
		{"username inherited", big.Username, "admin"},
		{"formats inherited", big.Formats, []string{"raw"}},
		{"own build-timeout", big.BuildTimeout.D(), 90 * time.Minute},
		{"default build-timeout", deb.BuildTimeout.D(), DefaultBuildTimeout},
		{"default dib-cmd", deb.DibCmd, DefaultDibCmd},
		{"default python-path", deb.PythonPath, DefaultPythonPath},
		{"own python-path", big.PythonPath, "/usr/bin/python3"},
		{"pause is own", deb.Pause, false},
		{"abstract is not inherited", deb.Abstract, false},
		{"provider image format", cfg.Providers[0].ImageFormat, "vhd"},
		{"default image format", cfg.Providers[1].ImageFormat, DefaultImageFormat},
		{"build-log-retention", *cfg.BuildLogRetention, 3},
		{"provider shorthand", cfg.Providers[1].Diskimages[0].Name, "debian"},
		{"per-provider pause", cfg.Providers[0].Diskimages[1].Pause, true},
		{"pool label diskimage", cfg.Providers[0].Pools[0].Labels[0].Diskimage, "debian"},
		{"environment", cfg.Env(deb), []string{"DIB_CHECKSUM=1", "DIB_RELEASE=bookworm", "ELEMENTS_PATH=/etc/nodepool/elements", "TMPDIR=/var/tmp"}},
	}
	for _, c := range cases {
		if !equal(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	if ps := cfg.ImageProviders("debian"); len(ps) != 2 || ps[0].Name != "cloud1" {
		t.Errorf("providers of debian = %v", ps)
	}
	noImages, err := Parse("nodepool.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if *noImages.BuildLogRetention != DefaultBuildLogRetention {
		t.Errorf("default build-log-retention = %d", *noImages.BuildLogRetention)
	}
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case []string:
		return slices.Equal(a, b.([]string))
	case map[string]string:
		bm := b.(map[string]string)
		if len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			if bm[k] != v {
				return false
			}
		}
		return true
	}
	return a == b
}

func TestDiskimageErrors(t *testing.T) {
	cases := []struct {
		name string
		from string // replaced in withImages
		to   string
		want string
	}{
		{"bad name", "  - name: debian-big\n", "  - name: debian/big\n", `diskimages[2].name: diskimage name "debian/big" is not valid; expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots`},
		{"unknown parent", "parent: debian\n", "parent: ubuntu\n", `diskimages[2].parent: parent "ubuntu" is not defined`},
		{"loop", "    abstract: true\n", "    abstract: true\n    parent: debian-big\n", "inheritance loop: base -> debian-big -> debian -> base"},
		{"unknown format", "formats: [raw]", "formats: [iso]", `diskimages[1].formats[0]: unknown format "iso"; expected one of: qcow2, raw`},
		{"bad env name", "TMPDIR: /var/tmp", "1TMP: /var/tmp", `"1TMP" is not a valid environment variable name`},
		{"quoted dib-cmd", "dib-cmd: /usr/local/bin/dib --no-tmpfs", `dib-cmd: "/usr/local/bin/dib 'a b'"`, "dib-cmd: quoting is not supported"},
		{"env-vars not a mapping", "    env-vars:\n      TMPDIR: /var/tmp\n", "    env-vars: [TMPDIR]\n", "diskimages[1].env-vars: expected a mapping, got a list"},
		{"bad rebuild-age", "rebuild-age: 3600", "rebuild-age: daily", "diskimages[0].rebuild-age: expected a duration"},
		{"unknown diskimage key", "    pause: true\n    dib-cmd", "    paused: true\n    dib-cmd", "diskimages[2].paused: unknown key; did you mean \"pause\"? (expected one of: abstract, build-timeout, delete-after-upload, dib-cmd, elements, env-vars, formats, keep-formats, metadata, name, parent, pause, python-path, rebuild-age, release, shell-type, username"},
		{"provider lists unknown image", "      - name: debian-big\n        pause: true\n", "      - name: centos\n", `providers[0].diskimages[1]: diskimage "centos" is not defined`},
		{"provider lists abstract image", "    diskimages: [debian]\n", "    diskimages: [base]\n", `providers[1].diskimages[0]: diskimage "base" is abstract`},
		{"label image not defined", "            diskimage: debian\n", "            diskimage: centos\n", `providers[0].pools[0].labels[0].diskimage: diskimage "centos" is not defined; expected one of the names under the top-level diskimages`},
		{"diskimage and cloud-image", "            cloud-image: ubuntu-noble\n", "            cloud-image: ubuntu-noble\n            diskimage: debian\n", "a label boots from a diskimage or a cloud-image, not both"},
		{"bad image format", "image-format: vhd", "image-format: iso", `providers[0].image-format: unknown format "iso"`},
		{"bad log retention", "build-log-retention: 3", "build-log-retention: -2", "build-log-retention: expected -1 (keep every log)"},
		{"duplicate image", "  - name: debian-big\n", "  - name: debian\n", `diskimage "debian" is defined twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(withImages, c.from) {
				t.Fatalf("test case does not apply: %q not in the configuration", c.from)
			}
			_, err := Parse("nodepool.yaml", []byte(strings.Replace(withImages, c.from, c.to, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
			if !IsErrors(err) {
				t.Errorf("error is %T, not config.Errors", err)
			}
		})
	}
}

func TestBuilderSettings(t *testing.T) {
	s, err := LoadSettings()
	if err != nil || s.Validate() != nil {
		t.Fatalf("defaults: %v", err)
	}
	if s.BuildWorkers != 1 || s.UploadWorkers != 4 {
		t.Errorf("default workers: %d build, %d upload", s.BuildWorkers, s.UploadWorkers)
	}
	t.Setenv("NODEPOOL_BUILD_WORKERS", "0")
	t.Setenv("NODEPOOL_UPLOAD_WORKERS", "-1")
	s, err = LoadSettings()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "NODEPOOL_BUILD_WORKERS and NODEPOOL_UPLOAD_WORKERS: expected 0 or more, got 0 and -1") {
		t.Errorf("negative upload workers: %v", err)
	}
	t.Setenv("NODEPOOL_UPLOAD_WORKERS", "many")
	if _, err := LoadSettings(); err == nil || !strings.Contains(err.Error(), "UPLOAD_WORKERS") {
		t.Errorf("non-numeric upload workers: %v", err)
	}
}
