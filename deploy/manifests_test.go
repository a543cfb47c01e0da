package deploy_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/natstest"
)

// The kustomizations kubectl applies: the whole deployment and each part
// on its own.
var kustomizations = []string{".", "nats", "nodepool", "keda"}

// TestManifests renders every kustomization as `kubectl apply -k` does,
// decodes every object strictly into its API type (an unknown or misspelt
// field, or one given twice, is an error) and checks that the parts fit
// together: probes, process settings, Services, PodDisruptionBudgets, the
// KEDA trigger, nats.conf and nodepool.yaml.
func TestManifests(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			for _, err := range validate(t, filesys.MakeFsOnDisk(), dir) {
				t.Error(err)
			}
		})
	}
}

// TestManifestsWithTLS renders the deployment with the component deploy/tls
// and nats.conf's tls blocks uncommented, as docs/deployment.md says, and
// checks it as TestManifests does; either half alone is an error.
func TestManifestsWithTLS(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		component, uncomment bool
		want                 string
	}{
		{"both", true, true, ""},
		{"component only", true, false, "nats.conf does not use TLS"},
		{"nats.conf only", false, true, "NODEPOOL_NATS_TLS_CA, _CERT and _KEY are not all set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := filesys.MakeFsInMemory()
			copyTree(t, ".", mem)
			if tc.component {
				k, _ := mem.ReadFile("kustomization.yaml")
				if err := mem.WriteFile("kustomization.yaml", append(k, "components:\n  - tls\n"...)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.uncomment {
				conf, _ := mem.ReadFile("nats/nats.conf")
				text, blocks := uncommentTLS(string(conf))
				if blocks != 2 {
					t.Fatalf("nats.conf has %d commented tls blocks; want 2", blocks)
				}
				if err := mem.WriteFile("nats/nats.conf", []byte(text)); err != nil {
					t.Fatal(err)
				}
			}
			errs := validate(t, mem, ".")
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Error(errors.Join(errs...))
			case tc.want != "" && !strings.Contains(errors.Join(errs...).Error(), tc.want):
				t.Errorf("errors do not mention %q:\n%v", tc.want, errors.Join(errs...))
			}
		})
	}
}

// uncommentTLS uncomments nats.conf's tls blocks, as an operator does.
func uncommentTLS(text string) (string, int) {
	lines := strings.Split(text, "\n")
	blocks, in := 0, false
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if trimmed == "# tls {" {
			in = true
			blocks++
		}
		if in {
			lines[i] = strings.Replace(l, "# ", "", 1)
		}
		if trimmed == "# }" {
			in = false
		}
	}
	return strings.Join(lines, "\n"), blocks
}

// TestManifestMistakes proves that the check catches mistakes: each case
// changes one file of an in-memory copy of deploy/ and expects an error.
func TestManifestMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"misspelt field", "nodepool/launcher.yaml", "readinessProbe:", "readinesProbe:", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		{"field in the wrong case", "nats/nats.yaml", "podManagementPolicy:", "PodManagementPolicy:", `unknown field "spec.PodManagementPolicy"`},
		{"duplicate field", "nodepool/builder.yaml", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `replicas`},
		{"misspelt ScaledObject field", "keda/scaledobject.yaml", "minReplicaCount:", "minReplicas:", `unknown field "spec.minReplicas"`},
		{"misspelt trigger metadata key", "keda/scaledobject.yaml", "lagThreshold: \"100\"", "lagTreshold: \"100\"", `unknown metadata key "lagTreshold"`},
		{"wrong consumer", "keda/scaledobject.yaml", "consumer: intake", "consumer: intakes", `consumer "intakes"`},
		{"wrong monitoring port", "keda/scaledobject.yaml", "svc.cluster.local:8222", "svc.cluster.local:4222", `no port 4222 named monitor`},
		{"misspelt process setting", "nodepool/launcher.yaml", "name: NODEPOOL_REPLICAS", "name: NODEPOOL_REPLICA", `NODEPOOL_REPLICA is not a process setting`},
		{"bad setting value", "nodepool/builder.yaml", "value: builder\n", "value: builders\n", `unknown role "builders"`},
		{"single replica", "nodepool/builder.yaml", "  replicas: 2\n", "  replicas: 1\n", `more than one replica`},
		{"wrong probe path", "nodepool/launcher.yaml", "path: /ready", "path: /readyz", `readiness probe`},
		{"PDB selecting nothing", "nodepool/launcher.yaml", "maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: nodepool\n      app.kubernetes.io/component: launcher", "maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: nodepool\n      app.kubernetes.io/component: launch", `selects no pods`},
		{"route to a Service that is not there", "nats/nats.yaml", "name: nats-3\n", "name: nats-three\n", `nats-3`},
		{"bad nats.conf", "nats/nats.conf", "max_payload: 1MB", "max_payload: {", `nats.conf`},
		{"bad nodepool.yaml", "nodepool/nodepool.yaml", "max-servers: 20", "max-server: 20", `max-server`},
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
			errs := validate(t, mem, ".")
			if len(errs) == 0 {
				t.Fatalf("no error; want one mentioning %q", tc.want)
			}
			t.Log(errors.Join(errs...))
			if !strings.Contains(errors.Join(errs...).Error(), tc.want) {
				t.Errorf("errors do not mention %q:\n%v", tc.want, errors.Join(errs...))
			}
		})
	}
}

