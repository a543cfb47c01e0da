package kubernetes

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/drivers"
)

// labelsConfig has a label of each kind, with every key a label may have.
const labelsConfig = `
labels: [{name: k8s-namespace}, {name: pod-fedora}, {name: pod-defaults}, {name: custom-pod}, {name: pod-nowhere}, {name: pod-own-scheduler}]
providers:
  - name: %[1]s
    driver: kubernetes
    context: k8stest
    pools:
      - name: main
        default-label-cpu: 2
        default-label-memory: 1024
        default-label-storage: 10
        default-label-cpu-limit: 8
        default-label-memory-limit: 4096
        default-label-storage-limit: 40
        default-label-extra-resources: {example.com/widget: 1}
        labels:
          - name: k8s-namespace
            type: namespace
            labels: {team: ci}
            dynamic-labels: {request_id: "{request.id}", tenant: "{request.tenant_name}"}
          - name: pod-fedora
            type: pod
            image: docker.io/fedora:40
            image-pull: Always
            python-path: /usr/bin/python3
            shell-type: bash
            labels: {team: ci}
            dynamic-labels: {requestor: "{request.requestor}"}
            annotations: {example.com/owner: zuul}
            cpu: 1
            memory: 512
            storage: 100
            cpu-limit: 2
            memory-limit: 1024
            storage-limit: 200
            gpu: 1
            gpu-resource: example.com/gpu
            extra-resources: {example.com/license: 2}
            env:
              - {name: FOO, value: bar}
              - {name: EMPTY, value: ""}
            node-selector: {type: kwok}
            privileged: true
            volumes:
              - name: scratch
                emptyDir: {sizeLimit: 1Gi}
            volume-mounts:
              - name: scratch
                mountPath: /scratch
          - name: pod-defaults
            type: pod
            image: docker.io/debian:bookworm
          - name: custom-pod
            type: pod
            labels: {kind: custom}
            annotations: {example.com/spec: verbatim}
            spec:
              containers:
                - name: custom-pod
                  image: ubuntu:jammy
                  imagePullPolicy: IfNotPresent
                  command: ["/bin/sh", "-c"]
                  args: ["while true; do sleep 30; done;"]
              hostname: custom
              terminationGracePeriodSeconds: 7
          - name: pod-nowhere
            type: pod
            image: docker.io/debian:bookworm
            node-selector: {no-such: node}
          - name: pod-own-scheduler
            type: pod
            image: docker.io/debian:bookworm
            scheduler-name: own-scheduler
`

// A namespace label: a namespace with the label's labels and the driver's,
// a service account whose token, the cluster's CA and the API server's
// address the node gets, and whose rights reach its namespace only.
func TestNamespaceLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	node := nodeID()
	req := e.request(node, "k8s-namespace", 1)
	req.Request = &drivers.RequestInfo{ID: "req-1", Tenant: "tenant-a", Requestor: "zuul"}
	inst := e.mustCreate(p, req)

	ns, err := e.admin.CoreV1().Namespaces().Get(t.Context(), inst.ExternalID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Name != "main-"+node {
		t.Errorf("namespace %s, want main-%s (as Nodepool names it)", ns.Name, node)
	}
	for k, v := range map[string]string{"team": "ci", "request_id": "req-1", "tenant": "tenant-a",
		LabelNode: node, LabelProvider: e.name, LabelPool: "main", LabelLabel: "k8s-namespace"} {
		if ns.Labels[k] != v {
			t.Errorf("namespace label %s = %q, want %q (labels %v)", k, ns.Labels[k], v, ns.Labels)
		}
	}
	acc := inst.Kubernetes
	if acc == nil {
		t.Fatal("the instance carries no credentials")
	}
	ca, _ := base64.StdEncoding.DecodeString(acc.CACert)
	if acc.Name != ns.Name || acc.Namespace != ns.Name || acc.Host != e.s.Server || acc.SkipTLS || acc.User != User || acc.Token == "" ||
		acc.Pod != "" || !bytes.Equal(ca, e.s.CA) {
		t.Errorf("credentials %+v (CA %q), want namespace %s on %s with the cluster's CA", acc, ca, ns.Name, e.s.Server)
	}
	if inst.ConnectionType != "namespace" || inst.InterfaceIP != "" || inst.Cloud != "k8stest" || inst.PythonPath != "auto" ||
		inst.ShellType != "sh" || inst.Name != ns.Name || inst.Tags[drivers.TagNode] != node {
		t.Errorf("instance %+v", inst)
	}
	if r := inst.Resources; r.Instances != 1 || r.Cores != 0 || r.RAM != 0 || r.Other != nil {
		t.Errorf("resources %+v: a namespace counts one instance", r)
	}

	// With those credentials: client-go and kubectl manage pods, config
	// maps and secrets in the namespace, and nothing outside it.
	nc := NodeClient(t, acc)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "job"}, Data: map[string]string{"a": "b"}}
	if _, err := nc.CoreV1().ConfigMaps(ns.Name).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Errorf("the node's account cannot create a config map in its namespace: %v", err)
	}
	if _, err := nc.CoreV1().Pods(ns.Name).Create(t.Context(), testPod("job"), metav1.CreateOptions{}); err != nil {
		t.Errorf("the node's account cannot create a pod in its namespace: %v", err)
	}
	if _, err := nc.CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node's account lists config maps of namespace default: %v", err)
	}
	if _, err := nc.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node's account lists namespaces: %v", err)
	}
	kc := Kubeconfig(t, acc)
	if out, err := Kubectl(t, e.s, kc, "get", "configmap", "job", "-o", "jsonpath={.data.a}"); err != nil || out != "b" {
		t.Errorf("kubectl get configmap with the node's kubeconfig: %q, %v", out, err)
	}
	if out, err := Kubectl(t, e.s, kc, "auth", "can-i", "create", "secrets"); err != nil || strings.TrimSpace(out) != "yes" {
		t.Errorf("kubectl auth can-i create secrets: %q, %v", out, err)
	}
	if out, err := Kubectl(t, e.s, kc, "auth", "can-i", "create", "pods", "-n", "default"); err == nil || strings.TrimSpace(out) != "no" {
		t.Errorf("kubectl auth can-i create pods -n default: %q, %v", out, err)
	}
}

