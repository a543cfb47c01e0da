// Package kubernetes is the driver of Kubernetes clusters, on client-go,
// as Nodepool's kubernetes driver: a node is a namespace of its own, with a
// service account whose token, CA and API address the node record carries
// (a namespace label), and for a pod label a pod in it running the label's
// image (or spec), which that account may exec into and read the logs of.
// Creates and deletes are resumable state machines whose names come from
// the node id and attempt, so a resumed step finds what an earlier one
// made; every namespace and pod is labelled with the node, provider, pool
// and label it is for, so that leaked ones are found and deleted.
package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
)

// Labels the driver puts on the namespaces and pods it makes, as Nodepool's
// kubernetes driver names them (the node's label is nodepool_node_label
// there, not drivers.TagLabel). Their values are Kubernetes label values:
// a name that is not one is shortened and hashed (labelValue), and the
// namespace's annotations of the same keys hold the names as written.
const (
	LabelNode     = drivers.TagNode     // nodepool_node_id
	LabelProvider = drivers.TagProvider // nodepool_provider_name
	LabelPool     = drivers.TagPool     // nodepool_pool_name
	LabelLabel    = "nodepool_node_label"
	// AnnotationPod, on a namespace of a pod label, names its pod.
	AnnotationPod = "nodepool_pod"
)

// User is the service account every node's namespace has, as in Nodepool;
// its token Secret has the same name.
const User = "zuul-worker"

// Connection types of the node records, as Nodepool's.
const (
	ConnectionNamespace = "namespace"
	ConnectionKubectl   = "kubectl"
)

// Resource names a pod label counts besides cores, RAM and instances,
// as Nodepool's quota names them: its storage in MB; its gpu counts under
// its gpu-resource, its extra-resources under their own names.
const ResourceStorage = "ephemeral-storage"

// Options change how New reaches the cluster.
type Options struct {
	// Kubeconfig is the kubeconfig file to read ("": where kubectl looks,
	// $KUBECONFIG or ~/.kube/config, and the in-cluster service account
	// when there is none).
	Kubeconfig string
	// PollInterval is how long a create or delete waits between looks at
	// a token, pod or namespace that is not there yet (default 1 s, as
	// Nodepool's: a cluster deleting a hundred namespaces is asked about
	// each once a second).
	PollInterval time.Duration
	// Log gets the driver's log (default: none).
	Log *slog.Logger
}

// Provider is one configured kubernetes provider.
type Provider struct {
	cfg    *config.Provider
	client client
	rest   *rest.Config
	log    *slog.Logger
	poll   time.Duration
}

// New makes the driver of a kubernetes provider: the cluster is the
// provider's context of the kubeconfig, or, without a context, the
// kubeconfig's current one, or the in-cluster service account when there
// is no kubeconfig (as Nodepool reads them). Nothing is called yet.
func New(pc *config.Provider, opts Options) (*Provider, error) {
	if pc.Driver != "kubernetes" {
		return nil, fmt.Errorf("provider %s: driver is %q, not kubernetes", pc.Name, pc.Driver)
	}
	rc, err := restConfig(pc.Context, opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", pc.Name, err)
	}
	return NewForConfig(pc, rc, opts)
}

// NewForConfig makes the driver of a kubernetes provider that reaches its
// cluster with rc (which it keeps and must not be changed after).
func NewForConfig(pc *config.Provider, rc *rest.Config, opts Options) (*Provider, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("provider", pc.Name)
	rc = rest.CopyConfig(rc)
	// Nodepool's client has no limit of its own: the API server's
	// priority and fairness answers 429 when it wants fewer calls (a
	// failure kind the launcher waits on), and `rate` paces the launcher.
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 50, 100
	}
	if rc.UserAgent == "" {
		rc.UserAgent = "nodepool-nats (kubernetes driver)"
	}
	rc.WarningHandlerWithContext = warnings{log}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return noRetryOn429{rt} })
	cl, err := newClient(rc)
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", pc.Name, err)
	}
	poll := opts.PollInterval
	if poll <= 0 {
		poll = time.Second
	}
	return &Provider{cfg: pc, client: cl, rest: rc, log: log, poll: poll}, nil
}