// copyTree copies the kustomization's files into an in-memory file system
// at the same relative paths.
func copyTree(t *testing.T, root string, mem filesys.FileSystem) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".conf" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile(path, b)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// objects are the decoded objects of one rendered kustomization.
type objects struct {
	namespaces   []*corev1.Namespace
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	pdbs         []*policyv1.PodDisruptionBudget
	scaled       []*kedav1alpha1.ScaledObject
}

// decodeStrictly decodes one object the way the API server's strict field
// validation does: case-sensitive, no unknown fields, no duplicates.
func decodeStrictly(y []byte, into any) error {
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		return err
	}
	strict, err := json.UnmarshalStrict(j, into, json.DisallowDuplicateFields, json.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// render builds a kustomization and decodes each object into its type; a
// kind the test does not know is an error, so a new kind gets a type.
func render(fsys filesys.FileSystem, dir string) (*objects, []error) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, []error{fmt.Errorf("kustomize build %s: %w", dir, err)}
	}
	o := &objects{}
	var errs []error
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(y, &tm); err != nil {
			errs = append(errs, err)
			continue
		}
		var into any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			v := &corev1.Namespace{}
			o.namespaces, into = append(o.namespaces, v), v
		case "v1 Service":
			v := &corev1.Service{}
			o.services, into = append(o.services, v), v
		case "v1 ConfigMap":
			v := &corev1.ConfigMap{}
			o.configMaps, into = append(o.configMaps, v), v
		case "apps/v1 StatefulSet":
			v := &appsv1.StatefulSet{}
			o.statefulSets, into = append(o.statefulSets, v), v
		case "apps/v1 Deployment":
			v := &appsv1.Deployment{}
			o.deployments, into = append(o.deployments, v), v
		case "policy/v1 PodDisruptionBudget":
			v := &policyv1.PodDisruptionBudget{}
			o.pdbs, into = append(o.pdbs, v), v
		case "keda.sh/v1alpha1 ScaledObject":
			v := &kedav1alpha1.ScaledObject{}
			o.scaled, into = append(o.scaled, v), v
		default:
			errs = append(errs, fmt.Errorf("%s %s %s: a kind this test does not decode; add its type", tm.APIVersion, tm.Kind, r.GetName()))
			continue
		}
		if err := decodeStrictly(y, into); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", tm.Kind, r.GetName(), err))
		}
	}
	return o, errs
}

// validate renders dir and checks what it finds; it returns every problem.
func validate(t *testing.T, fsys filesys.FileSystem, dir string) []error {
	o, errs := render(fsys, dir)
	if o == nil || len(errs) > 0 {
		return errs
	}
	c := &checker{t: t, o: o}
	for _, ns := range o.namespaces {
		c.expect(ns.Name == "nodepool", "Namespace %s: the manifests and the KEDA endpoint say nodepool", ns.Name)
	}
	for _, s := range o.statefulSets {
		c.natsStatefulSet(s)
	}
	for _, d := range o.deployments {
		c.nodepoolDeployment(d)
	}
	for _, p := range o.pdbs {
		c.expect(c.selectsPods(p.Spec.Selector), "PodDisruptionBudget %s selects no pods", p.Name)
		c.expect(p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.IntValue() == 1, "PodDisruptionBudget %s: expected maxUnavailable 1", p.Name)
	}
	for _, s := range o.services {
		c.service(s)
	}
	for _, so := range o.scaled {
		c.scaledObject(so)
	}
	// Each workload of the full deployment has a PodDisruptionBudget.
	if dir == "." {
		c.expect(len(o.deployments) == 2 && len(o.statefulSets) == 1 && len(o.scaled) == 1, "expected a launcher and a builder Deployment, a NATS StatefulSet and a ScaledObject")
		for _, w := range c.podTemplates() {
			covered := false
			for _, p := range o.pdbs {
				sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
				covered = covered || err == nil && sel.Matches(labels.Set(w.labels))
			}
			c.expect(covered, "%s has no PodDisruptionBudget", w.name)
		}
	}
	return c.errs
}

