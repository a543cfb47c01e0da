package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The kubernetes driver's keys, as kubernetes.rst gives them; the driver
// is drivers/kubernetes.

// Defaults of the kubernetes driver's label keys.
const (
	DefaultKubernetesImagePull  = "IfNotPresent"
	DefaultKubernetesPythonPath = "auto"
)

// Kubernetes value sets.
var (
	KubernetesLabelTypes = []string{"namespace", "pod"}
	KubernetesImagePulls = []string{"IfNotPresent", "Always", "Never"}
	// A Kubernetes label value, or the name part of a key: 63 characters
	// at most, alphanumerics at both ends, - _ . between.
	kubeLabelNameRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	// The prefix of a label key: a DNS subdomain.
	kubePrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// KubernetesProvider holds the keys only a kubernetes provider has.
type KubernetesProvider struct {
	// Context names the kube/config context; "" uses the in-cluster
	// service account.
	Context string `yaml:"context" drivers:"kubernetes"`
	// The provider's limits are the defaults of its pools' (absent:
	// unlimited).
	KubeMaxServers   int                `yaml:"max-servers" drivers:"kubernetes"`
	KubeMaxCores     int                `yaml:"max-cores" drivers:"kubernetes"`
	KubeMaxRAM       int                `yaml:"max-ram" drivers:"kubernetes"`
	KubeMaxResources map[string]float64 `yaml:"max-resources" drivers:"kubernetes"`
}

// KubernetesPool holds the keys only a kubernetes pool has: its other
// limits and the defaults of its pod labels' resources.
type KubernetesPool struct {
	PoolMaxResources map[string]float64 `yaml:"max-resources" drivers:"kubernetes"`
	// MaxPods is max-servers under the name Nodepool's openshiftpods
	// driver (and files written for it) give it: the pods (or
	// namespaces) the pool keeps at most. Read into MaxServers.
	MaxPods int `yaml:"max-pods" drivers:"kubernetes"`
	// The defaults of the pool's pod labels that set none (cpu in cores,
	// memory in MiB, storage in MB).
	DefaultLabelCPU            int                `yaml:"default-label-cpu" drivers:"kubernetes"`
	DefaultLabelMemory         int                `yaml:"default-label-memory" drivers:"kubernetes"`
	DefaultLabelStorage        int                `yaml:"default-label-storage" drivers:"kubernetes"`
	DefaultLabelExtraResources map[string]float64 `yaml:"default-label-extra-resources" drivers:"kubernetes"`
	DefaultLabelCPULimit       int                `yaml:"default-label-cpu-limit" drivers:"kubernetes"`
	DefaultLabelMemoryLimit    int                `yaml:"default-label-memory-limit" drivers:"kubernetes"`
	DefaultLabelStorageLimit   int                `yaml:"default-label-storage-limit" drivers:"kubernetes"`
}

// KubernetesLabel holds the keys of a kubernetes pool's label: a namespace,
// or a pod in a namespace of its own.
type KubernetesLabel struct {
	// Type is namespace or pod.
	Type string `yaml:"type" drivers:"kubernetes"`
	// Image, ImagePull and the resources are a pod's (the pool's
	// default-label-* fill those a pod label does not set).
	Image     string `yaml:"image" drivers:"kubernetes"`
	ImagePull string `yaml:"image-pull" drivers:"kubernetes"`
	// KubeLabels and Annotations are added to the namespace's or pod's
	// metadata; DynamicLabels are format strings of the request
	// ({request.id}...).
	KubeLabels     map[string]string  `yaml:"labels" drivers:"kubernetes"`
	DynamicLabels  map[string]string  `yaml:"dynamic-labels" drivers:"kubernetes"`
	Annotations    map[string]string  `yaml:"annotations" drivers:"kubernetes"`
	KubePythonPath string             `yaml:"python-path" drivers:"kubernetes"`
	KubeShellType  string             `yaml:"shell-type" drivers:"kubernetes"`
	CPU            int                `yaml:"cpu" drivers:"kubernetes"`
	Memory         int                `yaml:"memory" drivers:"kubernetes"`
	Storage        int                `yaml:"storage" drivers:"kubernetes"`
	ExtraResources map[string]float64 `yaml:"extra-resources" drivers:"kubernetes"`
	CPULimit       int                `yaml:"cpu-limit" drivers:"kubernetes"`
	MemoryLimit    int                `yaml:"memory-limit" drivers:"kubernetes"`
	StorageLimit   int                `yaml:"storage-limit" drivers:"kubernetes"`
	GPU            float64            `yaml:"gpu" drivers:"kubernetes"`
	GPUResource    string             `yaml:"gpu-resource" drivers:"kubernetes"`
	Env            []KubernetesEnv    `yaml:"env" drivers:"kubernetes"`
	NodeSelector   map[string]string  `yaml:"node-selector" drivers:"kubernetes"`
	SchedulerName  string             `yaml:"scheduler-name" drivers:"kubernetes"`
	Privileged     *bool              `yaml:"privileged" drivers:"kubernetes"`
	// Volumes and VolumeMounts are Kubernetes definitions, given to
	// Kubernetes as written.
	Volumes      []RawYAML `yaml:"volumes" drivers:"kubernetes"`
	VolumeMounts []RawYAML `yaml:"volume-mounts" drivers:"kubernetes"`
	// Spec is a whole pod spec, given to Kubernetes as written; it
	// excludes the pod keys above.
	Spec *RawYAML `yaml:"spec" drivers:"kubernetes"`
}

// KubernetesEnv is an environment variable of a pod label.
type KubernetesEnv struct {
	Name  string `yaml:"name" required:"true"`
	Value string `yaml:"value" required:"true"`
}

// kubernetesPodKeys are a label's keys that only a pod has and that a
// spec replaces.
var kubernetesPodKeys = []string{"image", "image-pull", "python-path", "shell-type", "cpu", "memory", "storage", "extra-resources",
	"cpu-limit", "memory-limit", "storage-limit", "gpu", "gpu-resource", "env", "node-selector", "scheduler-name", "privileged", "volumes", "volume-mounts"}

// RawYAML is a value given to another system as written (a Kubernetes
// volume, volume mount or pod spec): any YAML, kept as maps, lists and
// scalars.
type RawYAML struct {
	Value any
}

func (r *RawYAML) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if !d.countTree(n, 0) {
		return
	}
	var v any
	if err := n.Decode(&v); err != nil {
		d.fail(path, n, "not a value Kubernetes can read: %v", err)
		return
	}
	r.Value = v
}

