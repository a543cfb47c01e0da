package deploy_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var kedaKeys struct {
	once              sync.Once
	allowed, required []string
	err               error
}

// natsJetStreamKeys reads the metadata keys of KEDA's nats-jetstream
// scaler from KEDA's source, at the version go.mod pins: the `keda:"name=..."`
// tags of the struct the scaler decodes its metadata into. A key without
// `optional` or a default is required. (The ScaledObject type keeps
// metadata as a map of strings, so a misspelt key would pass its decoding.)
func natsJetStreamKeys(t *testing.T) (allowed, required []string) {
	t.Helper()
	kedaKeys.once.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-json", "github.com/kedacore/keda/v2").Output()
		if err != nil {
			kedaKeys.err = err
			return
		}
		var mod struct{ Dir string }
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			kedaKeys.err = err
			return
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(mod.Dir, "pkg", "scalers", "nats_jetstream_scaler.go"), nil, parser.SkipObjectResolution)
		if err != nil {
			kedaKeys.err = err
			return
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "natsJetStreamMetadata" {
				return true
			}
			for _, fld := range ts.Type.(*ast.StructType).Fields.List {
				if fld.Tag == nil {
					continue
				}
				raw, _ := strconv.Unquote(fld.Tag.Value)
				tag := reflect.StructTag(raw).Get("keda")
				var name string
				optional := false
				for _, part := range strings.Split(tag, ",") {
					part = strings.TrimSpace(part)
					switch {
					case strings.HasPrefix(part, "name="):
						name = strings.TrimPrefix(part, "name=")
					case part == "optional", strings.HasPrefix(part, "default="):
						optional = true
					}
				}
				if name == "" {
					continue
				}
				kedaKeys.allowed = append(kedaKeys.allowed, name)
				if !optional {
					kedaKeys.required = append(kedaKeys.required, name)
				}
			}
			return false
		})
	})
	if kedaKeys.err != nil || len(kedaKeys.allowed) == 0 {
		t.Fatalf("reading the nats-jetstream scaler's keys from KEDA's source: %v (found %v)", kedaKeys.err, kedaKeys.allowed)
	}
	return kedaKeys.allowed, kedaKeys.required
}

func TestNatsJetStreamKeys(t *testing.T) {
	allowed, required := natsJetStreamKeys(t)
	for _, k := range []string{"natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"} {
		if !strings.Contains(strings.Join(allowed, " "), k) {
			t.Errorf("KEDA's nats-jetstream scaler has no key %s any more: %v", k, allowed)
		}
	}
	t.Logf("keys %v, required %v", allowed, required)
}