type checker struct {
	t    *testing.T
	o    *objects
	errs []error

	natsOnce sync.Once
	natsOpts *server.Options
	natsText string
}

func (c *checker) expect(ok bool, format string, args ...any) {
	if !ok {
		c.errs = append(c.errs, fmt.Errorf(format, args...))
	}
}

type podTemplate struct {
	name   string
	labels map[string]string
	spec   *corev1.PodSpec
}

func (c *checker) podTemplates() []podTemplate {
	var out []podTemplate
	for _, s := range c.o.statefulSets {
		out = append(out, podTemplate{"StatefulSet " + s.Name, s.Spec.Template.Labels, &s.Spec.Template.Spec})
	}
	for _, d := range c.o.deployments {
		out = append(out, podTemplate{"Deployment " + d.Name, d.Spec.Template.Labels, &d.Spec.Template.Spec})
	}
	return out
}

func (c *checker) selectsPods(ls *metav1.LabelSelector) bool {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil || sel.Empty() {
		return false
	}
	for _, w := range c.podTemplates() {
		if sel.Matches(labels.Set(w.labels)) {
			return true
		}
	}
	return false
}

// natsPodLabels are the labels of the NATS StatefulSet's pod number n, as
// the StatefulSet controller sets them.
func (c *checker) natsPods() map[string]map[string]string {
	pods := map[string]map[string]string{}
	for _, s := range c.o.statefulSets {
		start := int32(0)
		if s.Spec.Ordinals != nil {
			start = s.Spec.Ordinals.Start
		}
		for i := start; i < start+ptrOr(s.Spec.Replicas, 1); i++ {
			name := fmt.Sprintf("%s-%d", s.Name, i)
			l := map[string]string{"statefulset.kubernetes.io/pod-name": name}
			for k, v := range s.Spec.Template.Labels {
				l[k] = v
			}
			pods[name] = l
		}
	}
	return pods
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// service: the selector picks pods, and each target port is a port of
// their container.
func (c *checker) service(s *corev1.Service) {
	sel := labels.SelectorFromSet(s.Spec.Selector)
	var matched []*corev1.PodSpec
	for _, st := range c.o.statefulSets {
		for _, pod := range c.natsPods() {
			if sel.Matches(labels.Set(pod)) && labels.SelectorFromSet(st.Spec.Template.Labels).Matches(labels.Set(pod)) {
				matched = append(matched, &st.Spec.Template.Spec)
			}
		}
	}
	for _, d := range c.o.deployments {
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			matched = append(matched, &d.Spec.Template.Spec)
		}
	}
	c.expect(len(matched) > 0, "Service %s selects no pods", s.Name)
	for _, p := range s.Spec.Ports {
		for _, spec := range matched {
			c.expect(containerPort(spec, p.TargetPort) != nil, "Service %s: target port %s is not a port of the pods", s.Name, p.TargetPort.String())
		}
	}
}

func containerPort(spec *corev1.PodSpec, port intstr.IntOrString) *corev1.ContainerPort {
	for _, ct := range spec.Containers {
		for i, p := range ct.Ports {
			if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
				return &ct.Ports[i]
			}
		}
	}
	return nil
}

// servicePort finds the Service host:port names, and the port's name.
func (c *checker) servicePort(host string, port int32) (string, bool) {
	for _, s := range c.o.services {
		if s.Name != host {
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.Port == port {
				return p.Name, true
			}
		}
	}
	return "", false
}

