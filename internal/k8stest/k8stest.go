// Package k8stest runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver, kube-controller-manager (the controllers a driver's
// objects need), kube-scheduler and kwok as the kubelet of fake nodes, so
// that pods are scheduled and reach Running with a pod IP, service-account
// token Secrets get their token and deleted namespaces go away. Nothing
// runs containers.
//
// The binaries are built from the Go module proxy by .ci/k8s-tools (see
// Tools); a test that needs them and does not find them fails with that
// command. A test package shares one stack (Shared), on free ports of
// 127.0.0.1 and a directory of its own, and each test works in a
// namespace of its own (Stack.Namespace). Only tests import this package,
// and nodepool-devcloud, which runs a stack for trying the kubernetes
// driver by hand.
package k8stest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodepool-nats/nodepool/internal/freeport"
)

// Version is the Kubernetes release the stack runs (tools/k8s/go.mod
// pins k8s.io/kubernetes at it), and KwokVersion kwok's (tools/kwok).
const (
	Version     = "v1.37.2"
	KwokVersion = "v0.8.0"
)

// BuildCommand builds the binaries, from the repository's root.
const BuildCommand = ".ci/k8s-tools"

// serviceCIDR is the Services' range; its first address is the
// "kubernetes" Service's, which the serving certificate names.
const (
	serviceCIDR = "10.96.0.0/16"
	serviceIP   = "10.96.0.1"
	podCIDR     = "10.244.0.1/16"
)

// controllers are the controllers kube-controller-manager runs: the
// default ServiceAccount of each namespace and its token Secrets, namespace
// deletion, garbage collection, the aggregated ClusterRoles (edit, admin),
// the nodes' not-ready taint and ResourceQuotas' usage.
var controllers = []string{
	"serviceaccount-controller", "serviceaccount-token-controller", "namespace-controller",
	"garbage-collector-controller", "clusterrole-aggregation-controller", "node-lifecycle-controller",
	"resourcequota-controller",
}

// stages is kwok's behaviour: nodes become Ready and keep a heartbeat,
// pods become Running, complete and go away when deleted.
//
//go:embed kwok-stages.yaml
var stages []byte

// binaries are the programs a stack runs, and kubectl.
var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"}

// Tools is the directory that holds the binaries: $NODEPOOL_K8S_TOOLS/bin,
// by default ~/.cache/nodepool/k8s-tools/<Version>/bin, where
// .ci/k8s-tools puts them.
func Tools() string {
	if d := os.Getenv("NODEPOOL_K8S_TOOLS"); d != "" {
		return filepath.Join(d, "bin")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "nodepool", "k8s-tools", Version, "bin")
}

// ErrNotBuilt is returned (wrapped, with what is missing and the command
// that builds it) when the binaries are missing or of other versions.
var ErrNotBuilt = errors.New("the Kubernetes test tools are not built")

// Available checks that every binary is in Tools and was built at
// Version and KwokVersion, as the build's stamps record.
func Available() error {
	dir := Tools()
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%w: %s is not in %s; build them with %s from the repository's root (8-15 min cold on 2 cores, seconds after)", ErrNotBuilt, b, dir, BuildCommand)
		}
	}
	for stamp, want := range map[string]string{".k8s.stamp": "k8s.io/kubernetes " + Version, ".kwok.stamp": "sigs.k8s.io/kwok " + KwokVersion} {
		b, _ := os.ReadFile(filepath.Join(dir, stamp))
		if have, _, _ := strings.Cut(string(b), "\n"); have != want {
			return fmt.Errorf("%w: %s holds %q, not %s; build them again with %s from the repository's root", ErrNotBuilt, dir, have, want, BuildCommand)
		}
	}
	return nil
}

// Stack is a running control plane with kwok and at least one Ready node.
type Stack struct {
	// Server is the API server's URL, https://127.0.0.1:PORT.
	Server string
	// Kubeconfig is the path of an admin's kubeconfig (a static token in
	// group system:masters), and CA the PEM of the CA the serving
	// certificate is verified with (also the ca.crt of service-account
	// token Secrets).
	Kubeconfig string
	CA         []byte
	// KubectlPath is kubectl of the same release; Kubectl runs it.
	KubectlPath string
	// Client is an admin's client.
	Client kubernetes.Interface

	dir    string
	files  *files
	config *rest.Config
	procs  []*process   // in start order
	nsSeq  atomic.Int64 // numbers the namespaces of Namespace
}

// Config is an admin's client configuration (a copy, the caller's to
// change).
func (s *Stack) Config() *rest.Config { return rest.CopyConfig(s.config) }