// testPod is a pod that kwok runs.
func testPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
}

// A pod label: a pod of the label's image in a namespace of its own,
// with every key of the label in its spec, running (kwok plays its
// kubelet); the account may read it, exec into it and read its logs, and
// nothing more.
func TestPodLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	node := nodeID()
	req := e.request(node, "pod-fedora", 1)
	req.Request = &drivers.RequestInfo{ID: "req-2", Requestor: "zuul"}
	inst := e.mustCreate(p, req)

	ns := inst.ExternalID
	pod, err := e.admin.CoreV1().Pods(ns).Get(t.Context(), "pod-fedora", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName != "kwok-gpu-0" {
		t.Errorf("pod %s on %q: want Running on kwok-gpu-0, the node with GPUs", pod.Status.Phase, pod.Spec.NodeName)
	}
	for k, v := range map[string]string{"team": "ci", "requestor": "zuul", LabelNode: node, LabelProvider: e.name, LabelPool: "main", LabelLabel: "pod-fedora"} {
		if pod.Labels[k] != v {
			t.Errorf("pod label %s = %q, want %q", k, pod.Labels[k], v)
		}
	}
	if pod.Annotations["example.com/owner"] != "zuul" {
		t.Errorf("pod annotations %v", pod.Annotations)
	}
	s := pod.Spec
	if len(s.Containers) != 1 {
		t.Fatalf("containers %+v", s.Containers)
	}
	c := s.Containers[0]
	if c.Name != "pod-fedora" || c.Image != "docker.io/fedora:40" || c.ImagePullPolicy != corev1.PullAlways ||
		!slices.Equal(c.Command, []string{"/bin/sh", "-c"}) || !slices.Equal(c.Args, []string{"while true; do sleep 30; done;"}) {
		t.Errorf("container %+v", c)
	}
	if !slices.Equal(c.Env, []corev1.EnvVar{{Name: "FOO", Value: "bar"}, {Name: "EMPTY"}}) {
		t.Errorf("env %+v", c.Env)
	}
	for name, want := range map[corev1.ResourceName][2]string{
		corev1.ResourceCPU: {"1", "2"}, corev1.ResourceMemory: {"512Mi", "1Gi"}, corev1.ResourceEphemeralStorage: {"100M", "200M"},
		"example.com/gpu": {"1", "1"},
	} {
		req, lim := c.Resources.Requests[name], c.Resources.Limits[name]
		if req.Cmp(resource.MustParse(want[0])) != 0 || lim.Cmp(resource.MustParse(want[1])) != 0 {
			t.Errorf("%s: request %s, limit %s; want %s, %s", name, req.String(), lim.String(), want[0], want[1])
		}
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("security context %+v", c.SecurityContext)
	}
	// (Kubernetes adds the service account's token volume.)
	if i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "scratch" }); i < 0 || c.VolumeMounts[i].MountPath != "/scratch" {
		t.Errorf("volume mounts %+v", c.VolumeMounts)
	}
	if i := slices.IndexFunc(s.Volumes, func(v corev1.Volume) bool { return v.Name == "scratch" }); i < 0 || s.Volumes[i].EmptyDir == nil ||
		s.Volumes[i].EmptyDir.SizeLimit.String() != "1Gi" {
		t.Errorf("volumes %+v", s.Volumes)
	}
	if s.NodeSelector["type"] != "kwok" || len(s.NodeSelector) != 1 || s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("node selector %v, restart policy %s", s.NodeSelector, s.RestartPolicy)
	}

	acc := inst.Kubernetes
	if inst.ConnectionType != "kubectl" || inst.InterfaceIP != "pod-fedora" || acc == nil || acc.Pod != "pod-fedora" || acc.Namespace != ns ||
		inst.PythonPath != "/usr/bin/python3" || inst.ShellType != "bash" {
		t.Fatalf("instance %+v, credentials %+v", inst, acc)
	}
	// Nodepool's quota: cpu as cores, memory as RAM, storage, the gpu
	// and the extra resources (the label's over the pool's defaults).
	want := drivers.Resources{Instances: 1, Cores: 1, RAM: 512,
		Other: map[string]int{ResourceStorage: 100, "example.com/gpu": 1, "example.com/license": 2, "example.com/widget": 1}}
	if got, err := p.QuotaForLabel("main", "pod-fedora"); err != nil || !sameResources(got, want) || !sameResources(inst.Resources, want) {
		t.Errorf("QuotaForLabel = %+v, %v; instance %+v; want %+v", got, err, inst.Resources, want)
	}

	// The restricted account: the pod, its exec and logs, nothing else.
	kc := Kubeconfig(t, acc)
	if out, err := Kubectl(t, e.s, kc, "get", "pod", acc.Pod, "-o", "jsonpath={.status.phase}"); err != nil || out != "Running" {
		t.Errorf("kubectl get pod with the node's kubeconfig: %q, %v", out, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "pods", "--subresource=exec"}, "yes"},
		{[]string{"get", "pods", "--subresource=log"}, "yes"},
		{[]string{"create", "pods", "--subresource=portforward"}, "yes"},
		{[]string{"get", "pods"}, "yes"},
		{[]string{"delete", "pods"}, "no"},
		{[]string{"create", "pods"}, "no"},
		{[]string{"get", "secrets"}, "no"},
	} {
		out, _ := Kubectl(t, e.s, kc, append([]string{"auth", "can-i"}, c.args...)...)
		if strings.TrimSpace(out) != c.want {
			t.Errorf("kubectl auth can-i %s: %q, want %s", strings.Join(c.args, " "), strings.TrimSpace(out), c.want)
		}
	}
}

