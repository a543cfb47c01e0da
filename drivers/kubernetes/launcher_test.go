package kubernetes_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/client"
	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/kubernetes"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/k8stest"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
	"github.com/nodepool-nats/nodepool/service"
	"github.com/nodepool-nats/nodepool/web"
)

// site is a nodepool process (service.Start: the launcher role, its
// drivers made from the configuration as `nodepool run` makes them, its
// metrics) on a real nats-server, whose kubernetes provider is the
// package's Kubernetes stack, reached through the kubeconfig's context
// k8stest; and its status port (the dashboard, /node-list).
type site struct {
	t        *testing.T
	k8s      *k8stest.Stack
	provider string
	p        *service.Process
	http     *httptest.Server
	client   *client.Client
	nodes    *kv.Cache[kv.Node]
	reqs     *kv.Cache[kv.Request]
}

// kubeconfig points every process of the tests at the stack's kubeconfig,
// as $KUBECONFIG does for `nodepool run` (the tests share the one stack).
var kubeconfig sync.Once

func testLog() *slog.Logger {
	if os.Getenv("NODEPOOL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startSite starts a process with nodepool.yaml, whose %[1]s is the
// provider's name (the test's own).
func startSite(t *testing.T, yaml string) *site {
	t.Helper()
	k := kubernetes.TestStack.Get(t)
	kubeconfig.Do(func() { os.Setenv("KUBECONFIG", k.Kubeconfig) })
	name := kubernetes.ProviderName(t)
	cfg, err := config.Parse("nodepool.yaml", []byte(fmt.Sprintf(yaml, name)))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	s := config.Settings{NatsURL: srv.ClientURL(), DataDir: t.TempDir(), Roles: []string{config.RoleLauncher},
		ID: "k8s-" + name, Replicas: 1, LeaseTTL: 2 * time.Second, SyncInterval: 200 * time.Millisecond}
	log := testLog()
	p, err := service.Start(t.Context(), s, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	views := web.NewViews(p.JetStream(), p.Buckets(), web.Views{Nodes: p.Launcher().Nodes(),
		Requests: p.Launcher().Requests(), Components: p.Launcher().Components()}, log)
	wg.Go(func() { views.Run(ctx) })
	wg.Go(func() { _ = p.Run(ctx) })
	hs := httptest.NewServer(web.Handler(web.Options{Views: views, Config: func() *config.Config { return cfg }, Ready: p.Ready, Alive: p.Alive,
		ID: s.ID, Roles: s.Roles, Connected: p.Conn().IsConnected, Log: log}))
	c, err := client.New(t.Context(), p.Conn())
	if err != nil {
		t.Fatal(err)
	}
	st := &site{t: t, k8s: k, provider: name, p: p, http: hs, client: c,
		nodes: kv.NewCache(c.Buckets().Nodes, log), reqs: kv.NewCache(c.Buckets().Requests, log)}
	wg.Go(func() { _ = st.nodes.Run(ctx) })
	wg.Go(func() { _ = st.reqs.Run(ctx) })
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		wg.Wait()
		p.Close()
	})
	st.until(30*time.Second, "the process ready", func() bool { return p.Ready() == nil })
	return st
}

// until checks cond at every change of the node and request records (and
// of the component records, which say a pool waits on quota), until the
// deadline.
func (s *site) until(timeout time.Duration, what string, cond func() bool) {
	s.t.Helper()
	comps := s.p.Launcher().Components()
	sn, sr, sc := s.nodes.Subscribe(), s.reqs.Subscribe(), comps.Subscribe()
	defer s.nodes.Unsubscribe(sn)
	defer s.reqs.Unsubscribe(sr)
	defer comps.Unsubscribe(sc)
	waitfor.Until(s.t, timeout, what, cond, waitfor.Changes(sn), waitfor.Changes(sr), waitfor.Changes(sc), waitfor.Detail(func() string {
		var b strings.Builder
		s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			fmt.Fprintf(&b, "  node %s %s %v alloc=%s ext=%s reason=%q\n", e.Key, e.Value.State, e.Value.Labels, e.Value.AllocatedTo, e.Value.ExternalID, e.Value.Reason)
			return true
		})
		s.reqs.Range(func(e *kv.Entry[kv.Request]) bool {
			fmt.Fprintf(&b, "  request %s %s %v reason=%q\n", e.Key, e.Value.State, e.Value.Nodes, e.Value.Reason)
			return true
		})
		return b.String()
	}))
}

// node is a node record as the process's cache has it.
func (s *site) node(id string) (kv.Node, bool) {
	e, ok := s.nodes.Get(id)
	return e.Value, ok
}

