package config

import (
	"strings"
	"testing"
)

// kubernetesBase is a valid file with one kubernetes provider; the cases
// below replace part of it.
const kubernetesBase = `
labels: [{name: ns}, {name: pod}]
providers:
  - name: k8s
    driver: kubernetes
    context: admin
    pools:
      - name: main
        labels:
          - name: ns
            type: namespace
          - name: pod
            type: pod
            image: docker.io/fedora:40
`

func TestKubernetesProblems(t *testing.T) {
	for _, tc := range []struct {
		name, old, new string
		err            string // the load fails with this
		warn           string // or loads with this warning
	}{
		{"no type", "            type: namespace\n", "", `providers[0].pools[0].labels[0]: missing required key "type": namespace (an empty namespace) or pod`, ""},
		{"bad type", "type: namespace", "type: vm", `providers[0].pools[0].labels[0].type: expected namespace or pod, got "vm"`, ""},
		{"typo", "            image: docker.io/fedora:40\n", "            imgae: docker.io/fedora:40\n", `providers[0].pools[0].labels[1].imgae: unknown key; did you mean "image"?`, ""},
		{"openstack key", "            image: docker.io/fedora:40\n", "            image: x\n            flavor-name: big\n", "providers[0].pools[0].labels[1].flavor-name: the kubernetes driver has no such key (it is a key of the fake, openstack driver)", ""},
		{"cpu not a number", "            image: docker.io/fedora:40\n", "            image: x\n            cpu: two\n", `providers[0].pools[0].labels[1].cpu: expected an integer, got "two"`, ""},
		{"negative pool limit", "      - name: main\n", "      - name: main\n        max-cores: -1\n", "providers[0].pools[0].max-cores: expected 0 or more, got -1", ""},
		{"negative provider resources", "    context: admin\n", "    context: admin\n    max-resources: {gpu: -2}\n", "providers[0].max-resources.gpu: expected 0 or more, got -2", ""},
		{"env without value", "            image: docker.io/fedora:40\n", "            image: x\n            env: [{name: A}]\n", `providers[0].pools[0].labels[1].env[0]: missing required key "value"`, ""},
		{"spec with pod keys", "            image: docker.io/fedora:40\n", "            image: x\n            spec: {containers: [{name: a, image: b}]}\n", "providers[0].pools[0].labels[1].spec: spec is the whole pod, given to Kubernetes as written, so it excludes image", ""},
		{"spec not a mapping", "            image: docker.io/fedora:40\n", "            spec: [a]\n", "providers[0].pools[0].labels[1].spec: expected a Kubernetes pod spec (a mapping with containers)", ""},
		{"bad dynamic label", "            image: docker.io/fedora:40\n", "            image: x\n            dynamic-labels: {a: \"{request.nope}\"}\n", "providers[0].pools[0].labels[1].dynamic-labels.a:", ""},
		{"max-pods differs from max-servers", "      - name: main\n", "      - name: main\n        max-servers: 2\n        max-pods: 3\n", "providers[0].pools[0].max-pods: 3 differs from max-servers 2: they are one limit", ""},
		{"max-pods", "      - name: main\n", "      - name: main\n        max-pods: 3\n", "", "providers[0].pools[0].max-pods: read as max-servers"},
		{"max-servers on a pool label", "            image: docker.io/fedora:40\n", "            image: x\n            max-servers: 3\n", "providers[0].pools[0].labels[1].max-servers: max-servers is a key of each pool (providers[].pools[]) for the kubernetes driver, not of a pool label: move it there", ""},

		// What Nodepool loads but Kubernetes refuses is a warning that says so.
		{"no image", "            image: docker.io/fedora:40\n", "", "", `pod label "pod" has no image (nor spec): Kubernetes refuses a container without an image`},
		{"limit below request", "            image: docker.io/fedora:40\n", "            image: x\n            cpu: 4\n            cpu-limit: 2\n", "", "providers[0].pools[0].labels[1].cpu-limit: cpu-limit 2 is below the cpu requested (4): Kubernetes refuses a limit below its request"},
		{"default limit below request", "      - name: main\n", "      - name: main\n        default-label-memory: 2048\n        default-label-memory-limit: 1024\n", "", "memory-limit 1024 is below the memory requested (2048)"},
		{"bad pull policy", "            image: docker.io/fedora:40\n", "            image: x\n            image-pull: Sometimes\n", "", `"Sometimes" is not a pull policy (IfNotPresent, Always, Never): Kubernetes refuses it`},
		{"bad label value", "            image: docker.io/fedora:40\n", "            image: x\n            labels: {team: \"a b\"}\n", "", `providers[0].pools[0].labels[1].labels.team: value "a b" is not a Kubernetes label value`},
		{"gpu without resource", "            image: docker.io/fedora:40\n", "            image: x\n            gpu: 1\n", "", "gpu without gpu-resource"},
		{"spec without containers", "            image: docker.io/fedora:40\n", "            spec: {volumes: []}\n", "", "the pod spec has no containers: Kubernetes refuses a pod without containers"},
		{"pod keys on a namespace", "            type: namespace\n", "            type: namespace\n            image: x\n", "", "providers[0].pools[0].labels[0]: image only apply to pod labels; a namespace label ignores them"},
		{"volume without name", "            image: docker.io/fedora:40\n", "            image: x\n            volumes: [{emptyDir: {}}]\n", "", "providers[0].pools[0].labels[1].volumes[0]: not a Kubernetes volume (a mapping with a name)"},
		{"mount without path", "            image: docker.io/fedora:40\n", "            image: x\n            volume-mounts: [{name: v}]\n", "", "providers[0].pools[0].labels[1].volume-mounts[0]: not a Kubernetes volume mount (a mapping with name and mountPath)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(kubernetesBase, tc.old) {
				t.Fatalf("base lacks %q", tc.old)
			}
			data := strings.Replace(kubernetesBase, tc.old, tc.new, 1)
			cfg, err := Decode(Input{File: "nodepool.yaml", Data: []byte(data), Env: []string{}})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("does not load: %v", err)
			}
			if !strings.Contains(cfg.Warnings.Error(), tc.warn) {
				t.Fatalf("warnings %q lack %q", cfg.Warnings.Error(), tc.warn)
			}
		})
	}
}

