package kubernetes

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

// ListInstances lists the provider's namespaces, each with what it was
// made for and whether it runs, and nothing of another provider's.
func TestListInstances(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	nsNode, podNode := nodeID(), nodeID()
	nsInst := e.mustCreate(p, e.request(nsNode, "k8s-namespace", 1))
	podInst := e.mustCreate(p, e.request(podNode, "pod-fedora", 1))
	other := newEnv(t, labelsConfig)
	e.mustCreate(other.provider(), other.request(nodeID(), "k8s-namespace", 1))

	list := func() map[string]drivers.Instance {
		t.Helper()
		insts, err := p.ListInstances(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]drivers.Instance{}
		for _, inst := range insts {
			out[inst.ExternalID] = inst
		}
		return out
	}
	got := list()
	if len(got) != 2 {
		t.Fatalf("listed %v; want the provider's two namespaces", got)
	}
	for inst, want := range map[string]map[string]string{
		nsInst.ExternalID:  {drivers.TagNode: nsNode, drivers.TagProvider: e.name, drivers.TagPool: "main", drivers.TagLabel: "k8s-namespace"},
		podInst.ExternalID: {drivers.TagNode: podNode, drivers.TagProvider: e.name, drivers.TagPool: "main", drivers.TagLabel: "pod-fedora"},
	} {
		g := got[inst]
		for k, v := range want {
			if g.Tags[k] != v {
				t.Errorf("%s: tag %s = %q, want %q", inst, k, g.Tags[k], v)
			}
		}
		if g.Cloud != "k8stest" || g.Name != inst {
			t.Errorf("%+v", g)
		}
	}
	if r := got[podInst.ExternalID].Resources; r.Cores != 1 || r.RAM != 512 || r.Instances != 1 {
		t.Errorf("pod node's resources %+v", r)
	}
	checkRun(t, got[nsInst.ExternalID], drivers.Running, "namespace Active")
	checkRun(t, got[podInst.ExternalID], drivers.Running, "pod Running")

	// The kubelet says the pod's container died: the node is down.
	pod, err := e.admin.CoreV1().Pods(podInst.ExternalID).Get(t.Context(), "pod-fedora", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failPod(t, e, pod)
	checkRun(t, list()[podInst.ExternalID], drivers.Down, "pod Failed (Error)")
	// Gone: still down.
	zero := int64(0)
	if err := e.admin.CoreV1().Pods(podInst.ExternalID).Delete(t.Context(), "pod-fedora", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	UntilPod(t, e.admin, podInst.ExternalID, "pod-fedora", 30*time.Second, gone)
	checkRun(t, list()[podInst.ExternalID], drivers.Down, "pod pod-fedora gone")
	// A namespace being deleted is down.
	if err := e.admin.CoreV1().Namespaces().Delete(t.Context(), nsInst.ExternalID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if inst, ok := list()[nsInst.ExternalID]; ok {
		checkRun(t, inst, drivers.Down, "namespace Terminating")
	}
}

// failPod writes what a kubelet writes of a pod whose container exited
// with an error (kwok plays the kubelet, but kills no container).
func failPod(t *testing.T, e *env, pod *corev1.Pod) {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Reason = "Error"
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		cs.Ready = false
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", FinishedAt: metav1.Now()}}
	}
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			c.Status = corev1.ConditionFalse
		}
	}
	if _, err := e.admin.CoreV1().Pods(pod.Namespace).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func checkRun(t *testing.T, inst drivers.Instance, want drivers.RunState, status string) {
	t.Helper()
	if inst.Run != want || inst.Status != status {
		t.Errorf("%s: %s %q, want %s %q", inst.ExternalID, inst.Run, inst.Status, want, status)
	}
}

// The API server's refusals are of the kinds the launcher acts on: a
// ResourceQuota of the cluster's is quota exceeded (the launcher waits,
// and the same step then succeeds), a pod gone under a create is not
// found, a 429 is rate limited.
func TestFailureKinds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, labelsConfig)
	p := e.provider()
	sm, err := p.Create(e.request(nodeID(), "pod-defaults", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm, stepPod)
	t.Cleanup(func() { _, _ = advance(t, mustDelete(t, p, sm.ExternalID())) })
	// A policy of the cluster puts a quota on the new namespace.
	rq := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "policy"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}
	if _, err := e.admin.CoreV1().ResourceQuotas(sm.ExternalID()).Create(t.Context(), rq, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's quota admission reads quotas from its cache: a
	// quota made a moment ago may not be in it yet, and a pod would then
	// be let through. Wait until a dry run of a pod is refused. (Until
	// the quota controller has counted the namespace's pods, the quota
	// refuses every pod too: status unknown.)
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "quota-probe"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "probe"}}}}
	var perr error
	waitfor.Until(t, 30*time.Second, "the quota to refuse a dry run of a pod", func() bool {
		_, perr = e.admin.CoreV1().Pods(sm.ExternalID()).Create(t.Context(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return perr != nil && strings.Contains(perr.Error(), "quota")
	}, waitfor.Every(50*time.Millisecond), waitfor.Detail(func() string { return fmt.Sprintf("the last dry run: %v", perr) }))
	_, err = sm.Advance(t.Context())
	if !errors.Is(err, drivers.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota: policy") {
		t.Fatalf("a pod over the namespace's quota: %v; want drivers.ErrQuotaExceeded", err)
	}
	if err := e.admin.CoreV1().ResourceQuotas(sm.ExternalID()).Delete(t.Context(), "policy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The same cache keeps a deleted quota a moment longer: wait until a
	// dry run of a pod is let through.
	waitfor.Until(t, 30*time.Second, "the deleted quota to let a dry run of a pod through", func() bool {
		_, perr = e.admin.CoreV1().Pods(sm.ExternalID()).Create(t.Context(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return perr == nil
	}, waitfor.Every(50*time.Millisecond), waitfor.Detail(func() string { return fmt.Sprintf("the last dry run: %v", perr) }))
	if step, err := advance(t, sm); err != nil || step.Instance.Kubernetes.Pod != "pod-defaults" {
		t.Fatalf("the create once the quota is gone: %v", err)
	}

	// The pod vanishes while a resumed create waits for it to run.
	sm2, err := p.Create(e.request(nodeID(), "pod-defaults", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	advanceTo(t, sm2, stepRunning)
	t.Cleanup(func() { _, _ = advance(t, mustDelete(t, p, sm2.ExternalID())) })
	zero := int64(0)
	if err := e.admin.CoreV1().Pods(sm2.ExternalID()).Delete(t.Context(), "pod-defaults", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	UntilPod(t, e.admin, sm2.ExternalID(), "pod-defaults", 30*time.Second, gone)
	if _, err := sm2.Advance(t.Context()); !errors.Is(err, drivers.ErrNotFound) || errors.Is(err, drivers.ErrUncertain) {
		t.Errorf("a create whose pod vanished: %v; want drivers.ErrNotFound", err)
	}

	// A 429 of the API server (an eviction its disruption budget holds
	// back, through the driver's client): at once, not after client-go's
	// ten retries of 10 s, with the delay the server suggests.
	min1 := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &min1, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelLabel: "pod-defaults"}}}}
	if _, err := e.admin.PolicyV1().PodDisruptionBudgets(sm.ExternalID()).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	policy, err := policyv1client.NewForConfig(p.rest)
	if err != nil {
		t.Fatal(err)
	}
	err = policy.Evictions(sm.ExternalID()).Evict(t.Context(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "pod-defaults", Namespace: sm.ExternalID()}})
	took := time.Since(start)
	if err = classify(err, "evicting"); !errors.Is(err, drivers.ErrRateLimited) || drivers.RetryAfter(err) != 10*time.Second || took > 5*time.Second {
		t.Errorf("a 429: %v after %s (retry after %s); want drivers.ErrRateLimited at once, retry after 10s", err, took, drivers.RetryAfter(err))
	}
}
