package k8stest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
)

// stack is this package's Kubernetes stack.
var stack k8stest.Shared

func TestMain(m *testing.M) { os.Exit(stack.Run(m)) }

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	waitfor.UntilErr(t, timeout, what, cond, waitfor.Every(50*time.Millisecond))
}

// TestVersions: the constants are the versions the tools modules pin, and
// the server and kubectl are of that release.
func TestVersions(t *testing.T) {
	for file, want := range map[string]string{
		"../../tools/k8s/go.mod":  `k8s.io/kubernetes ` + regexp.QuoteMeta(k8stest.Version) + `\b`,
		"../../tools/kwok/go.mod": `sigs.k8s.io/kwok ` + regexp.QuoteMeta(k8stest.KwokVersion) + `\b`,
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^(require )?\s*` + want).Match(b) {
			t.Errorf("%s does not require %s", file, want)
		}
	}
	s := stack.Get(t)
	v, err := s.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != k8stest.Version {
		t.Errorf("server version %s, want %s", v.GitVersion, k8stest.Version)
	}
	kv, err := s.KubectlVersion(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if kv != k8stest.Version {
		t.Errorf("kubectl version %s, want %s", kv, k8stest.Version)
	}
}

// TestMissingTools: without the binaries, starting fails at once and says
// how to build them.
func TestMissingTools(t *testing.T) {
	t.Setenv("NODEPOOL_K8S_TOOLS", t.TempDir())
	_, err := k8stest.Start(t.Context(), t.TempDir())
	if !errors.Is(err, k8stest.ErrNotBuilt) || !strings.Contains(err.Error(), k8stest.BuildCommand) {
		t.Fatalf("Start without the tools: %v; want ErrNotBuilt naming %s", err, k8stest.BuildCommand)
	}
	t.Log(err)
}

// TestStartFailure: a process that exits at start fails Start, and the
// error holds what it logged.
func TestStartFailure(t *testing.T) {
	bin := t.TempDir()
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"} {
		if err := os.WriteFile(bin+"/"+b, []byte("#!/bin/sh\necho \"$0: no disk today\" >&2\nexit 3\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for stamp, text := range map[string]string{".k8s.stamp": "k8s.io/kubernetes " + k8stest.Version, ".kwok.stamp": "sigs.k8s.io/kwok " + k8stest.KwokVersion} {
		if err := os.WriteFile(bin+"/"+stamp, []byte(text+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("NODEPOOL_K8S_TOOLS", filepath.Dir(bin))
	if err := os.Rename(bin, filepath.Join(filepath.Dir(bin), "bin")); err != nil {
		t.Fatal(err)
	}
	_, err := k8stest.Start(t.Context(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "etcd exited") || !strings.Contains(err.Error(), "etcd: no disk today") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Start with an etcd that fails: %v; want its exit and its log", err)
	}
	t.Log(err)
}

// TestServiceAccount does what a driver does to hand out a namespace: a
// ServiceAccount with a Role and a RoleBinding, and its token from the
// TokenRequest API and from a service-account-token Secret; the tokens
// authenticate, the Secret's ca.crt verifies the server, and RBAC holds
// the account to its namespace.
func TestServiceAccount(t *testing.T) {
	t.Parallel()
	s := stack.Get(t)
	ns, other := s.Namespace(t), s.Namespace(t)
	ctx := t.Context()
	c := s.Client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "zuul"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "zuul"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"pods", "pods/exec", "pods/log"},
			Verbs: []string{"get", "list", "watch", "create", "delete"},
		}},
	}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "zuul"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "zuul"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "zuul", Namespace: ns}},
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The TokenRequest API.
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "zuul", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status.Token == "" {
		t.Fatal("TokenRequest gave no token")
	}
	checkToken(t, s, tr.Status.Token, s.CA, ns, other)

	// A service-account-token Secret, which the controller manager fills in.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "zuul-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "zuul"}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Secret's token", 30*time.Second, func(ctx context.Context) (bool, error) {
		secret, err = c.CoreV1().Secrets(ns).Get(ctx, "zuul-token", metav1.GetOptions{})
		return err == nil && len(secret.Data[corev1.ServiceAccountTokenKey]) > 0, err
	})
	if string(secret.Data[corev1.ServiceAccountRootCAKey]) != string(s.CA) {
		t.Errorf("the Secret's ca.crt is not the stack's CA:\n%s", secret.Data[corev1.ServiceAccountRootCAKey])
	}
	checkToken(t, s, string(secret.Data[corev1.ServiceAccountTokenKey]), secret.Data[corev1.ServiceAccountRootCAKey], ns, other)
}

// checkToken: a client with the token, verifying the server with ca, may
// list pods in ns but not in other, nor list namespaces.
func checkToken(t *testing.T, s *k8stest.Stack, token string, ca []byte, ns, other string) {
	t.Helper()
	sa, err := kubernetes.NewForConfig(&rest.Config{Host: s.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing pods of %s with the token: %v", ns, err)
	}
	if _, err := sa.CoreV1().Pods(other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing pods of %s with the token: %v; want forbidden", other, err)
	}
	if _, err := sa.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing namespaces with the token: %v; want forbidden", err)
	}
	sar, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + ns + ":zuul"; sar.Status.UserInfo.Username != want {
		t.Errorf("the token is %q, want %q", sar.Status.UserInfo.Username, want)
	}
}

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "docker.io/library/debian:bookworm", Command: []string{"sleep", "infinity"},
		}}},
	}
}

// waitRunning waits until the pod is Running and Ready with a node and an
// IP, and returns it.
func waitRunning(t *testing.T, c kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, "pod "+name+" Running", 60*time.Second, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready := slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		})
		return pod.Status.Phase == corev1.PodRunning && ready && pod.Status.PodIP != "" && pod.Spec.NodeName != "", nil
	})
	return pod
}

// TestPodRuns: a pod is scheduled on the kwok node and Running with an IP;
// deleted, it goes away.
func TestPodRuns(t *testing.T) {
	t.Parallel()
	s := stack.Get(t)
	ns := s.Namespace(t)
	start := time.Now()
	if _, err := s.Client.CoreV1().Pods(ns).Create(t.Context(), testPod("node"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitRunning(t, s.Client, ns, "node")
	t.Logf("pod Running on %s with IP %s after %s", pod.Spec.NodeName, pod.Status.PodIP, time.Since(start).Round(time.Millisecond))
	if pod.Spec.NodeName != "kwok-node-0" {
		t.Errorf("pod on node %q, want kwok-node-0", pod.Spec.NodeName)
	}
	if err := s.Client.CoreV1().Pods(ns).Delete(t.Context(), "node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod gone", 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := s.Client.CoreV1().Pods(ns).Get(ctx, "node", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// TestNamespaceDeletion: a namespace with a running pod, deleted, is gone
// once its pod is.
func TestNamespaceDeletion(t *testing.T) {
	t.Parallel()
	s := stack.Get(t)
	ns := s.Namespace(t)
	ctx := t.Context()
	if _, err := s.Client.CoreV1().Pods(ns).Create(ctx, testPod("node"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, s.Client, ns, "node")
	start := time.Now()
	if err := s.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace "+ns+" gone", 90*time.Second, func(ctx context.Context) (bool, error) {
		_, err := s.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	t.Logf("namespace gone %s after its deletion", time.Since(start).Round(time.Millisecond))
}

// TestKubectl: kubectl, with nothing but the kubeconfig file, lists the
// namespaces and applies and reads objects.
func TestKubectl(t *testing.T) {
	t.Parallel()
	s := stack.Get(t)
	ns := s.Namespace(t)
	cmd := exec.CommandContext(t.Context(), s.KubectlPath, "--kubeconfig", s.Kubeconfig, "get", "ns", "-o", "name")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "KUBERC=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get ns: %v\n%s", err, out)
	}
	for _, want := range []string{"namespace/default", "namespace/kube-system", "namespace/" + ns} {
		if !slices.Contains(strings.Fields(string(out)), want) {
			t.Errorf("kubectl get ns does not list %s:\n%s", want, out)
		}
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  key: value\n"
	if out, err := s.KubectlOutput(t.Context(), []byte(cm), "apply", "-n", ns, "-f", "-"); err != nil || !strings.Contains(string(out), "configmap/settings created") {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	out, err = s.KubectlOutput(t.Context(), nil, "get", "-n", ns, "configmap", "settings", "-o", "jsonpath={.data.key}")
	if err != nil || string(out) != "value" {
		t.Fatalf("kubectl get configmap: %v %q", err, out)
	}
	// A field the schema does not know is refused.
	bad := strings.Replace(cm, "\ndata:", "\ndta:", 1)
	if _, err := s.KubectlOutput(t.Context(), []byte(bad), "apply", "--dry-run=server", "-n", ns, "-f", "-"); err == nil || !strings.Contains(err.Error(), `unknown field "dta"`) {
		t.Fatalf("kubectl apply of an unknown field: %v; want it refused", err)
	}
}
