package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/record"
)

// Steps of a create, in order; each Advance makes one. Every step makes
// its object under a fixed name or finds it made, so a machine started
// afresh (another process resuming the node) goes through them again
// without making anything twice.
const (
	stepStart     = ""
	stepNamespace = "namespace" // the node's namespace
	stepAccount   = "account"   // its service account, zuul-worker
	stepSecret    = "secret"    // the account's token Secret
	stepRole      = "role"      // a Role and its RoleBinding to the account
	stepPod       = "pod"       // the pod (pod labels)
	stepRunning   = "running"   // until the pod runs
	stepToken     = "token"     // until the token is in the Secret
)

// createState is a create's progress, as stored in driver_data: no
// credential is kept there.
type createState struct {
	Step      string `json:"step,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
}

type createMachine struct {
	p   *Provider
	req drivers.CreateRequest
	st  createState
}

// Create returns a machine that makes the namespace (and pod) of one node;
// state is a stored createState (nil: start afresh).
func (p *Provider) Create(req drivers.CreateRequest, state json.RawMessage) (drivers.StateMachine, error) {
	if _, _, err := p.cfg.PoolLabel(req.Pool, req.Label); err != nil {
		return nil, err
	}
	m := &createMachine{p: p, req: req}
	if len(state) > 0 && string(state) != "null" {
		if err := json.Unmarshal(state, &m.st); err != nil {
			return nil, fmt.Errorf("kubernetes: resuming the create of node %s: %w", req.NodeID, err)
		}
		if m.st.Namespace != "" && m.st.Namespace != namespaceName(req.Pool, req.NodeID, req.Attempt) {
			return nil, fmt.Errorf("kubernetes: resuming the create of node %s: its state names namespace %q, not this attempt's", req.NodeID, m.st.Namespace)
		}
	}
	return m, nil
}

func (m *createMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

// ExternalID is the namespace, once the machine may have made it.
func (m *createMachine) ExternalID() string { return m.st.Namespace }

// Advance makes the next step. A call of unknown outcome is
// drivers.ErrUncertain: the step is made again, and finds what the call
// made.
func (m *createMachine) Advance(ctx context.Context) (drivers.Step, error) {
	pool, pl, err := m.p.cfg.PoolLabel(m.req.Pool, m.req.Label)
	if err != nil {
		return drivers.Step{}, err
	}
	switch m.st.Step {
	case stepStart:
		m.st = createState{Step: stepNamespace, Namespace: namespaceName(m.req.Pool, m.req.NodeID, m.req.Attempt)}
		if isPod(pl) {
			m.st.Pod = podName(pl.Name)
		}
		return drivers.Step{}, nil
	case stepNamespace:
		return m.advanceTo(stepAccount, m.createNamespace(ctx, pool, pl))
	case stepAccount:
		return m.advanceTo(stepSecret, m.createAccount(ctx))
	case stepSecret:
		return m.advanceTo(stepRole, m.createSecret(ctx))
	case stepRole:
		next := stepToken
		if isPod(pl) {
			next = stepPod
		}
		return m.advanceTo(next, m.createRole(ctx, isPod(pl)))
	case stepPod:
		return m.advanceTo(stepRunning, m.createPod(ctx, pl))
	case stepRunning:
		return m.waitRunning(ctx)
	case stepToken:
		return m.waitToken(ctx, pl)
	}
	return drivers.Step{}, fmt.Errorf("kubernetes: unknown create step %q", m.st.Step)
}

// advanceTo goes on to the next step once this one is made (err is nil),
// and fails otherwise.
func (m *createMachine) advanceTo(next string, err error) (drivers.Step, error) {
	if err != nil {
		return drivers.Step{}, err
	}
	m.st.Step = next
	return drivers.Step{}, nil
}

// createAccount makes the node's service account, or finds it made.
func (m *createMachine) createAccount(ctx context.Context) error {
	ns := m.st.Namespace
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: User}}
	if _, err := m.p.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify(err, "creating service account "+ns+"/"+User)
	}
	return nil
}

// createSecret makes the account's token Secret, or finds it made. A
// token that does not expire, as Nodepool's: the node may be held for
// days. kube-controller-manager fills it in.
func (m *createMachine) createSecret(ctx context.Context) error {
	ns := m.st.Namespace
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: User, Annotations: map[string]string{corev1.ServiceAccountNameKey: User}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}
	if _, err := m.p.client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify(err, "creating the token Secret "+ns+"/"+User)
	}
	return nil
}

// waitRunning waits until the pod runs; a pod that vanished or ended
// fails the attempt.
func (m *createMachine) waitRunning(ctx context.Context) (drivers.Step, error) {
	ns := m.st.Namespace
	pod, err := m.p.client.CoreV1().Pods(ns).Get(ctx, m.st.Pod, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return drivers.Step{}, fmt.Errorf("%w: pod %s/%s vanished before it ran", drivers.ErrNotFound, ns, m.st.Pod)
		}
		return drivers.Step{}, classify(err, "reading pod "+ns+"/"+m.st.Pod)
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		m.st.Step = stepToken
		return drivers.Step{}, nil
	case corev1.PodFailed, corev1.PodSucceeded:
		return drivers.Step{}, fmt.Errorf("pod %s/%s ended before the node was ready: %s", ns, m.st.Pod, podSummary(pod))
	}
	// Pending: scheduled, pulling the image, or waiting for room;
	// the launcher's boot-timeout ends the wait, and Diagnose says
	// which.
	return drivers.Step{Wait: m.p.poll}, nil
}

// waitToken waits until the token and CA certificate are in the token
// Secret; then the node is ready.
func (m *createMachine) waitToken(ctx context.Context, pl *config.PoolLabel) (drivers.Step, error) {
	ns := m.st.Namespace
	sec, err := m.p.client.CoreV1().Secrets(ns).Get(ctx, User, metav1.GetOptions{})
	if err != nil {
		return drivers.Step{}, classify(err, "reading the token Secret "+ns+"/"+User)
	}
	token, ca := sec.Data[corev1.ServiceAccountTokenKey], sec.Data[corev1.ServiceAccountRootCAKey]
	if len(token) == 0 || len(ca) == 0 {
		return drivers.Step{Wait: m.p.poll}, nil
	}
	inst := m.instance(pl, string(token), ca)
	return drivers.Step{Done: true, Instance: &inst}, nil
}

// instance is the node's namespace as the launcher records it.
func (m *createMachine) instance(pl *config.PoolLabel, token string, ca []byte) drivers.Instance {
	p := m.p
	acc := &record.KubernetesAccess{Name: m.st.Namespace, Namespace: m.st.Namespace, Host: p.Host(), SkipTLS: p.rest.Insecure,
		Token: token, User: User}
	if !acc.SkipTLS {
		acc.CACert = base64.StdEncoding.EncodeToString(ca)
	}
	inst := drivers.Instance{
		ExternalID: m.st.Namespace, Name: m.st.Namespace, Tags: maps.Clone(m.req.Tags),
		ConnectionType: ConnectionNamespace, PythonPath: pl.KubePythonPath, ShellType: pl.KubeShellType,
		Cloud: p.cfg.Context, Kubernetes: acc, Resources: labelResources(pl), Run: drivers.Running, Status: "namespace Active",
	}
	if m.st.Pod != "" {
		acc.Pod = m.st.Pod
		inst.ConnectionType, inst.InterfaceIP, inst.Status = ConnectionKubectl, m.st.Pod, "pod Running"
	}
	return inst
}

func isPod(pl *config.PoolLabel) bool { return pl.KubernetesLabel.Type == "pod" }

// kubeLabels are the labels of the node's namespace and pod: the label's
// labels, its dynamic-labels filled from the request, and the driver's
// (node, provider, pool, label).
func (m *createMachine) kubeLabels(pl *config.PoolLabel) map[string]string {
	out := maps.Clone(pl.KubeLabels)
	if out == nil {
		out = map[string]string{}
	}
	for k, tmpl := range pl.DynamicLabels {
		v, err := config.ExpandRequestTemplate(tmpl, m.req.Request.Field)
		if err != nil {
			// As Nodepool: a label that cannot be made is left out.
			m.p.log.Warn("dynamic label left out", "node", m.req.NodeID, "label", k, "err", err)
			continue
		}
		out[k] = v
	}
	maps.Copy(out, m.p.ownLabels(m.req.NodeID, m.req.Pool, pl.Name))
	return out
}

// ownLabels are the labels the driver finds its namespaces and pods by.
func (p *Provider) ownLabels(nodeID, pool, label string) map[string]string {
	return map[string]string{LabelNode: labelValue(nodeID), LabelProvider: labelValue(p.cfg.Name),
		LabelPool: labelValue(pool), LabelLabel: labelValue(label)}
}

// createNamespace makes the node's namespace, or finds it made by this
// attempt before (labelled with this node and provider); a namespace of
// that name that is not, or is being deleted, fails the attempt.
func (m *createMachine) createNamespace(ctx context.Context, pool *config.Pool, pl *config.PoolLabel) error {
	cl := m.p.client
	annotations := map[string]string{LabelNode: m.req.NodeID, LabelProvider: m.p.cfg.Name, LabelPool: pool.Name, LabelLabel: pl.Name}
	if m.st.Pod != "" {
		annotations[AnnotationPod] = m.st.Pod
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.st.Namespace, Labels: m.kubeLabels(pl), Annotations: annotations}}
	_, err := cl.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return classify(err, "creating namespace "+m.st.Namespace)
	}
	got, err := cl.CoreV1().Namespaces().Get(ctx, m.st.Namespace, metav1.GetOptions{})
	if err != nil {
		return classify(err, "reading namespace "+m.st.Namespace)
	}
	if !m.p.owned(got.Labels, m.req.NodeID) {
		return fmt.Errorf("namespace %s exists and is not this node's (labels %v)", m.st.Namespace, got.Labels)
	}
	if got.DeletionTimestamp != nil {
		return fmt.Errorf("namespace %s is being deleted", m.st.Namespace)
	}
	return nil
}

// owned reports whether labels mark an object as the node's, made by
// this provider.
func (p *Provider) owned(labels map[string]string, nodeID string) bool {
	return labels[LabelNode] == labelValue(nodeID) && labels[LabelProvider] == labelValue(p.cfg.Name)
}

// The verbs the node's account has, as Nodepool grants them.
var allVerbs = []string{"create", "delete", "get", "list", "patch", "update", "watch"}

// createRole gives the node's account its rights in the namespace, as
// Nodepool does: a namespace label's may manage pods, services, config
// maps, secrets and the like (Role zuul); a pod label's may read pods, and
// exec into, read the logs of and port-forward to them (zuul-restricted;
// Nodepool's names pods/logs, which is no subresource, so the logs are
// granted as pods/log too).
func (m *createMachine) createRole(ctx context.Context, restricted bool) error {
	cl := m.p.client.RbacV1()
	ns := m.st.Namespace
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "zuul"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""},
		Resources: []string{"pods", "pods/exec", "pods/log", "pods/portforward", "services", "endpoints", "crontabs", "jobs",
			"deployments", "replicasets", "configmaps", "secrets"},
		Verbs: allVerbs,
	}}}
	if restricted {
		role = &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "zuul-restricted"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: allVerbs},
			{APIGroups: []string{""}, Resources: []string{"pods/log", "pods/logs"}, Verbs: allVerbs},
			{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: allVerbs},
		}}
	}
	if _, err := cl.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify(err, "creating role "+ns+"/"+role.Name)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "zuul-role"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: User, Namespace: ns}},
	}
	if _, err := cl.RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify(err, "creating role binding "+ns+"/zuul-role")
	}
	return nil
}