// Dir is the stack's directory: credentials, data and logs/.
func (s *Stack) Dir() string { return s.dir }

// process is one program of the stack, its output in logs/NAME.log.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	logf *os.File
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts a stack in dir (which it fills and Stop does not remove):
// etcd, then kube-apiserver, once it is ready kube-controller-manager,
// kube-scheduler and kwok, then a node, kwok-node-0; it returns when the
// node is Ready and schedulable. On an error every process it started is
// stopped, and the error holds the end of their logs.
func Start(ctx context.Context, dir string) (*Stack, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	var err error
	// A port found free may be taken before a server binds it; then start
	// again on others.
	for attempt := 0; attempt < 3; attempt++ {
		var s *Stack
		s, err = start(ctx, filepath.Join(dir, fmt.Sprintf("try%d", attempt)))
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	return nil, err
}

var errPortTaken = errors.New("a port was taken")

func start(ctx context.Context, dir string) (_ *Stack, err error) {
	for _, d := range []string{"logs", "etcd", "home"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	ports, err := freeport.Ports(3)
	if err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s := &Stack{dir: dir, Server: fmt.Sprintf("https://127.0.0.1:%d", ports[2]), KubectlPath: filepath.Join(Tools(), "kubectl")}
	if s.files, err = writeFiles(dir, s.Server); err != nil {
		return nil, fmt.Errorf("writing the stack's credentials: %w", err)
	}
	s.Kubeconfig, s.CA = s.files.kubeconfig, s.files.caPEM
	s.config = &rest.Config{
		Host: s.Server, BearerToken: s.files.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.files.caPEM},
		QPS:             200, Burst: 400,
	}
	if s.Client, err = kubernetes.NewForConfig(s.config); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
			err = fmt.Errorf("%w\n%s", err, strings.TrimRight(s.logTails(40), "\n"))
		}
	}()

	if err := s.run("etcd", "--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return nil, err
	}
	plain := &http.Client{Timeout: 2 * time.Second}
	if err := s.waitFor(ctx, "etcd to be healthy", 60*time.Second, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, plain, etcdURL+"/health", "")
	}); err != nil {
		return nil, err
	}

	if err := s.run("kube-apiserver", "--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(ports[2]),
		"--tls-cert-file", s.files.cert, "--tls-private-key-file", s.files.key,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", s.files.saPub, "--service-account-signing-key-file", s.files.saKey,
		"--token-auth-file", s.files.tokens, "--authorization-mode", "Node,RBAC",
		"--service-cluster-ip-range", serviceCIDR, "--profiling=false",
		// As most clusters (kubeadm's, managed ones): privileged
		// containers may be asked for.
		"--allow-privileged=true"); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.files.caPEM)
	secure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer secure.CloseIdleConnections()
	if err := s.waitFor(ctx, "kube-apiserver's /readyz", 120*time.Second, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, secure, s.Server+"/readyz", s.files.adminToken)
	}); err != nil {
		return nil, err
	}
	v, err := s.Client.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("asking kube-apiserver its version: %w", err)
	}
	if v.GitVersion != Version {
		return nil, fmt.Errorf("kube-apiserver says it is %q, not %s: build the tools again with %s", v.GitVersion, Version, BuildCommand)
	}

	kc := s.files.kubeconfig
	if err := s.run("kube-controller-manager", "--kubeconfig", kc, "--leader-elect=false", "--secure-port=0",
		"--controllers", strings.Join(controllers, ","),
		"--service-account-private-key-file", s.files.saKey, "--root-ca-file", s.files.ca); err != nil {
		return nil, err
	}
	if err := s.run("kube-scheduler", "--kubeconfig", kc, "--leader-elect=false", "--secure-port=0"); err != nil {
		return nil, err
	}
	if err := s.run("kwok", "--kubeconfig", kc, "--config", s.files.stages, "--manage-all-nodes=true", "--cidr", podCIDR); err != nil {
		return nil, err
	}
	if err := s.AddNode(ctx, "kwok-node-0", nil); err != nil {
		return nil, err
	}
	// Pods need their namespace's default ServiceAccount, which the
	// controller manager creates.
	if err := s.waitFor(ctx, "the default ServiceAccount", 60*time.Second, func(ctx context.Context) (bool, error) {
		return exists(s.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}))
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// AddNode adds a fake node that kwok runs (32 CPUs, 256 GiB of memory,
// 1 TiB of ephemeral storage, 110 pods, and the extra resources given, an
// extended resource such as a GPU) and waits until it is Ready and
// without the not-ready taint, so that pods are scheduled on it.
func (s *Stack) AddNode(ctx context.Context, name string, extra corev1.ResourceList) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("110"),
	}
	maps.Copy(capacity, extra)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if _, err := s.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	return s.waitFor(ctx, "node "+name+" to be Ready and untainted", 120*time.Second, func(ctx context.Context) (bool, error) {
		n, err := s.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}
		return ready && len(n.Spec.Taints) == 0, nil
	})
}

