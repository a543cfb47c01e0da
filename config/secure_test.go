package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The secure file's env-vars reach the build's environment, but not the
// build log.
func TestSecureEnvIsNotLogged(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "nodepool.yaml")
	secure := filepath.Join(dir, "secure.conf")
	if err := os.WriteFile(main, []byte("diskimages: [{name: d, formats: [raw], env-vars: {A: plain}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secure, []byte("diskimages: [{name: d, env-vars: {TOKEN: s3cret}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadFiles(main, secure)
	if err != nil {
		t.Fatal(err)
	}
	di, _ := cfg.Diskimage("d")
	if env := cfg.Env(di); !slices.Equal(env, []string{"A=plain", "TOKEN=s3cret"}) {
		t.Errorf("build environment = %v", env)
	}
	if env := cfg.LoggedEnv(di); !slices.Equal(env, []string{"A=plain", "TOKEN=<from the secure file>"}) {
		t.Errorf("logged environment = %v", env)
	}
	if cfg.SecureFile != secure {
		t.Errorf("SecureFile = %q", cfg.SecureFile)
	}
}