// countTree charges every node of a tree (aliases expanded) to the node
// budget; false once it is spent.
func (d *decoder) countTree(n *yaml.Node, depth int) bool {
	if depth > 100 {
		d.fail("", n, "values nested more than 100 deep; expected a configuration")
		return false
	}
	n = resolveAlias(n)
	if n == nil || !d.count() {
		return false
	}
	for _, c := range n.Content {
		if !d.countTree(c, depth+1) {
			return false
		}
	}
	return true
}

// Mapping returns the value as a mapping (nil if it is none).
func (r *RawYAML) Mapping() map[string]any {
	if r == nil {
		return nil
	}
	m, _ := r.Value.(map[string]any)
	return m
}

func kubernetesDefaults(p *Provider) {
	kp := &p.KubernetesProvider
	for j := range p.Pools {
		pool := &p.Pools[j]
		if !pool.set["max-servers"] && pool.set["max-pods"] {
			pool.MaxServers = pool.MaxPods
			pool.set["max-servers"] = true
		}
		if !pool.set["max-servers"] && p.set["max-servers"] {
			pool.MaxServers = kp.KubeMaxServers
		}
		if !pool.set["max-cores"] && p.set["max-cores"] {
			pool.MaxCores = kp.KubeMaxCores
		}
		if !pool.set["max-ram"] && p.set["max-ram"] {
			pool.MaxRAM = kp.KubeMaxRAM
		}
		// As Nodepool: the provider's max-resources, updated by the pool's.
		if kp.KubeMaxResources != nil {
			merged := cloneFloats(kp.KubeMaxResources)
			for k, v := range pool.PoolMaxResources {
				merged[k] = v
			}
			pool.PoolMaxResources = merged
		}
		kpool := &pool.KubernetesPool
		for i := range pool.Labels {
			pl := &pool.Labels[i]
			kl := &pl.KubernetesLabel
			if kl.KubePythonPath == "" {
				kl.KubePythonPath = DefaultKubernetesPythonPath
			}
			if kl.KubeShellType == "" {
				kl.KubeShellType = DefaultShellType
			}
			if kl.Type != "pod" || kl.Spec != nil {
				continue // a spec is given as written, defaults and all
			}
			if kl.ImagePull == "" {
				kl.ImagePull = DefaultKubernetesImagePull
			}
			for _, r := range []struct {
				key       string
				val       *int
				def       int
				limitKey  string
				limit     *int
				defaultOf int
			}{
				{"cpu", &kl.CPU, kpool.DefaultLabelCPU, "cpu-limit", &kl.CPULimit, kpool.DefaultLabelCPULimit},
				{"memory", &kl.Memory, kpool.DefaultLabelMemory, "memory-limit", &kl.MemoryLimit, kpool.DefaultLabelMemoryLimit},
				{"storage", &kl.Storage, kpool.DefaultLabelStorage, "storage-limit", &kl.StorageLimit, kpool.DefaultLabelStorageLimit},
			} {
				if !pl.set[r.key] {
					*r.val = r.def
				}
				// As Nodepool: the label's limit, else the pool's
				// default limit, else the request (the label's or the
				// pool's default).
				if !pl.set[r.limitKey] {
					*r.limit = *r.val
					if pool.set["default-label-"+r.limitKey] {
						*r.limit = r.defaultOf
					}
				}
			}
			// As Nodepool: the pool's default-label-extra-resources,
			// updated by the label's extra-resources.
			if kpool.DefaultLabelExtraResources != nil {
				merged := cloneFloats(kpool.DefaultLabelExtraResources)
				for k, v := range kl.ExtraResources {
					merged[k] = v
				}
				kl.ExtraResources = merged
			}
		}
	}
}

