package kubernetes

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/k8stest"
)

// stack is the package's Kubernetes stack (both test packages of the
// directory share it: TestStack).
var stack k8stest.Shared

func TestMain(m *testing.M) { os.Exit(stack.Run(m)) }

// TestStack is the stack, for the tests of package kubernetes_test.
var TestStack = &stack

var providerSeq atomic.Int64

var notName = regexp.MustCompile(`[^a-z0-9]+`)

// ProviderName is a provider name of the test's own: the driver lists and
// cleans up the namespaces labelled with its provider's name, so tests
// that share the stack do not see each other's.
func ProviderName(t testing.TB) string {
	base := strings.Trim(notName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 30 {
		base = strings.TrimRight(base[:30], "-")
	}
	return fmt.Sprintf("%s-%d", base, providerSeq.Add(1))
}

// env is a provider of the test's own on the stack.
type env struct {
	t     *testing.T
	s     *k8stest.Stack
	name  string // the provider's
	cfg   *config.Config
	admin k8s.Interface
}

// A node with GPUs (of resource example.com/gpu), beside kwok-node-0.
var (
	gpuNodeOnce sync.Once
	gpuNodeErr  error
)

// newEnv parses nodepool.yaml (its %[1]s is the provider's name) and
// returns the test's environment.
func newEnv(t *testing.T, yaml string) *env {
	t.Helper()
	s := stack.Get(t)
	gpuNodeOnce.Do(func() {
		gpuNodeErr = s.AddNode(context.Background(), "kwok-gpu-0", corev1.ResourceList{"example.com/gpu": resource.MustParse("8")})
	})
	if gpuNodeErr != nil {
		t.Fatal(gpuNodeErr)
	}
	name := ProviderName(t)
	cfg, err := config.Parse("nodepool.yaml", []byte(fmt.Sprintf(yaml, name)))
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, s: s, name: name, cfg: cfg, admin: s.Client}
}

// provider makes a driver of the provider, as one process would.
func (e *env) provider() *Provider {
	e.t.Helper()
	pc, ok := e.cfg.Provider(e.name)
	if !ok {
		e.t.Fatalf("the configuration has no provider %s", e.name)
	}
	p, err := NewForConfig(pc, e.s.Config(), Options{PollInterval: 50 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// request is what the launcher asks for a node of a label of pool main.
func (e *env) request(node, label string, attempt int) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: node, Hostname: "np" + node, Provider: e.name, Pool: "main", Label: label, Attempt: attempt,
		Tags: map[string]string{drivers.TagProvider: e.name, drivers.TagPool: "main", drivers.TagNode: node, drivers.TagLabel: label}}
}

var nodeSeq atomic.Int64

// nodeID is a fresh node id, as the launcher's (13 of [0-9a-z]).
func nodeID() string { return fmt.Sprintf("t%012d", nodeSeq.Add(1)) }

// advance runs a machine until it is done or fails, as the launcher does
// (waiting as it asks), within a deadline.
func advance(t *testing.T, sm drivers.StateMachine) (drivers.Step, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for {
		step, err := sm.Advance(ctx)
		if err != nil || step.Done {
			return step, err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the machine did not finish: %s", sm.State())
		case <-time.After(step.Wait):
		}
	}
}

// mustCreate runs a create to its end.
func (e *env) mustCreate(p *Provider, req drivers.CreateRequest) *drivers.Instance {
	e.t.Helper()
	sm, err := p.Create(req, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	step, err := advance(e.t, sm)
	if err != nil {
		e.t.Fatalf("creating node %s (%s): %v", req.NodeID, req.Label, err)
	}
	e.t.Cleanup(func() {
		_ = e.admin.CoreV1().Namespaces().Delete(context.Background(), step.Instance.ExternalID, metav1.DeleteOptions{})
	})
	return step.Instance
}

// advanceTo runs a machine until its state's step is step.
func advanceTo(t *testing.T, sm drivers.StateMachine, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for stepOf(sm) != step {
		st, err := sm.Advance(ctx)
		if err != nil || st.Done {
			t.Fatalf("before step %q: done %v, %v (state %s)", step, st.Done, err, sm.State())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("step %q not reached: %s", step, sm.State())
		case <-time.After(st.Wait):
		}
	}
}

func stepOf(sm drivers.StateMachine) string {
	switch m := sm.(type) {
	case *createMachine:
		return m.st.Step
	case *deleteMachine:
		return m.st.Step
	}
	return ""
}

// UntilNamespace waits, on the API server's watch of one namespace, until
// cond holds of it (nil: it does not exist), within timeout.
func UntilNamespace(t testing.TB, cl k8s.Interface, name string, timeout time.Duration, cond func(*corev1.Namespace) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *corev1.Namespace
	for ctx.Err() == nil {
		list, err := cl.CoreV1().Namespaces().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
		if err != nil {
			break
		}
		last = nil
		if len(list.Items) == 1 {
			last = &list.Items[0]
		}
		if cond(last) {
			return
		}
		w, err := cl.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: list.ResourceVersion})
		if err != nil {
			break
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Deleted:
				last = nil
			case watch.Added, watch.Modified:
				last, _ = ev.Object.(*corev1.Namespace)
			default:
				continue
			}
			if cond(last) {
				w.Stop()
				return
			}
		}
		w.Stop()
	}
	t.Fatalf("namespace %s: not as wanted within %s (last seen: %v)", name, timeout, describeNS(last))
}

func describeNS(ns *corev1.Namespace) string {
	if ns == nil {
		return "gone"
	}
	return fmt.Sprintf("%s, deleting %v, labels %v", ns.Status.Phase, ns.DeletionTimestamp != nil, ns.Labels)
}

// UntilPod waits, on the API server's watch of one pod, until cond holds
// of it (nil: it does not exist), within timeout.
func UntilPod(t testing.TB, cl k8s.Interface, ns, name string, timeout time.Duration, cond func(*corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	var last *corev1.Pod
	for ctx.Err() == nil {
		list, err := cl.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			break
		}
		last = nil
		if len(list.Items) == 1 {
			last = &list.Items[0]
		}
		if cond(last) {
			return
		}
		w, err := cl.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			break
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Deleted:
				last = nil
			case watch.Added, watch.Modified:
				last, _ = ev.Object.(*corev1.Pod)
			default:
				continue
			}
			if cond(last) {
				w.Stop()
				return
			}
		}
		w.Stop()
	}
	state := "gone"
	if last != nil {
		state = podSummary(last)
	}
	t.Fatalf("pod %s/%s: not as wanted within %s (last seen: %s)", ns, name, timeout, state)
}

// gone is a condition of UntilNamespace and UntilPod.
func gone[T any](x *T) bool { return x == nil }
