package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
)

// stack is this package's Kubernetes API server (internal/k8stest), for
// the tests that apply the manifests to it.
var stack k8stest.Shared

func TestMain(m *testing.M) { os.Exit(stack.Run(m)) }

// kedaCRD is KEDA's ScaledObject CRD at the version go.mod pins, from the
// module's source (config/crd/bases), as KEDA's release installs it.
func kedaCRD(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-json", "github.com/kedacore/keda/v2").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/kedacore/keda/v2: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go list -m github.com/kedacore/keda/v2: %v (%s)", err, out)
	}
	return filepath.Join(mod.Dir, "config", "crd", "bases", "keda.sh_scaledobjects.yaml")
}

// serverNamespace is a namespace of the test's own on the stack, with
// KEDA's ScaledObject CRD installed (server-side apply: installing it
// again changes nothing) and established.
func serverNamespace(t *testing.T) (*k8stest.Stack, string) {
	t.Helper()
	s := stack.Get(t)
	if out, err := s.KubectlOutput(t.Context(), nil, "apply", "--server-side", "--force-conflicts", "-f", kedaCRD(t)); err != nil {
		t.Fatalf("installing KEDA's ScaledObject CRD: %v\n%s", err, out)
	}
	if out, err := s.KubectlOutput(t.Context(), nil, "wait", "--for=condition=Established", "--timeout=60s", "crd/scaledobjects.keda.sh"); err != nil {
		t.Fatalf("waiting for KEDA's ScaledObject CRD: %v\n%s", err, out)
	}
	return s, s.Namespace(t)
}

// applyDryRun renders dir of fsys as `kubectl apply -k` does, moves its
// namespaced objects into ns (the Namespace object itself stays, and is
// created by the dry run only) and applies them with
// `kubectl apply --dry-run=server`: the API server decodes, defaults,
// validates and admits every object, strictly (an unknown field is an
// error), and stores nothing. It returns kubectl's error and output.
func applyDryRun(t *testing.T, s *k8stest.Stack, ns string, fsys filesys.FileSystem, dir string) (string, error) {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	for _, r := range rm.Resources() {
		if r.GetKind() != "Namespace" && r.GetNamespace() != "" {
			if err := r.SetNamespace(ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	y, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.KubectlOutput(t.Context(), y, "apply", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-")
	return string(out), err
}

// TestManifestsOnServer applies every kustomization, and the whole one
// with TLS (the component deploy/tls and nats.conf's tls blocks), to a
// real API server of the Kubernetes release tools/k8s pins, with KEDA's
// CRD: a misspelt field, a wrong API version or kind, or a value the API
// refuses fails it, as `kubectl apply -k` would.
func TestManifestsOnServer(t *testing.T) {
	s, ns := serverNamespace(t)
	variants := map[string]func(filesys.FileSystem){}
	for _, dir := range kustomizations {
		variants[dir] = nil
	}
	variants["tls"] = func(mem filesys.FileSystem) {
		k, _ := mem.ReadFile("kustomization.yaml")
		conf, _ := mem.ReadFile("nats/nats.conf")
		text, _ := uncommentTLS(string(conf))
		if mem.WriteFile("kustomization.yaml", append(k, "components:\n  - tls\n"...)) != nil || mem.WriteFile("nats/nats.conf", []byte(text)) != nil {
			t.Fatal("writing the TLS variant")
		}
	}
	for name, change := range variants {
		t.Run(name, func(t *testing.T) {
			mem := filesys.MakeFsInMemory()
			copyTree(t, ".", mem)
			dir := name
			if change != nil {
				change(mem)
				dir = "."
			}
			out, err := applyDryRun(t, s, ns, mem, dir)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "(server dry run)") {
				t.Errorf("kubectl did not do a server dry run:\n%s", out)
			}
			t.Logf("kubectl apply --dry-run=server:\n%s", out)
		})
	}
}

// TestManifestMistakesOnServer proves that the API server catches what
// the strict decoding of TestManifests cannot (values the API refuses, API
// versions it does not serve) and what it also catches (unknown fields,
// in a CRD's schema too): each case changes one file of an in-memory copy
// of deploy/ and expects kubectl to fail, naming the mistake.
func TestManifestMistakesOnServer(t *testing.T) {
	s, ns := serverNamespace(t)
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"misspelt field", "nodepool/launcher.yaml", "readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		{"misspelt ScaledObject field", "keda/scaledobject.yaml", "minReplicaCount:", "minReplicas:", `unknown field "spec.minReplicas"`},
		{"API version not served", "nats/nats.yaml", "apiVersion: apps/v1", "apiVersion: apps/v1beta2", `no matches for kind "StatefulSet" in version "apps/v1beta2"`},
		{"port out of range", "nats/nats.yaml", "containerPort: 4222", "containerPort: 70000", `must be between 1 and 65535`},
		{"invalid label value", "nodepool/builder.yaml", "app.kubernetes.io/component: builder\n", "app.kubernetes.io/component: builder/images\n", `Invalid value: "builder/images"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := filesys.MakeFsInMemory()
			copyTree(t, ".", mem)
			b, err := mem.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tc.old) {
				t.Fatalf("%s does not contain %q", tc.file, tc.old)
			}
			if err := mem.WriteFile(tc.file, []byte(strings.Replace(string(b), tc.old, tc.new, 1))); err != nil {
				t.Fatal(err)
			}
			out, err := applyDryRun(t, s, ns, mem, ".")
			if err == nil {
				t.Fatalf("kubectl apply --dry-run=server accepted it; want an error mentioning %q:\n%s", tc.want, out)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("kubectl's error does not mention %q: %v", tc.want, err)
			}
		})
	}
}