// client is what the driver uses of client-go's clientset: the core and
// RBAC APIs (the whole clientset would link the client of every API group
// into the binary).
type client struct {
	core corev1client.CoreV1Interface
	rbac rbacv1client.RbacV1Interface
}

func newClient(rc *rest.Config) (client, error) {
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return client{}, err
	}
	rbac, err := rbacv1client.NewForConfig(rc)
	if err != nil {
		return client{}, err
	}
	return client{core: core, rbac: rbac}, nil
}

func (c client) CoreV1() corev1client.CoreV1Interface { return c.core }
func (c client) RbacV1() rbacv1client.RbacV1Interface { return c.rbac }

// restConfig reads the client configuration of a context.
func restConfig(context, kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
	rc, err := cc.ClientConfig()
	if err != nil {
		if context == "" {
			return nil, fmt.Errorf("no kubeconfig and not in a cluster: %w", err)
		}
		return nil, fmt.Errorf("context %q: %w", context, err)
	}
	return rc, nil
}

// noRetryOn429 hides the Retry-After of the API server's 429s from
// client-go, which would otherwise sleep and retry a throttled call up to
// ten times inside the step: the step fails at once as
// drivers.ErrRateLimited, with the delay the answer's body suggests, and
// the launcher waits (saying so on the node, counting it in the metrics),
// as for every driver's throttling.
type noRetryOn429 struct{ rt http.RoundTripper }

func (t noRetryOn429) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		resp.Header.Del("Retry-After")
	}
	return resp, err
}

// warnings sends the API server's warnings (a field of a pod spec it
// dropped, a deprecated API) to the driver's log.
type warnings struct{ log *slog.Logger }

func (w warnings) HandleWarningHeaderWithContext(ctx context.Context, code int, agent, text string) {
	if code == 299 && text != "" {
		w.log.Warn("the API server warns", "warning", text)
	}
}

// Close releases nothing: the client holds only idle connections.
func (p *Provider) Close() {}

// Host is the API server's URL, as the node records carry it.
func (p *Provider) Host() string {
	h := p.rest.Host
	if !strings.Contains(h, "://") {
		h = "https://" + h
	}
	return strings.TrimRight(h, "/")
}

// IdempotentCreate: a create's names come from its node and attempt, so a
// machine started afresh finds what the attempt made.
func (p *Provider) IdempotentCreate() {}

// ListingAge is 0: ListInstances lists the namespaces and pods as they
// are when it is called (drivers.Liveness).
func (p *Provider) ListingAge() time.Duration { return 0 }

// QuotaLimits is unlimited, as in Nodepool: the pools' max-servers,
// max-cores, max-ram and max-resources are the limits.
func (p *Provider) QuotaLimits(context.Context) (drivers.Resources, error) {
	return drivers.Resources{Instances: drivers.Unlimited, Cores: drivers.Unlimited, RAM: drivers.Unlimited}, nil
}

// QuotaForLabel is what one node of a label counts, as in Nodepool: one
// instance; for a pod label its cpu as cores, its memory (MiB) as RAM, its
// storage (MB) as ephemeral-storage, its gpu under its gpu-resource and
// its extra-resources by name (a fraction counts as a whole one). A spec
// label counts one instance only.
func (p *Provider) QuotaForLabel(pool, label string) (drivers.Resources, error) {
	_, pl, err := p.cfg.PoolLabel(pool, label)
	if err != nil {
		return drivers.Resources{}, err
	}
	return labelResources(pl), nil
}

func labelResources(pl *config.PoolLabel) drivers.Resources {
	r := drivers.Resources{Instances: 1}
	kl := &pl.KubernetesLabel
	if kl.Type != "pod" || kl.Spec != nil {
		return r
	}
	r.Cores, r.RAM = max(kl.CPU, 0), max(kl.Memory, 0)
	other := map[string]int{}
	if kl.Storage > 0 {
		other[ResourceStorage] = kl.Storage
	}
	if kl.GPU > 0 && kl.GPUResource != "" {
		other[kl.GPUResource] += int(math.Ceil(kl.GPU))
	}
	for k, v := range kl.ExtraResources {
		if v > 0 {
			other[k] += int(math.Ceil(v))
		}
	}
	if len(other) > 0 {
		r.Other = other
	}
	return r
}