func (c *checker) configMap(volumes []corev1.Volume, mountPath string, containers []corev1.Container) *corev1.ConfigMap {
	for _, ct := range containers {
		for _, m := range ct.VolumeMounts {
			if m.MountPath != mountPath {
				continue
			}
			for _, v := range volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					for _, cm := range c.o.configMaps {
						if cm.Name == v.ConfigMap.Name {
							return cm
						}
					}
				}
			}
		}
	}
	return nil
}

func probePath(p *corev1.Probe) (string, intstr.IntOrString) {
	if p == nil || p.HTTPGet == nil {
		return "", intstr.IntOrString{}
	}
	return p.HTTPGet.Path, p.HTTPGet.Port
}

// env resolves a container's environment as the kubelet would, with
// stand-ins for the downward API and Secrets; it also returns the Secret
// keys it read.
func env(ct *corev1.Container, podName string) (map[string]string, []corev1.SecretKeySelector) {
	out := map[string]string{}
	var secrets []corev1.SecretKeySelector
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range ct.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
				if v, ok := out[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			out[e.Name] = podName
		case e.ValueFrom.SecretKeyRef != nil:
			secrets = append(secrets, *e.ValueFrom.SecretKeyRef)
			out[e.Name] = "secret-" + strings.ToLower(e.ValueFrom.SecretKeyRef.Key)
		default:
			out[e.Name] = "unknown"
		}
	}
	return out, secrets
}

// natsConf is the parsed nats.conf of the NATS StatefulSet (nil if there
// is none, or it does not parse: that is reported once).
func (c *checker) natsConf() (*server.Options, string) {
	c.natsOnce.Do(func() { c.natsOpts, c.natsText = c.loadNatsConf() })
	return c.natsOpts, c.natsText
}

func (c *checker) loadNatsConf() (*server.Options, string) {
	for _, s := range c.o.statefulSets {
		cm := c.configMap(s.Spec.Template.Spec.Volumes, "/etc/nats", s.Spec.Template.Spec.Containers)
		if cm == nil {
			c.expect(false, "StatefulSet %s: no nats.conf mounted at /etc/nats", s.Name)
			return nil, ""
		}
		dir := c.t.TempDir()
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(cm.Data["nats.conf"]), 0o600); err != nil {
			c.t.Fatal(err)
		}
		// With its tls blocks in use, nats.conf reads certificate files: they
		// must be on a volume of the Secret, and the test gives it some.
		if tlsFiles := usedTLSFiles(cm.Data["nats.conf"]); len(tlsFiles) > 0 {
			ct := &s.Spec.Template.Spec.Containers[0]
			for _, f := range tlsFiles {
				c.expect(c.onSecret(&s.Spec.Template.Spec, ct, f), "nats.conf reads %s, which is not on a Secret mounted into StatefulSet %s (deploy/tls mounts nats-server-tls at /etc/nats/tls)", f, s.Name)
			}
			ca := natstest.NewCA(c.t)
			ca.WriteCert(c.t, filepath.Join(dir, "ca.crt"))
			ca.Issue(c.t, "nats-1", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
			text := strings.ReplaceAll(cm.Data["nats.conf"], "/etc/nats/tls/", dir+"/")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				c.t.Fatal(err)
			}
		}
		// The variables nats.conf reads: the pod name and the Secret's keys.
		for _, v := range regexp.MustCompile(`\$([A-Z_]+)`).FindAllStringSubmatch(cm.Data["nats.conf"], -1) {
			c.t.Setenv(v[1], "secret-"+strings.ToLower(v[1]))
		}
		c.t.Setenv("NATS_SERVER_NAME", s.Name+"-1")
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("nats.conf of ConfigMap %s: %w", cm.Name, err))
			return nil, ""
		}
		return opts, cm.Data["nats.conf"]
	}
	return nil, ""
}

