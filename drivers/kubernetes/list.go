package kubernetes

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodepool-nats/nodepool/drivers"
)

// selector selects the namespaces and pods this provider made.
func (p *Provider) selector() string {
	return labels.Set{LabelProvider: labelValue(p.cfg.Name)}.String()
}

// ListInstances lists the namespaces this provider made (labelled with its
// name; other namespaces of the cluster are no nodes and hold none of its
// quota), each with the names it was made for and whether it is alive: a
// namespace being deleted is down, and so is a pod label's namespace whose
// pod is gone, ended or being deleted.
func (p *Provider) ListInstances(ctx context.Context) ([]drivers.Instance, error) {
	opts := metav1.ListOptions{LabelSelector: p.selector()}
	nss, err := p.client.CoreV1().Namespaces().List(ctx, opts)
	if err != nil {
		return nil, classify(err, "listing namespaces")
	}
	pods, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		return nil, classify(err, "listing pods")
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		byName[pod.Namespace+"/"+pod.Name] = pod
	}
	out := make([]drivers.Instance, 0, len(nss.Items))
	for i := range nss.Items {
		ns := &nss.Items[i]
		inst := drivers.Instance{ExternalID: ns.Name, Name: ns.Name, Cloud: p.cfg.Context, Tags: p.tags(ns), Resources: drivers.Resources{Instances: 1}}
		if _, pl, err := p.cfg.PoolLabel(inst.Tags[drivers.TagPool], inst.Tags[drivers.TagLabel]); err == nil {
			inst.Resources = labelResources(pl)
		}
		inst.Run, inst.Status = judge(ns, byName[ns.Name+"/"+ns.Annotations[AnnotationPod]])
		out = append(out, inst)
	}
	return out, nil
}

// tags are the names a namespace was made for: its annotations' (the names
// as written), else its labels'.
func (p *Provider) tags(ns *corev1.Namespace) map[string]string {
	tags := map[string]string{}
	for tag, key := range map[string]string{drivers.TagNode: LabelNode, drivers.TagProvider: LabelProvider, drivers.TagPool: LabelPool, drivers.TagLabel: LabelLabel} {
		v, ok := ns.Annotations[key]
		if !ok || labelValue(v) != ns.Labels[key] {
			v = ns.Labels[key]
		}
		if v != "" {
			tags[tag] = v
		}
	}
	return tags
}

// judge says whether a node's namespace (and pod, for a pod label: nil if
// it has none) runs, and in Kubernetes' words how it is.
func judge(ns *corev1.Namespace, pod *corev1.Pod) (drivers.RunState, string) {
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return drivers.Down, "namespace Terminating"
	}
	want := ns.Annotations[AnnotationPod]
	switch {
	case want == "":
		return drivers.Running, "namespace Active"
	case pod == nil:
		return drivers.Down, "pod " + want + " gone"
	case pod.DeletionTimestamp != nil:
		return drivers.Down, "pod " + want + " Terminating"
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		return drivers.Running, "pod Running"
	case corev1.PodPending:
		return drivers.Changing, "pod Pending"
	case corev1.PodFailed, corev1.PodSucceeded:
		why := string(pod.Status.Phase)
		if pod.Status.Reason != "" {
			why += " (" + pod.Status.Reason + ")"
		}
		return drivers.Down, "pod " + strings.TrimSpace(why)
	}
	return drivers.RunUnknown, "pod " + string(pod.Status.Phase)
}
