package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/config"
)

// createPod makes the node's pod, or finds it made before.
func (m *createMachine) createPod(ctx context.Context, pl *config.PoolLabel) error {
	ns := m.st.Namespace
	body, err := json.Marshal(m.podBody(pl))
	if err != nil {
		return fmt.Errorf("label %s: its pod cannot be written as JSON: %w", pl.Name, err)
	}
	// The body goes to the API server as the configuration wrote it (a
	// spec verbatim, as Nodepool sends it): the server checks it and says
	// what it drops (a misspelt field) in a warning, which is logged.
	err = m.p.client.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").
		Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error()
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return classify(err, fmt.Sprintf("creating pod %s/%s", ns, m.st.Pod))
	}
	got, err := m.p.client.CoreV1().Pods(ns).Get(ctx, m.st.Pod, metav1.GetOptions{})
	if err != nil {
		return classify(err, fmt.Sprintf("reading pod %s/%s", ns, m.st.Pod))
	}
	if !m.p.owned(got.Labels, m.req.NodeID) {
		return fmt.Errorf("pod %s/%s exists and is not this node's (labels %v)", ns, m.st.Pod, got.Labels)
	}
	return nil
}

// podBody is the node's pod, as Nodepool's kubernetes driver makes it: the
// label's spec as written, or one container of the label's image that
// sleeps, with the label's resources, env, volume mounts and privilege, on
// a node of its node-selector, by its scheduler-name, with its volumes.
// Unlike Nodepool's, whose restartPolicy is misplaced outside the spec,
// the pod is not restarted when its container ends: the node is then dead
// and is replaced.
func (m *createMachine) podBody(pl *config.PoolLabel) map[string]any {
	kl := &pl.KubernetesLabel
	meta := map[string]any{"name": m.st.Pod, "labels": m.kubeLabels(pl)}
	if len(kl.Annotations) > 0 {
		meta["annotations"] = maps.Clone(kl.Annotations)
	}
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta}
	if kl.Spec != nil {
		pod["spec"] = kl.Spec.Value
		return pod
	}
	spec := map[string]any{"containers": []any{m.podContainer(kl)}, "restartPolicy": "Never"}
	if len(kl.NodeSelector) > 0 {
		spec["nodeSelector"] = maps.Clone(kl.NodeSelector)
	}
	if kl.SchedulerName != "" {
		spec["schedulerName"] = kl.SchedulerName
	}
	if len(kl.Volumes) > 0 {
		spec["volumes"] = rawList(kl.Volumes)
	}
	pod["spec"] = spec
	return pod
}

// podContainer is the one container of a pod made from a label's image:
// it sleeps, with the label's env, resources, volume mounts and privilege.
func (m *createMachine) podContainer(kl *config.KubernetesLabel) map[string]any {
	env := []any{}
	for _, e := range kl.Env {
		env = append(env, map[string]any{"name": e.Name, "value": e.Value})
	}
	container := map[string]any{
		"name":            m.st.Pod,
		"image":           kl.Image,
		"imagePullPolicy": kl.ImagePull,
		"command":         []any{"/bin/sh", "-c"},
		"args":            []any{"while true; do sleep 30; done;"},
		"env":             env,
	}
	if resources := containerResources(kl); len(resources) > 0 {
		container["resources"] = resources
	}
	if len(kl.VolumeMounts) > 0 {
		container["volumeMounts"] = rawList(kl.VolumeMounts)
	}
	if kl.Privileged != nil {
		container["securityContext"] = map[string]any{"privileged": *kl.Privileged}
	}
	return container
}

// containerResources are the requests and limits of a label's container
// (cpu, memory, ephemeral storage, and its GPU as both); empty when the
// label sets none.
func containerResources(kl *config.KubernetesLabel) map[string]any {
	requests, limits := map[string]any{}, map[string]any{}
	if kl.CPU > 0 {
		requests["cpu"] = kl.CPU
	}
	if kl.Memory > 0 {
		requests["memory"] = fmt.Sprintf("%dMi", kl.Memory)
	}
	if kl.Storage > 0 {
		requests["ephemeral-storage"] = fmt.Sprintf("%dM", kl.Storage)
	}
	if kl.CPULimit > 0 {
		limits["cpu"] = kl.CPULimit
	}
	if kl.MemoryLimit > 0 {
		limits["memory"] = fmt.Sprintf("%dMi", kl.MemoryLimit)
	}
	if kl.StorageLimit > 0 {
		limits["ephemeral-storage"] = fmt.Sprintf("%dM", kl.StorageLimit)
	}
	if kl.GPUResource != "" && kl.GPU > 0 {
		requests[kl.GPUResource] = fmt.Sprintf("%.2f", kl.GPU)
		limits[kl.GPUResource] = fmt.Sprintf("%.2f", kl.GPU)
	}
	resources := map[string]any{}
	if len(requests) > 0 {
		resources["requests"] = requests
	}
	if len(limits) > 0 {
		resources["limits"] = limits
	}
	return resources
}

func rawList(l []config.RawYAML) []any {
	out := make([]any, len(l))
	for i, v := range l {
		out[i] = v.Value
	}
	return out
}

// podSummary says what a pod's status shows: its phase, reason and
// message, each condition that does not hold and why, and each container
// that waits or ended and why.
func podSummary(pod *corev1.Pod) string {
	parts := []string{"phase " + string(pod.Status.Phase)}
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		parts = append(parts, strings.TrimSpace(pod.Status.Reason+" "+pod.Status.Message))
	}
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && (c.Reason != "" || c.Message != "") {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Type, strings.TrimSpace(c.Reason+" "+c.Message)))
		}
	}
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("container %s waiting: %s", cs.Name, strings.TrimSpace(cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)))
		case cs.State.Terminated != nil:
			t := cs.State.Terminated
			parts = append(parts, fmt.Sprintf("container %s ended with exit code %d: %s", cs.Name, t.ExitCode, strings.TrimSpace(t.Reason+" "+t.Message)))
		}
	}
	return strings.Join(parts, "; ")
}