// usedTLSFiles lists the certificate files of the tls blocks nats.conf
// uses (not the commented ones).
func usedTLSFiles(text string) []string {
	var files []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:cert_file|key_file|ca_file):\s*"?([^\s"]+)`).FindAllStringSubmatch(text, -1) {
		if !slices.Contains(files, m[1]) {
			files = append(files, m[1])
		}
	}
	return files
}

// onSecret tells whether path is on a volume of a Secret mounted into the
// container.
func (c *checker) onSecret(spec *corev1.PodSpec, ct *corev1.Container, path string) bool {
	for _, m := range ct.VolumeMounts {
		if !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && !ptrOr(v.Secret.Optional, false) {
				return true
			}
		}
	}
	return false
}

func (c *checker) natsStatefulSet(s *appsv1.StatefulSet) {
	spec := &s.Spec.Template.Spec
	c.expect(ptrOr(s.Spec.Replicas, 1) == 3, "StatefulSet %s: expected 3 replicas", s.Name)
	c.expect(len(spec.Containers) == 1, "StatefulSet %s: expected one container", s.Name)
	opts, text := c.natsConf()
	if opts == nil {
		return
	}
	ct := &spec.Containers[0]
	e, _ := env(ct, s.Name+"-1")
	c.expect(e["NATS_SERVER_NAME"] == s.Name+"-1", "StatefulSet %s: NATS_SERVER_NAME must be the pod's name", s.Name)
	c.expect(slices.Equal(ct.Args, []string{"--config", "/etc/nats/nats.conf"}), "StatefulSet %s: expected args --config /etc/nats/nats.conf", s.Name)
	c.expect(opts.JetStream && opts.Cluster.Name != "", "nats.conf: JetStream and a cluster expected")
	for name, want := range map[string]int{"client": opts.Port, "cluster": opts.Cluster.Port, "monitor": opts.HTTPPort} {
		p := containerPort(spec, intstr.FromString(name))
		c.expect(p != nil && int(p.ContainerPort) == want, "StatefulSet %s: port %s must be nats.conf's %d", s.Name, name, want)
	}
	// Every member is a route, and every route is a member behind a
	// Service of its name.
	members := c.natsPods()
	var routed []string
	for _, r := range opts.Routes {
		host, port, _ := net.SplitHostPort(r.Host)
		routed = append(routed, host)
		_, isMember := members[host]
		pn, ok := c.servicePort(host, int32(atoi(port)))
		c.expect(isMember && ok && pn == "cluster", "nats.conf routes to %s, which is not a member behind a Service %s with port %s named cluster", r.Host, host, port)
	}
	for m := range members {
		c.expect(slices.Contains(routed, m), "member %s is not among nats.conf's routes", m)
	}
	// The JetStream store is on the volume claim.
	onClaim := false
	for _, m := range ct.VolumeMounts {
		for _, vc := range s.Spec.VolumeClaimTemplates {
			onClaim = onClaim || m.Name == vc.Name && strings.HasPrefix(opts.StoreDir+"/", m.MountPath+"/")
		}
	}
	c.expect(onClaim, "StatefulSet %s: nats.conf's store_dir %s is not on a volume claim", s.Name, opts.StoreDir)
	// The Secret gives the passwords nats.conf reads.
	fromSecret := slices.ContainsFunc(ct.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.SecretRef != nil && e.SecretRef.Name == "nats-users" && !ptrOr(e.SecretRef.Optional, false)
	})
	c.expect(fromSecret && strings.Contains(text, "$NODEPOOL_PASSWORD"), "StatefulSet %s: expected the passwords from Secret nats-users", s.Name)
	c.probes(s.Name, ct, "/healthz?js-enabled-only=true", "/healthz?js-server-only=true", "monitor")
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func (c *checker) probes(name string, ct *corev1.Container, live, ready, port string) {
	lp, lport := probePath(ct.LivenessProbe)
	rp, rport := probePath(ct.ReadinessProbe)
	c.expect(lp == live && lport.String() == port, "%s: expected a liveness probe on %s, port %s; got %q", name, live, port, lp)
	c.expect(rp == ready && rport.String() == port, "%s: expected a readiness probe on %s, port %s; got %q", name, ready, port, rp)
}

// settingNames are the NODEPOOL_* variables config.Settings reads.
func settingNames() []string {
	var out []string
	typ := reflect.TypeOf(config.Settings{})
	for i := 0; i < typ.NumField(); i++ {
		if tag := typ.Field(i).Tag.Get("envconfig"); tag != "" {
			out = append(out, config.EnvPrefix+"_"+tag)
		}
	}
	return out
}

func (c *checker) nodepoolDeployment(d *appsv1.Deployment) {
	spec := &d.Spec.Template.Spec
	role := d.Spec.Template.Labels["app.kubernetes.io/component"]
	c.expect(ptrOr(d.Spec.Replicas, 1) > 1, "Deployment %s: expected more than one replica, got %d", d.Name, ptrOr(d.Spec.Replicas, 1))
	c.expect(len(spec.Containers) == 1, "Deployment %s: expected one container", d.Name)
	ct := &spec.Containers[0]
	c.expect(slices.Equal(ct.Args, []string{"run"}), "Deployment %s: expected args [run]", d.Name)
	e, secrets := env(ct, d.Name+"-5d9c7b8f4-x2x7q")
	known := settingNames()
	for name := range e {
		c.expect(!strings.HasPrefix(name, config.EnvPrefix+"_") || slices.Contains(known, name), "Deployment %s: %s is not a process setting (known: %s)", d.Name, name, strings.Join(known, ", "))
	}
	for _, s := range secrets {
		c.expect(s.Name == "nats-users" && s.Key == "NODEPOOL_PASSWORD", "Deployment %s: reads key %s of Secret %s; docs/deployment.md creates NODEPOOL_PASSWORD of nats-users", d.Name, s.Key, s.Name)
	}
	// The settings load and validate as `nodepool run` would take them.
	for _, name := range known {
		c.t.Setenv(name, "")
		os.Unsetenv(name)
	}
	for k, v := range e {
		if strings.HasPrefix(k, config.EnvPrefix+"_") {
			c.t.Setenv(k, v)
		}
	}
	s, err := config.LoadSettings()
	if err == nil {
		err = s.Validate()
	}
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("Deployment %s: %w", d.Name, err))
		return
	}
	c.expect(s.ID == d.Name+"-5d9c7b8f4-x2x7q", "Deployment %s: NODEPOOL_ID must be the pod's name", d.Name)
	c.expect(slices.Equal(s.Roles, []string{role}), "Deployment %s: NODEPOOL_ROLES %v, expected [%s]", d.Name, s.Roles, role)
	c.expect(s.Replicas == 3, "Deployment %s: NODEPOOL_REPLICAS must be 3 (the NATS members)", d.Name)
	// The NATS URL names the client Service and a user of nats.conf.
	u, err := url.Parse(s.NatsURL)
	c.expect(err == nil && u.User != nil && u.User.Username() == "nodepool", "Deployment %s: NODEPOOL_NATS_URL must connect as user nodepool", d.Name)
	if err == nil {
		if name, ok := c.servicePort(u.Hostname(), int32(atoi(u.Port()))); len(c.o.services) > 0 {
			c.expect(ok && name == "client", "Deployment %s: NODEPOOL_NATS_URL %s is not a Service port named client", d.Name, config.RedactURLs(s.NatsURL))
		}
		pw, _ := u.User.Password()
		c.expect(pw == "secret-nodepool_password", "Deployment %s: NODEPOOL_NATS_URL must take the password from NODEPOOL_PASSWORD of Secret nats-users", d.Name)
	}
	// TLS on both sides or on neither: a server that verifies clients needs
	// nodepool's certificate, and a client that asks for TLS fails against
	// a server without it.
	tlsFiles := []string{s.NatsTLSCA, s.NatsTLSCert, s.NatsTLSKey}
	usesTLS := slices.ContainsFunc(tlsFiles, func(f string) bool { return f != "" })
	if opts, _ := c.natsConf(); opts != nil {
		verifies := opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert
		c.expect(!verifies || s.NatsTLSCert != "" && s.NatsTLSKey != "" && s.NatsTLSCA != "", "Deployment %s: nats.conf requires client certificates, and NODEPOOL_NATS_TLS_CA, _CERT and _KEY are not all set (add the component deploy/tls)", d.Name)
		c.expect(opts.TLSConfig != nil || !usesTLS, "Deployment %s: NODEPOOL_NATS_TLS_* are set, and nats.conf does not use TLS (uncomment its tls blocks)", d.Name)
	}
	for _, f := range tlsFiles {
		c.expect(f == "" || c.onSecret(spec, ct, f), "Deployment %s: %s is not on a Secret mounted into the pod", d.Name, f)
	}
	// The status API listens where the probes look.
	_, port, _ := net.SplitHostPort(s.HTTPAddr)
	hp := containerPort(spec, intstr.FromString("http"))
	c.expect(hp != nil && strconv.Itoa(int(hp.ContainerPort)) == port, "Deployment %s: port http must be NODEPOOL_HTTP_ADDR's port %s", d.Name, port)
	c.probes("Deployment "+d.Name, ct, "/healthz", "/ready", "http")
	// nodepool.yaml comes from the ConfigMap and is valid.
	cm := c.configMap(spec.Volumes, filepath.Dir(s.Config), spec.Containers)
	if cm == nil {
		c.expect(false, "Deployment %s: no ConfigMap mounted at %s", d.Name, filepath.Dir(s.Config))
		return
	}
	text, ok := cm.Data[filepath.Base(s.Config)]
	c.expect(ok, "Deployment %s: ConfigMap %s has no %s", d.Name, cm.Name, filepath.Base(s.Config))
	if _, err := config.Parse(filepath.Base(s.Config), []byte(text)); err != nil {
		c.errs = append(c.errs, fmt.Errorf("Deployment %s: %w", d.Name, err))
	}
	// The data dir is writable: the root file system is not.
	writable := false
	for _, m := range ct.VolumeMounts {
		writable = writable || m.MountPath == s.DataDir && !m.ReadOnly
	}
	c.expect(writable, "Deployment %s: NODEPOOL_DATA_DIR %s is not a writable volume", d.Name, s.DataDir)
}

func (c *checker) scaledObject(so *kedav1alpha1.ScaledObject) {
	ref := so.Spec.ScaleTargetRef
	var target *appsv1.Deployment
	for _, d := range c.o.deployments {
		if d.Name == ref.Name && ref.Kind == "Deployment" {
			target = d
		}
	}
	if len(c.o.deployments) > 0 {
		c.expect(target != nil && target.Spec.Template.Labels["app.kubernetes.io/component"] == "launcher", "ScaledObject %s: the target must be the launcher Deployment", so.Name)
	}
	c.expect(ptrOr(so.Spec.MinReplicaCount, 0) >= 2, "ScaledObject %s: minReplicaCount must be at least 2 (a launcher must always run)", so.Name)
	c.expect(len(so.Spec.Triggers) == 1, "ScaledObject %s: expected one trigger", so.Name)
	allowed, required := natsJetStreamKeys(c.t)
	for _, tr := range so.Spec.Triggers {
		c.expect(tr.Type == "nats-jetstream", "ScaledObject %s: trigger type %q, expected nats-jetstream", so.Name, tr.Type)
		for k := range tr.Metadata {
			c.expect(slices.Contains(allowed, k), "ScaledObject %s: unknown metadata key %q of the nats-jetstream trigger (it takes %s)", so.Name, k, strings.Join(allowed, ", "))
		}
		for _, k := range required {
			c.expect(tr.Metadata[k] != "", "ScaledObject %s: the nats-jetstream trigger needs %s", so.Name, k)
		}
		md := tr.Metadata
		c.expect(md["stream"] == events.RequestsStream, "ScaledObject %s: stream %q, expected %s", so.Name, md["stream"], events.RequestsStream)
		c.expect(md["consumer"] == consumers.IntakeConsumer, "ScaledObject %s: consumer %q, expected %s", so.Name, md["consumer"], consumers.IntakeConsumer)
		for _, k := range []string{"lagThreshold", "activationLagThreshold"} {
			if v, ok := md[k]; ok {
				_, err := strconv.ParseInt(v, 10, 64)
				c.expect(err == nil, "ScaledObject %s: %s %q is not an integer", so.Name, k, v)
			}
		}
		// The endpoint is the monitoring port of the NATS Service, by the
		// name KEDA (in another namespace) resolves.
		host, port, err := net.SplitHostPort(md["natsServerMonitoringEndpoint"])
		c.expect(err == nil, "ScaledObject %s: natsServerMonitoringEndpoint must be host:port", so.Name)
		svc, ns, _ := strings.Cut(host, ".")
		c.expect(ns == so.Namespace+".svc.cluster.local", "ScaledObject %s: natsServerMonitoringEndpoint %s must be <service>.%s.svc.cluster.local", so.Name, host, so.Namespace)
		if len(c.o.services) > 0 {
			name, _ := c.servicePort(svc, int32(atoi(port)))
			c.expect(name == "monitor", "ScaledObject %s: Service %s has no port %s named monitor", so.Name, svc, port)
		}
		if opts, _ := c.natsConf(); opts != nil {
			account := slices.ContainsFunc(opts.Accounts, func(a *server.Account) bool { return a.Name == md["account"] })
			c.expect(account, "ScaledObject %s: account %q is not an account of nats.conf", so.Name, md["account"])
		}
	}
}
