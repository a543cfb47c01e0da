package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The product binary links no simulator: neither the clouds on loopback
// nor the in-memory S3 under them (nodepool-devcloud has them).
func TestNoSimulatorInProduct(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "/internal/devcloud") || strings.Contains(pkg, "gofakes3") {
			t.Errorf("nodepool links %s", pkg)
		}
	}
}

// `nodepool dev-cloud` says where the dev clouds went. (The flags would
// have ended the old command at once too: --page-size 0 is refused.)
func TestDevCloudMoved(t *testing.T) {
	t.Parallel()
	_, errOut, code := nodepool(t, nil, "dev-cloud", "aws", "--listen", "127.0.0.1:0", "--page-size", "0")
	if code != 1 || !strings.Contains(errOut, "run nodepool-devcloud with the same arguments") {
		t.Errorf("nodepool dev-cloud: exit %d, %q", code, errOut)
	}
}

var (
	devcloudOnce sync.Once
	devcloudErr  error
)

// buildDevCloud builds nodepool-devcloud beside the nodepool of these
// tests, where `nodepool bench` looks for it.
func buildDevCloud(t *testing.T) {
	t.Helper()
	devcloudOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(binary), "nodepool-devcloud"), "../nodepool-devcloud")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		devcloudErr = cmd.Run()
	})
	if devcloudErr != nil {
		t.Fatalf("building nodepool-devcloud: %v", devcloudErr)
	}
}