// exists turns a Get into "is it there".
func exists[T any](_ T, err error) (bool, error) {
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// httpOK tells whether url answers 200, with token as bearer if given.
func httpOK(ctx context.Context, c *http.Client, url, token string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, nil // not listening yet
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK, nil
}

// waitFor polls cond every 50 ms until it holds; it fails when timeout
// passes, cond fails in a way other than not found, or a process of the
// stack exits.
func (s *Stack) waitFor(ctx context.Context, what string, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		for _, p := range s.procs {
			if p.exited() {
				err := fmt.Errorf("%s exited while waiting for %s", p.name, what)
				if strings.Contains(readFile(p.log), "address already in use") {
					err = fmt.Errorf("%w: %w", errPortTaken, err)
				}
				return err
			}
		}
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// run starts a binary of the stack, its output in logs/NAME.log; it dies
// with the test binary, whatever ends it.
func (s *Stack) run(name string, args ...string) error {
	log := filepath.Join(s.dir, "logs", name+".log")
	logf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(Tools(), name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(s.dir, "home"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), log: log, logf: logf}
	go func() { _ = cmd.Wait(); close(p.done) }()
	s.procs = append(s.procs, p)
	return nil
}

// Stop stops the processes in the reverse order of their start (kwok, the
// scheduler, the controller manager, the API server, etcd last: an API
// server whose etcd is gone does not exit), each with SIGTERM and, after
// 10 s, SIGKILL. The directory stays, and so do the logs (Logs).
func (s *Stack) Stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		if !p.exited() {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		_ = p.logf.Close()
	}
}

// Logs are the paths of the processes' logs, by name.
func (s *Stack) Logs() map[string]string {
	out := map[string]string{}
	for _, p := range s.procs {
		out[p.name] = p.log
	}
	return out
}

// logOffsets are the logs' sizes now, so that logsSince shows what a
// test added.
func (s *Stack) logOffsets() map[string]int64 {
	out := map[string]int64{}
	for _, p := range s.procs {
		if fi, err := os.Stat(p.log); err == nil {
			out[p.name] = fi.Size()
		}
	}
	return out
}

// logsSince is, for each process, the last lines (at most n) of what it
// logged after the offsets.
func (s *Stack) logsSince(from map[string]int64, n int) string {
	var b strings.Builder
	for _, p := range s.procs {
		text := readFile(p.log)
		if off := from[p.name]; off <= int64(len(text)) {
			text = text[off:]
		}
		fmt.Fprintf(&b, "--- %s (%s), %s\n", p.name, p.log, status(p))
		b.WriteString(lastLines(text, n))
	}
	return b.String()
}

func (s *Stack) logTails(n int) string { return s.logsSince(nil, n) }

func status(p *process) string {
	if !p.exited() {
		return "running"
	}
	if st := p.cmd.ProcessState; st != nil {
		return st.String()
	}
	return "exited"
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func lastLines(text string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return "(nothing)\n"
	}
	return strings.Join(lines, "\n") + "\n"
}

// Kubectl is a kubectl command on the stack as its admin: its
// --kubeconfig, a HOME of the stack's own (kubectl's discovery cache) and
// no user preferences (KUBERC=off).
func (s *Stack) Kubectl(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.KubectlPath, append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(s.dir, "home"), "KUBERC=off", "KUBECONFIG=")
	return cmd
}

// KubectlOutput runs kubectl with stdin as its input; it returns the
// standard output, and on failure an error with the standard error.
func (s *Stack) KubectlOutput(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := s.Kubectl(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// versionInfo is what /version says.
type versionInfo struct {
	GitVersion string `json:"gitVersion"`
}

// KubectlVersion is kubectl's own version (kubectl version --client).
func (s *Stack) KubectlVersion(ctx context.Context) (string, error) {
	out, err := s.KubectlOutput(ctx, nil, "version", "--client", "-o", "json")
	if err != nil {
		return "", err
	}
	var v struct {
		ClientVersion versionInfo `json:"clientVersion"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return "", fmt.Errorf("kubectl version: %w", err)
	}
	return v.ClientVersion.GitVersion, nil
}
