package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/config"
)

// Every process setting is a flag of `nodepool run`, named in flagNames
// so that the flag overrides the environment.
func TestEverySettingIsAFlag(t *testing.T) {
	t.Parallel()
	run, _, err := newRoot(io.Discard, io.Discard).Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	if err := run.ParseFlags(nil); err != nil { // merges the persistent flags
		t.Fatal(err)
	}
	for f := range reflect.TypeFor[config.Settings]().Fields() {
		if f.Tag.Get("ignored") == "true" {
			continue
		}
		flag, ok := flagNames[f.Name]
		switch {
		case !ok:
			t.Errorf("setting %s (NODEPOOL_%s) has no flag name in flagNames", f.Name, f.Tag.Get("envconfig"))
		case run.Flags().Lookup(flag) == nil:
			t.Errorf("setting %s: --%s is not a flag of run", f.Name, flag)
		}
	}
}

// The failed request age is read from the environment or the flag (which
// wins), and must be positive.
func TestFailedRequestAgeSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"environment", map[string]string{"NODEPOOL_FAILED_REQUEST_AGE": "-2s"}, nil, "NODEPOOL_FAILED_REQUEST_AGE: expected a positive duration, got -2s"},
		{"flag", map[string]string{"NODEPOOL_FAILED_REQUEST_AGE": "-2s"}, []string{"--failed-request-age", "-1s"}, "NODEPOOL_FAILED_REQUEST_AGE: expected a positive duration, got -1s"},
		{"zero", nil, []string{"--failed-request-age", "0s"}, "NODEPOOL_FAILED_REQUEST_AGE: expected a positive duration, got 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"NODEPOOL_HTTP_ADDR": "", "NODEPOOL_DATA_DIR": t.TempDir()}
			for k, v := range tc.env {
				env[k] = v
			}
			_, errOut, code := nodepool(t, env, append([]string{"run"}, tc.args...)...)
			if code == 0 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want an error saying %q", code, errOut, tc.want)
			}
		})
	}
}