// get fetches a path of the status port.
func (s *site) get(path, accept string) string {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodGet, s.http.URL+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("GET %s: %s: %s", path, resp.Status, body)
	}
	return string(body)
}

// dashboardNodes is the first message of the dashboard's event stream:
// every record the page shows.
func (s *site) dashboardNodes() map[string]map[string]any {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.http.URL+"/dashboard/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var msg struct {
			Nodes map[string]map[string]any `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(data), &msg); err != nil {
			s.t.Fatalf("dashboard message %s: %v", data, err)
		}
		return msg.Nodes
	}
	s.t.Fatalf("no dashboard message: %v", sc.Err())
	return nil
}

// metricReaches waits, within a deadline, until a metric of the process
// adds up to want (a counter moves with no record to watch).
func metricReaches(t *testing.T, m *metrics.Registry, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	if !waitfor.True(10*time.Second, func() bool { got = m.Sum(name, labels...); return got == want }) {
		t.Errorf("%s{%s} = %v, want %v", name, strings.Join(labels, ","), got, want)
	}
}

const siteConfig = `
labels: [{name: k8s-namespace}, {name: pod-fedora}]
providers:
  - name: %[1]s
    driver: kubernetes
    context: k8stest
    pools:
      - name: main
        max-servers: 4
        node-attributes: {executor-zone: k8s}
        labels:
          - name: k8s-namespace
            type: namespace
          - name: pod-fedora
            type: pod
            image: docker.io/fedora:40
            cpu: 1
            memory: 256
`

// A request for a namespace and a pod, served through the launcher: the
// node records carry what reaches them (the API server, the token, the
// CA, the namespace and pod) and kubectl works with it; the dashboard and
// node-list (what `nodepool list` prints) show them, without the token;
// the metrics count the launches and the driver's calls; returning the
// nodes deletes their namespaces.
func TestLauncherServesNamespaceAndPod(t *testing.T) {
	t.Parallel()
	s := startSite(t, siteConfig)
	nodes, err := s.client.Request(t.Context(), events.RequestMessage{Labels: []string{"k8s-namespace", "pod-fedora"}, Requestor: "test"}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 {
		t.Fatalf("nodes %+v", nodes)
	}
	nsNode, podNode := nodes[0], nodes[1]
	for _, n := range nodes {
		acc := n.Kubernetes
		if n.State != kv.NodeInUse || n.Provider != s.provider || n.Cloud != "k8stest" || acc == nil || acc.Token == "" ||
			acc.Host != s.k8s.Server || acc.Namespace != n.ExternalID || acc.User != kubernetes.User || acc.CACert == "" ||
			n.Hostname != n.ExternalID || n.ConnectionPort != 0 || n.PythonPath != "auto" || n.Attributes["executor-zone"] != "k8s" {
			t.Errorf("node %+v, credentials %+v", n, acc)
			continue
		}
		if _, err := s.k8s.Client.CoreV1().Namespaces().Get(t.Context(), n.ExternalID, metav1.GetOptions{}); err != nil {
			t.Errorf("node %s's namespace: %v", n.ID, err)
		}
	}
	if nsNode.ConnectionType != "namespace" || nsNode.InterfaceIP != "" || nsNode.Kubernetes.Pod != "" {
		t.Errorf("namespace node %+v", nsNode)
	}
	if podNode.ConnectionType != "kubectl" || podNode.InterfaceIP != "pod-fedora" || podNode.Kubernetes.Pod != "pod-fedora" ||
		podNode.Resources.Cores != 1 || podNode.Resources.RAM != 256 {
		t.Errorf("pod node %+v", podNode)
	}
	// With what the records carry, kubectl reaches each node as Zuul's
	// executor does.
	kc := kubernetes.Kubeconfig(t, podNode.Kubernetes)
	if out, err := kubernetes.Kubectl(t, s.k8s, kc, "get", "pod", podNode.Kubernetes.Pod, "-o", "jsonpath={.status.phase}"); err != nil || out != "Running" {
		t.Errorf("kubectl get pod with the pod node's record: %q, %v", out, err)
	}
	kc = kubernetes.Kubeconfig(t, nsNode.Kubernetes)
	if out, err := kubernetes.Kubectl(t, s.k8s, kc, "create", "configmap", "job", "--from-literal=a=b"); err != nil {
		t.Errorf("kubectl create configmap with the namespace node's record: %q, %v", out, err)
	}

	// node-list (the web API's, and what `nodepool list` prints) and the
	// dashboard show both, and never a token.
	list := s.get("/node-list", "application/json")
	dash := s.dashboardNodes()
	for _, n := range nodes {
		if !strings.Contains(list, `"`+n.ID+`"`) || !strings.Contains(list, n.ExternalID) {
			t.Errorf("node-list lacks node %s (%s):\n%s", n.ID, n.ExternalID, list)
		}
		if strings.Contains(list, n.Kubernetes.Token) {
			t.Errorf("node-list shows node %s's token", n.ID)
		}
		d := dash[n.ID]
		if d == nil || d["provider"] != s.provider || d["external_id"] != n.ExternalID || d["state"] != "in-use" {
			t.Errorf("the dashboard shows node %s as %v", n.ID, d)
		}
	}
	if text := s.get("/node-list", "text/plain"); !strings.Contains(text, podNode.ExternalID) || !strings.Contains(text, s.provider) {
		t.Errorf("node-list as text:\n%s", text)
	}
	m := s.p.Metrics()
	if n := m.Sum("nodepool_launch_duration_seconds", "provider="+s.provider, "result=ready"); n != 2 {
		t.Errorf("%v ready launches counted, want 2", n)
	}
	if n := m.Sum("nodepool_driver_call_duration_seconds", "provider="+s.provider, "method=create"); n < 2 {
		t.Errorf("%v create steps counted", n)
	}

	// Returned, the nodes are deleted, and so are their namespaces.
	for _, n := range nodes {
		if err := s.client.Return(t.Context(), n.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		kubernetes.UntilNamespace(t, s.k8s.Client, n.ExternalID, 60*time.Second, func(ns *corev1.Namespace) bool { return ns == nil })
	}
	s.until(30*time.Second, "the node records deleted", func() bool {
		_, a := s.node(nsNode.ID)
		_, b := s.node(podNode.ID)
		return !a && !b
	})
}

// A namespace labelled as the provider's whose node no record names (its
// launcher died between the create and the record, say) is deleted by the
// cleanup; one of another provider, one without labels and one of a
// Python Nodepool's node (a ZooKeeper id) are left alone.
func TestLeakedNamespaceDeleted(t *testing.T) {
	t.Parallel()
	s := startSite(t, siteConfig)
	mk := func(name string, labels map[string]string) {
		t.Helper()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		if _, err := s.k8s.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.k8s.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	base := strings.ToLower(s.provider)
	leak := "main-leaked" + fmt.Sprint(time.Now().UnixNano()%1e6)
	mk(leak, map[string]string{drivers.TagProvider: s.provider, drivers.TagNode: "0leakednode00", drivers.TagPool: "main"})
	mk(base+"-other", map[string]string{drivers.TagProvider: s.provider + "-other", drivers.TagNode: "0leakednode01"})
	mk(base+"-plain", nil)
	mk(base+"-python", map[string]string{drivers.TagProvider: s.provider, drivers.TagNode: "0000000042"})

	kubernetes.UntilNamespace(t, s.k8s.Client, leak, 60*time.Second, func(ns *corev1.Namespace) bool { return ns == nil })
	for _, name := range []string{base + "-other", base + "-plain", base + "-python"} {
		ns, err := s.k8s.Client.CoreV1().Namespaces().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || ns.DeletionTimestamp != nil {
			t.Errorf("namespace %s, not the provider's leak, is deleted: %v", name, err)
		}
	}
	// The count follows the delete's end, which no record announces.
	metricReaches(t, s.p.Metrics(), 1, "nodepool_leaked_resources_deleted_total", "provider="+s.provider, "kind=instances")
}

const oneServer = `
labels: [{name: pod-fedora}]
providers:
  - name: %[1]s
    driver: kubernetes
    context: k8stest
    pools:
      - name: main
        max-servers: 1
        labels:
          - name: pod-fedora
            type: pod
            image: docker.io/fedora:40
`

// max-servers: with the pool's one pod in use, a second request waits (the
// pool says it waits on quota, and no second namespace is made) until the
// first node is returned, and is then served.
func TestMaxServers(t *testing.T) {
	t.Parallel()
	s := startSite(t, oneServer)
	first, err := s.client.Request(t.Context(), events.RequestMessage{Labels: []string{"pod-fedora"}, Requestor: "test"}, "tester")
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.client.Submit(t.Context(), events.RequestMessage{Labels: []string{"pod-fedora"}, Requestor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s.until(30*time.Second, "the pool waiting on quota, the second request seen", func() bool {
		// The test's cache of requests may lag the launcher's: the
		// request is looked at once this cache has it too.
		if _, ok := s.reqs.Get(id); !ok {
			return false
		}
		paused := false
		s.p.Launcher().Components().Range(func(e *kv.Entry[kv.Component]) bool {
			for _, p := range e.Value.Pools {
				paused = paused || p.Provider == s.provider && p.Paused
			}
			return true
		})
		return paused
	})
	if e, ok := s.reqs.Get(id); !ok || e.Value.Done() {
		t.Fatalf("the second request: %+v", e.Value)
	}
	nss, err := s.k8s.Client.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{LabelSelector: drivers.TagProvider + "=" + s.provider})
	if err != nil || len(nss.Items) != 1 {
		t.Fatalf("the provider's namespaces: %v, %v; want the first node's only", nss, err)
	}
	if err := s.client.Return(t.Context(), first[0].ID); err != nil {
		t.Fatal(err)
	}
	s.until(90*time.Second, "the second request fulfilled", func() bool {
		e, ok := s.reqs.Get(id)
		return ok && e.Value.State == kv.RequestFulfilled
	})
	// The returned node's namespace is gone.
	if _, err := s.k8s.Client.CoreV1().Namespaces().Get(t.Context(), first[0].ExternalID, metav1.GetOptions{}); err == nil {
		t.Errorf("namespace %s of the returned node still exists", first[0].ExternalID)
	}
}

// A ready pod node whose pod died (its container exited, as the kubelet
// reports it) is failed and replaced: nobody gets a dead pod.
func TestDeadPodReplaced(t *testing.T) {
	t.Parallel()
	s := startSite(t, strings.Replace(siteConfig, "labels: [{name: k8s-namespace}, {name: pod-fedora}]",
		"labels: [{name: k8s-namespace}, {name: pod-fedora, min-ready: 1}]", 1))
	var ready kv.Node
	s.until(60*time.Second, "a ready pod node", func() bool {
		found := false
		s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeReady && e.Value.HasLabel("pod-fedora") {
				ready, found = e.Value, true
			}
			return !found
		})
		return found
	})
	pod, err := s.k8s.Client.CoreV1().Pods(ready.ExternalID).Get(t.Context(), "pod-fedora", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What a kubelet writes when the container exits with an error.
	pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "Error"
	for i := range pod.Status.ContainerStatuses {
		pod.Status.ContainerStatuses[i].Ready = false
		pod.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", FinishedAt: metav1.Now()}}
	}
	if _, err := s.k8s.Client.CoreV1().Pods(ready.ExternalID).UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.until(60*time.Second, "the dead node failed and another ready", func() bool {
		n, ok := s.node(ready.ID)
		dead := !ok || n.State == kv.NodeFailed || n.State == kv.NodeDeleting
		other := false
		s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			other = other || e.Key != ready.ID && e.Value.State == kv.NodeReady && e.Value.HasLabel("pod-fedora")
			return !other
		})
		return dead && other
	})
	metricReaches(t, s.p.Metrics(), 1, "nodepool_dead_instances_total", "provider="+s.provider)
	kubernetes.UntilNamespace(t, s.k8s.Client, ready.ExternalID, 60*time.Second, func(ns *corev1.Namespace) bool { return ns == nil })
}

// examples/kubernetes.yaml, which docs/kubernetes.md runs, loads without
// a warning and keeps its min-ready pod ready.
func TestExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/kubernetes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("examples/kubernetes.yaml", data)
	if err != nil || len(cfg.Warnings) > 0 {
		t.Fatalf("%v, warnings %v", err, cfg.Warnings)
	}
	yaml := strings.Replace(string(data), "  - name: k8s\n", "  - name: %[1]s\n", 1)
	if yaml == string(data) {
		t.Fatal("the example's provider is not k8s")
	}
	s := startSite(t, yaml)
	var node kv.Node
	s.until(60*time.Second, "the min-ready pod ready", func() bool {
		ready := false
		s.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			ready = e.Value.State == kv.NodeReady && e.Value.HasLabel("pod-fedora") && e.Value.Kubernetes != nil
			node = e.Value
			return !ready
		})
		return ready
	})
	// The pool's default requests, and no limit set: the limits are the
	// requests, as in Nodepool.
	pod, err := s.k8s.Client.CoreV1().Pods(node.ExternalID).Get(t.Context(), node.Kubernetes.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := pod.Spec.Containers[0].Resources
	for name, want := range map[corev1.ResourceName]string{corev1.ResourceCPU: "1", corev1.ResourceMemory: "512Mi"} {
		req, lim := res.Requests[name], res.Limits[name]
		if req.String() != want || lim.String() != want {
			t.Errorf("%s: request %s, limit %s; want %s both", name, req.String(), lim.String(), want)
		}
	}
}