func cloneFloats(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// validateKubernetes checks a kubernetes provider. What Nodepool refuses
// is an error; what Nodepool loads but Kubernetes would refuse (a pod
// without an image, a limit below its request, a bad label value) is a
// warning that says so.
func validateKubernetes(c *Config, v *validation, i int) {
	p := &c.Providers[i]
	kp := &p.KubernetesProvider
	path := indexPath("providers", i)
	at := func(rest ...any) *yaml.Node { return v.at(append([]any{"providers", i}, rest...)...) }
	checkLimits := func(lpath string, lat func(...any) *yaml.Node, servers, cores, ram int, res map[string]float64, set map[string]bool) {
		for _, k := range []struct {
			key string
			val int
		}{{"max-servers", servers}, {"max-cores", cores}, {"max-ram", ram}} {
			if set[k.key] && k.val < 0 {
				v.fail(lpath+"."+k.key, lat(k.key), "expected 0 or more, got %d", k.val)
			}
		}
		for name, n := range res {
			if n < 0 {
				v.fail(lpath+".max-resources."+name, lat("max-resources"), "expected 0 or more, got %g", n)
			}
		}
	}
	checkLimits(path, at, kp.KubeMaxServers, kp.KubeMaxCores, kp.KubeMaxRAM, kp.KubeMaxResources, p.set)
	if strings.ContainsAny(kp.Context, "\n\t") {
		v.fail(path+".context", at("context"), "expected the name of a context of kube/config, got %q", kp.Context)
	}
	for j := range p.Pools {
		pool := &p.Pools[j]
		kpool := &pool.KubernetesPool
		ppath := indexPath(path+".pools", j)
		pat := func(rest ...any) *yaml.Node { return at(append([]any{"pools", j}, rest...)...) }
		checkLimits(ppath, pat, pool.MaxServers, pool.MaxCores, pool.MaxRAM, kpool.PoolMaxResources, pool.set)
		if pool.set["max-pods"] {
			if pool.MaxPods != pool.MaxServers {
				v.fail(ppath+".max-pods", pat("max-pods"), "%d differs from max-servers %d: they are one limit (max-pods is its openshiftpods name); keep max-servers", pool.MaxPods, pool.MaxServers)
			} else {
				v.warn(ppath+".max-pods", pat("max-pods"), "read as max-servers (Nodepool's kubernetes driver spells it so; max-pods is the openshiftpods driver's name)")
			}
		}
		for _, d := range []struct {
			key string
			val int
		}{{"default-label-cpu", kpool.DefaultLabelCPU}, {"default-label-memory", kpool.DefaultLabelMemory}, {"default-label-storage", kpool.DefaultLabelStorage},
			{"default-label-cpu-limit", kpool.DefaultLabelCPULimit}, {"default-label-memory-limit", kpool.DefaultLabelMemoryLimit}, {"default-label-storage-limit", kpool.DefaultLabelStorageLimit}} {
			if d.val < 0 {
				v.warn(ppath+"."+d.key, pat(d.key), "%d is below 0: Kubernetes refuses a negative quantity, so the launches of the pod labels that take this default fail", d.val)
			}
		}
		for k := range pool.Labels {
			validateKubernetesLabel(v, &pool.Labels[k], indexPath(ppath+".labels", k), func(rest ...any) *yaml.Node { return pat(append([]any{"labels", k}, rest...)...) })
		}
	}
}

func validateKubernetesLabel(v *validation, pl *PoolLabel, lpath string, lat func(...any) *yaml.Node) {
	kl := &pl.KubernetesLabel
	switch {
	case kl.Type == "":
		v.fail(lpath, lat(), "missing required key \"type\": namespace (an empty namespace) or pod (a pod in a namespace of its own)")
	case !slices.Contains(KubernetesLabelTypes, kl.Type):
		v.fail(lpath+".type", lat("type"), "expected namespace or pod, got %q", kl.Type)
	}
	var podKeys []string
	for _, k := range kubernetesPodKeys {
		if pl.set[k] {
			podKeys = append(podKeys, k)
		}
	}
	switch {
	case kl.Spec != nil:
		if len(podKeys) > 0 {
			v.fail(lpath+".spec", lat("spec"), "spec is the whole pod, given to Kubernetes as written, so it excludes %s (as in Nodepool); keep spec alone or drop it", joinAnd(podKeys))
		}
		if kl.Type == "namespace" {
			v.warn(lpath+".spec", lat("spec"), "a namespace label has no pod, so it ignores spec (for type pod)")
		}
		m := kl.Spec.Mapping()
		if m == nil {
			v.fail(lpath+".spec", lat("spec"), "expected a Kubernetes pod spec (a mapping with containers)")
		} else if cs, _ := m["containers"].([]any); len(cs) == 0 {
			v.warn(lpath+".spec", lat("spec"), "the pod spec has no containers: Kubernetes refuses a pod without containers, so every launch of label %q fails; the first container hosts the shell jobs run commands in", pl.Name)
		}
	case kl.Type == "namespace":
		if len(podKeys) > 0 {
			v.warn(lpath, lat(), "%s only apply to pod labels; a namespace label ignores them", joinAnd(podKeys))
		}
	case kl.Type == "pod":
		if strings.TrimSpace(kl.Image) == "" {
			v.warn(lpath, lat(), "pod label %q has no image (nor spec): Kubernetes refuses a container without an image unless an admission webhook of the cluster sets one, so its launches fail otherwise (Nodepool loads it too)", pl.Name)
		}
		if !slices.Contains(KubernetesImagePulls, kl.ImagePull) {
			v.warn(lpath+".image-pull", lat("image-pull"), "%q is not a pull policy (%s): Kubernetes refuses it, so every launch of label %q fails", kl.ImagePull, strings.Join(KubernetesImagePulls, ", "), pl.Name)
		}
	}
	for _, r := range []struct {
		key, limitKey string
		val, limit    int
	}{{"cpu", "cpu-limit", kl.CPU, kl.CPULimit}, {"memory", "memory-limit", kl.Memory, kl.MemoryLimit}, {"storage", "storage-limit", kl.Storage, kl.StorageLimit}} {
		if r.val < 0 {
			v.warn(lpath+"."+r.key, lat(r.key), "%d is below 0: Kubernetes refuses a negative quantity, so every launch of label %q fails", r.val, pl.Name)
		}
		if r.limit < 0 {
			v.warn(lpath+"."+r.limitKey, lat(r.limitKey), "%d is below 0: Kubernetes refuses a negative quantity, so every launch of label %q fails", r.limit, pl.Name)
		}
		if r.limit > 0 && r.val > r.limit {
			v.warn(lpath+"."+r.limitKey, lat(r.limitKey), "%s %d is below the %s requested (%d): Kubernetes refuses a limit below its request, so every launch of label %q fails", r.limitKey, r.limit, r.key, r.val, pl.Name)
		}
	}
	for name, n := range kl.ExtraResources {
		if n < 0 {
			v.warn(lpath+".extra-resources."+name, lat("extra-resources"), "%g is below 0: Kubernetes refuses a negative quantity, so every launch of label %q fails", n, pl.Name)
		}
	}
	switch {
	case kl.GPU < 0:
		v.warn(lpath+".gpu", lat("gpu"), "%g is below 0: Kubernetes refuses a negative quantity, so every launch of label %q fails", kl.GPU, pl.Name)
	case kl.GPU > 0 && kl.GPUResource == "":
		v.warn(lpath+".gpu", lat("gpu"), "gpu without gpu-resource (the cluster's resource name of its GPUs, such as nvidia.com/gpu) names no resource to request, so Kubernetes refuses the launches of label %q", pl.Name)
	}
	for k, e := range kl.Env {
		if !envNameRE.MatchString(e.Name) && e.Name != "" {
			v.warn(indexPath(lpath+".env", k)+".name", lat("env", k, "name"), "%q is not a portable environment variable name (A-Z a-z 0-9 _, not starting with a digit)", e.Name)
		}
	}
	checkKubeLabels := func(key string, m map[string]string) {
		for k, val := range m {
			if err := kubeLabelProblem(k, val); err != "" {
				v.warn(lpath+"."+key+"."+k, lat(key), "%s: Kubernetes refuses it, so every launch of label %q fails", err, pl.Name)
			}
		}
	}
	checkKubeLabels("labels", kl.KubeLabels)
	checkKubeLabels("node-selector", kl.NodeSelector)
	for key, tmpl := range kl.DynamicLabels {
		if _, err := ExpandRequestTemplate(tmpl, func(string, string) (string, bool) { return "", true }); err != nil {
			v.fail(lpath+".dynamic-labels."+key, lat("dynamic-labels"), "%v", err)
		}
	}
	for k, vol := range kl.Volumes {
		if m := vol.Mapping(); m == nil || m["name"] == nil {
			v.warn(indexPath(lpath+".volumes", k), lat("volumes", k), "not a Kubernetes volume (a mapping with a name): Kubernetes refuses it, so every launch of label %q fails", pl.Name)
		}
	}
	for k, vm := range kl.VolumeMounts {
		if m := vm.Mapping(); m == nil || m["name"] == nil || m["mountPath"] == nil {
			v.warn(indexPath(lpath+".volume-mounts", k), lat("volume-mounts", k), "not a Kubernetes volume mount (a mapping with name and mountPath): Kubernetes refuses it, so every launch of label %q fails", pl.Name)
		}
	}
}

// kubeLabelProblem says what is wrong with a Kubernetes label ("" if
// nothing).
func kubeLabelProblem(key, val string) string {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if len(prefix) > 253 || !kubePrefixRE.MatchString(prefix) {
			return fmt.Sprintf("the prefix of key %q is not a DNS subdomain", key)
		}
		name = rest
	}
	if name == "" || len(name) > 63 || !kubeLabelNameRE.MatchString(name) {
		return fmt.Sprintf("key %q is not a Kubernetes label name (1 to 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)", key)
	}
	if len(val) > 63 || !kubeLabelNameRE.MatchString(val) {
		return fmt.Sprintf("value %q is not a Kubernetes label value (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)", val)
	}
	return ""
}
