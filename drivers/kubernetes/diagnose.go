package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Diagnose says why a launch attempt did not finish: what the pod's
// status shows (not scheduled and why, an image it cannot pull), whether
// the token was ever filled in, and the namespace's last warning events.
func (p *Provider) Diagnose(ctx context.Context, req drivers.CreateRequest, externalID string) string {
	cl := p.client.CoreV1()
	var lines []string
	if _, pl, err := p.cfg.PoolLabel(req.Pool, req.Label); err == nil && isPod(pl) {
		name := podName(pl.Name)
		pod, err := cl.Pods(externalID).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			lines = append(lines, fmt.Sprintf("pod %s/%s: %s", externalID, name, podSummary(pod)))
		case ctx.Err() == nil:
			lines = append(lines, fmt.Sprintf("pod %s/%s: %v", externalID, name, err))
		}
	}
	if sec, err := cl.Secrets(externalID).Get(ctx, User, metav1.GetOptions{}); err == nil && len(sec.Data[corev1.ServiceAccountTokenKey]) == 0 {
		lines = append(lines, fmt.Sprintf("the token Secret %s/%s has no token yet: Kubernetes' token controller (kube-controller-manager) fills it in", externalID, User))
	}
	if evs, err := cl.Events(externalID).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"}); err == nil {
		items := evs.Items
		slices.SortFunc(items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
		if len(items) > 5 {
			items = items[len(items)-5:]
		}
		for _, e := range items {
			lines = append(lines, fmt.Sprintf("event %s %s/%s: %s", e.Reason, strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, e.Message))
		}
	}
	return strings.Join(lines, "\n")
}