func sameResources(a, b drivers.Resources) bool {
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	return bytes.Equal(aj, bj)
}

// A pod label's unset keys take the pool's default-label-*, and a limit
// unset takes the pool's default limit.
func TestPodDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	inst := e.mustCreate(p, e.request(nodeID(), "pod-defaults", 1))
	pod, err := e.admin.CoreV1().Pods(inst.ExternalID).Get(t.Context(), "pod-defaults", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	for name, want := range map[corev1.ResourceName][2]string{
		corev1.ResourceCPU: {"2", "8"}, corev1.ResourceMemory: {"1Gi", "4Gi"}, corev1.ResourceEphemeralStorage: {"10M", "40M"},
	} {
		req, lim := c.Resources.Requests[name], c.Resources.Limits[name]
		if req.Cmp(resource.MustParse(want[0])) != 0 || lim.Cmp(resource.MustParse(want[1])) != 0 {
			t.Errorf("%s: request %s, limit %s; want %s, %s", name, req.String(), lim.String(), want[0], want[1])
		}
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent || c.SecurityContext != nil || len(c.Env) != 0 || pod.Spec.NodeSelector != nil {
		t.Errorf("container %+v", c)
	}
	want := drivers.Resources{Instances: 1, Cores: 2, RAM: 1024, Other: map[string]int{ResourceStorage: 10, "example.com/widget": 1}}
	if !sameResources(inst.Resources, want) || inst.PythonPath != "auto" || inst.ShellType != "sh" {
		t.Errorf("instance %+v, want resources %+v", inst, want)
	}
}

// A spec label's pod is its spec as written, with the label's labels and
// annotations and the driver's labels; none of the pool's defaults.
func TestSpecLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	node := nodeID()
	inst := e.mustCreate(p, e.request(node, "custom-pod", 1))
	pod, err := e.admin.CoreV1().Pods(inst.ExternalID).Get(t.Context(), "custom-pod", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if len(s.Containers) != 1 || s.Containers[0].Image != "ubuntu:jammy" || s.Hostname != "custom" ||
		s.TerminationGracePeriodSeconds == nil || *s.TerminationGracePeriodSeconds != 7 || len(s.Containers[0].Resources.Requests) != 0 {
		t.Errorf("spec %+v", s)
	}
	if s.RestartPolicy != corev1.RestartPolicyAlways {
		t.Errorf("restart policy %s: a spec is given as written (Kubernetes' default)", s.RestartPolicy)
	}
	if pod.Labels["kind"] != "custom" || pod.Labels[LabelNode] != node || pod.Annotations["example.com/spec"] != "verbatim" {
		t.Errorf("labels %v, annotations %v", pod.Labels, pod.Annotations)
	}
	if inst.ConnectionType != "kubectl" || inst.Kubernetes.Pod != "custom-pod" || !sameResources(inst.Resources, drivers.Resources{Instances: 1}) {
		t.Errorf("instance %+v", inst)
	}
}

// A pod no node can take stays pending: the launcher's boot-timeout ends
// the attempt, and the diagnosis says why the scheduler left it.
func TestUnschedulablePod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	req := e.request(nodeID(), "pod-nowhere", 1)
	sm, err := p.Create(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm, stepRunning)
	t.Cleanup(func() { _, _ = advance(t, mustDelete(t, p, sm.ExternalID())) })
	UntilPod(t, e.admin, sm.ExternalID(), "pod-nowhere", 30*time.Second, func(pod *corev1.Pod) bool {
		return pod != nil && len(pod.Status.Conditions) > 0
	})
	for range 3 {
		step, err := sm.Advance(t.Context())
		if err != nil || step.Done || step.Wait == 0 {
			t.Fatalf("an unscheduled pod: %+v, %v; want a wait", step, err)
		}
	}
	d := p.Diagnose(t.Context(), req, sm.ExternalID())
	if !strings.Contains(d, "PodScheduled: Unschedulable") || !strings.Contains(d, "didn't match Pod's node affinity/selector") {
		t.Errorf("diagnosis: %q", d)
	}

	// scheduler-name: the pod waits for that scheduler (the cluster's
	// does not take it).
	sm, err = p.Create(e.request(nodeID(), "pod-own-scheduler", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm, stepRunning)
	t.Cleanup(func() { _, _ = advance(t, mustDelete(t, p, sm.ExternalID())) })
	pod, err := e.admin.CoreV1().Pods(sm.ExternalID()).Get(t.Context(), "pod-own-scheduler", metav1.GetOptions{})
	if err != nil || pod.Spec.SchedulerName != "own-scheduler" || pod.Spec.NodeName != "" {
		t.Errorf("pod of scheduler-name own-scheduler: %v, scheduler %q, node %q", err, pod.Spec.SchedulerName, pod.Spec.NodeName)
	}
	if step, err := sm.Advance(t.Context()); err != nil || step.Done {
		t.Errorf("a pod its scheduler has not placed: %+v, %v; want a wait", step, err)
	}
}

// Nodepool's quota of a label: a fraction of a GPU or of an extra
// resource counts as a whole one; a namespace and a spec count one
// instance.
func TestQuotaForLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
labels: [{name: a}, {name: b}, {name: c}]
providers:
  - name: %[1]s
    driver: kubernetes
    context: k8stest
    pools:
      - name: main
        labels:
          - {name: a, type: pod, image: x, cpu: 3, memory: 100, gpu: 0.5, gpu-resource: example.com/gpu, extra-resources: {licenses: 1.5}}
          - {name: b, type: namespace}
          - {name: c, type: pod, spec: {containers: [{name: c, image: x, resources: {requests: {cpu: 4}}}]}}
`)
	p := e.provider()
	for label, want := range map[string]drivers.Resources{
		"a": {Instances: 1, Cores: 3, RAM: 100, Other: map[string]int{"example.com/gpu": 1, "licenses": 2}},
		"b": {Instances: 1},
		"c": {Instances: 1},
	} {
		if got, err := p.QuotaForLabel("main", label); err != nil || !sameResources(got, want) {
			t.Errorf("QuotaForLabel(%s) = %+v, %v; want %+v", label, got, err, want)
		}
	}
	if _, err := p.QuotaForLabel("main", "nonesuch"); err == nil {
		t.Error("a label the pool lacks has a quota")
	}
	if lim, err := p.QuotaLimits(t.Context()); err != nil || lim.Instances != drivers.Unlimited || lim.Cores != drivers.Unlimited || lim.RAM != drivers.Unlimited {
		t.Errorf("QuotaLimits = %+v, %v; want unlimited, as Nodepool's", lim, err)
	}
}

func mustDelete(t *testing.T, p *Provider, ns string) drivers.StateMachine {
	t.Helper()
	dm, err := p.Delete(ns, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dm
}

// The delete removes the namespace, and with it the pod and account, and
// waits until Kubernetes has finished it; again, it is done at once.
func TestDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	inst := e.mustCreate(p, e.request(nodeID(), "pod-fedora", 1))
	dm := mustDelete(t, p, inst.ExternalID)
	if _, err := advance(t, dm); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().Namespaces().Get(t.Context(), inst.ExternalID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s after the delete: %v", inst.ExternalID, err)
	}
	dm = mustDelete(t, p, inst.ExternalID)
	if step, err := dm.Advance(t.Context()); err != nil || !step.Done {
		t.Errorf("deleting a gone namespace: %+v, %v", step, err)
	}
	// A delete resumed from its stored state finishes it.
	inst = e.mustCreate(p, e.request(nodeID(), "k8s-namespace", 1))
	dm = mustDelete(t, p, inst.ExternalID)
	advanceTo(t, dm, delWait)
	dm2, err := e.provider().Delete(inst.ExternalID, dm.State())
	if err != nil || stepOf(dm2) != delWait {
		t.Fatalf("resumed delete: %v at %q", err, stepOf(dm2))
	}
	if _, err := advance(t, dm2); err != nil {
		t.Fatal(err)
	}
	UntilNamespace(t, e.admin, inst.ExternalID, time.Second, gone)
}

// A create resumed by another process, from any step it stored (or from
// none, a driver whose creates are idempotent being started afresh), ends
// with the same namespace and pod, and makes nothing twice.
func TestResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	first := e.provider()
	for _, step := range []string{stepNamespace, stepAccount, stepSecret, stepRole, stepPod, stepRunning, stepToken} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			req := e.request(nodeID(), "pod-fedora", 2)
			sm, err := first.Create(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = e.admin.CoreV1().Namespaces().Delete(context.Background(), sm.ExternalID(), metav1.DeleteOptions{})
			})
			advanceTo(t, sm, step)
			// The step's call is made, and the process dies before it
			// records that: another one resumes from the stored state,
			// and another from nothing.
			if _, err := sm.Advance(t.Context()); err != nil {
				t.Fatal(err)
			}
			var stored createState
			stored.Step, stored.Namespace, stored.Pod = step, sm.ExternalID(), "pod-fedora"
			for _, state := range [][]byte{mustJSON(t, stored), nil} {
				sm2, err := e.provider().Create(req, state)
				if err != nil {
					t.Fatal(err)
				}
				st, err := advance(t, sm2)
				if err != nil || st.Instance.ExternalID != sm.ExternalID() || st.Instance.Kubernetes.Token == "" {
					t.Fatalf("resumed at %s from %s: %+v, %v", step, state, st.Instance, err)
				}
			}
			if !strings.HasSuffix(sm.ExternalID(), "-2") {
				t.Errorf("attempt 2's namespace %s", sm.ExternalID())
			}
			pods, err := e.admin.CoreV1().Pods(sm.ExternalID()).List(t.Context(), metav1.ListOptions{})
			if err != nil || len(pods.Items) != 1 {
				t.Errorf("pods %v, %v", pods, err)
			}
		})
	}
	// Another attempt's state is not taken for this one's.
	if _, err := first.Create(e.request("other", "pod-fedora", 1), mustJSON(t, createState{Step: stepPod, Namespace: "main-other-2"})); err == nil {
		t.Error("a state of attempt 2 resumed attempt 1")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// A namespace of the node's name that is not the node's (labelled for
// another node or none) is never taken over, nor deleted by the launcher.
func TestForeignNamespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	node := nodeID()
	name := namespaceName("main", node, 1)
	if _, err := e.admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.CoreV1().Namespaces().Delete(t.Context(), name, metav1.DeleteOptions{}) })
	sm, err := p.Create(e.request(node, "k8s-namespace", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := advance(t, sm); err == nil || !strings.Contains(err.Error(), "is not this node's") {
		t.Errorf("create over another's namespace: %v", err)
	}
	if own, err := p.Owns(t.Context(), name, node); err != nil || own {
		t.Errorf("Owns(another's namespace) = %v, %v", own, err)
	}
	if _, err := p.Owns(t.Context(), "no-such-namespace", node); !errors.Is(err, drivers.ErrNotFound) {
		t.Errorf("Owns(a namespace that does not exist): %v; want drivers.ErrNotFound", err)
	}
}