// A kubernetes provider loads and this build runs it. A driver whose keys
// were read before its launcher was built (kubernetes was) would be
// refused by the service, naming the provider.
func TestKubernetesRunnable(t *testing.T) {
	cfg, err := Decode(Input{File: "nodepool.yaml", Data: []byte(kubernetesBase), Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
	if un := cfg.Unavailable(); len(un) != 0 || cfg.Runnable() != nil {
		t.Fatalf("Unavailable() = %v, Runnable() = %v; want a runnable file", un, cfg.Runnable())
	}
	// Not parallel: no test that reads the drivers runs meanwhile.
	saved := driverSpecs["kubernetes"]
	t.Cleanup(func() { driverSpecs["kubernetes"] = saved })
	readOnly := saved
	readOnly.available, readOnly.readable, readOnly.missing = false, true, "is not available in this build yet"
	driverSpecs["kubernetes"] = readOnly
	cfg, err = Decode(Input{File: "nodepool.yaml", Data: []byte(kubernetesBase), Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if un := cfg.Unavailable(); len(un) != 1 || un[0].Name != "k8s" {
		t.Fatalf("Unavailable() = %v, want provider k8s", un)
	}
	if err := cfg.Runnable(); err == nil || !strings.Contains(err.Error(), "provider k8s: driver kubernetes: configuration valid; the driver is not available in this build yet") {
		t.Fatalf("Runnable() = %v", err)
	}
}

// A spec is kept as written, for Kubernetes; the pool's defaults do not
// apply to it.
func TestKubernetesSpec(t *testing.T) {
	data := strings.Replace(kubernetesBase, "            image: docker.io/fedora:40\n",
		"            spec:\n              containers:\n                - name: c\n                  image: ubuntu:jammy\n                  args: [\"sleep\", \"infinity\"]\n", 1)
	data = strings.Replace(data, "      - name: main\n", "      - name: main\n        default-label-cpu: 2\n", 1)
	cfg, err := Decode(Input{File: "nodepool.yaml", Data: []byte(data), Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	kl := cfg.Providers[0].Pools[0].Labels[1].KubernetesLabel
	cs, _ := kl.Spec.Mapping()["containers"].([]any)
	if len(cs) != 1 {
		t.Fatalf("spec = %#v", kl.Spec.Value)
	}
	c, _ := cs[0].(map[string]any)
	if c["image"] != "ubuntu:jammy" || len(c["args"].([]any)) != 2 {
		t.Errorf("container = %#v", c)
	}
	if kl.CPU != 0 || kl.ImagePull != "" {
		t.Errorf("defaults applied to a spec: cpu %d, image-pull %q", kl.CPU, kl.ImagePull)
	}
}

// max-pods (the openshiftpods driver's name of the limit, which files
// written for it carry) limits a kubernetes pool as max-servers does.
func TestKubernetesMaxPods(t *testing.T) {
	data := strings.Replace(kubernetesBase, "      - name: main\n", "      - name: main\n        max-pods: 3\n", 1)
	cfg, err := Decode(Input{File: "nodepool.yaml", Data: []byte(data), Env: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Providers[0].Pools[0].MaxServers; got != 3 {
		t.Fatalf("max-servers of a pool with max-pods 3: %d", got)
	}
}
