package consumers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/consumers"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/internal/logtest"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/service"
)

// reload gives a running launcher a new configuration as the process
// does (service.Process.Reload): a provider whose section did not change
// keeps its driver; a changed or added one gets a new driver, closed once
// the launcher stopped.
func (h *harness) reload(l *launcher, yaml string) *config.Config {
	h.t.Helper()
	cfg := parseConfig(h.t, yaml)
	old := l.Config()
	next := map[string]drivers.Provider{}
	var made []drivers.Provider
	for i := range cfg.Providers {
		pc := &cfg.Providers[i]
		if oc, ok := old.Provider(pc.Name); ok && reflect.DeepEqual(*oc, *pc) {
			next[pc.Name] = l.Providers[pc.Name]
			continue
		}
		drv, err := service.NewProvider(h.t.Context(), h.js, pc, service.DriverOptions{Replicas: 1, Log: testLog(h.t)})
		if err != nil {
			h.t.Fatal(err)
		}
		if h.wrap != nil {
			drv = h.wrap(pc.Name, drv)
		}
		made = append(made, drv)
		next[pc.Name] = drv
	}
	if err := l.Reload(cfg, next); err != nil {
		h.t.Fatal(err)
	}
	l.Providers = next
	go func() {
		<-l.done
		for _, d := range made {
			d.Close()
		}
	}()
	return cfg
}

// watchDrain makes the harness wake on changes of the remembered
// provider sections and of the image uploads, and returns their caches.
func (h *harness) watchDrain() (*kv.Cache[kv.ProviderRecord], *kv.Cache[kv.ImageUpload]) {
	h.t.Helper()
	if h.b.Providers == nil {
		h.t.Fatal("the harness's buckets have no providers bucket")
	}
	recs := kv.NewCache(h.b.Providers, testLog(h.t))
	watchToo(h, recs)
	uploads := kv.NewCache(kv.NewImageStores(h.b.Images).Uploads, testLog(h.t))
	watchToo(h, uploads)
	return recs, uploads
}

// watchImages makes the harness wake on changes of a fake cloud's
// images, and returns their cache.
func (h *harness) watchImages(cloud string) *kv.Cache[fake.ImageRecord] {
	h.t.Helper()
	bucket, err := h.js.CreateOrUpdateKeyValue(h.t.Context(), jetstream.KeyValueConfig{Bucket: fake.ImagesBucketName(cloud), History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		h.t.Fatal(err)
	}
	c := kv.NewCache(kv.NewStore[fake.ImageRecord](bucket), testLog(h.t))
	watchToo(h, c)
	return c
}

// poolNodes counts the nodes of a pool in some states (any state: none
// given).
func (h *harness) poolNodes(provider, pool string, states ...kv.NodeState) int {
	return h.countNodes(func(n *kv.Node) bool {
		return n.Provider == provider && (pool == "" || n.Pool == pool) && (len(states) == 0 || containsState(states, n.State))
	})
}

func containsState(states []kv.NodeState, s kv.NodeState) bool {
	for _, x := range states {
		if x == s {
			return true
		}
	}
	return false
}

// readyAndInUse makes min-ready's ready nodes of label b come, takes one
// of them (in use, as a requestor's) and waits for min-ready to replace
// it: two ready nodes and one in use.
func (h *harness) readyAndInUse(provider, pool string) kv.Node {
	h.t.Helper()
	h.until(20*time.Second, "two ready nodes of b", func() bool {
		return h.poolNodes(provider, pool, kv.NodeReady) == 2
	})
	taken, err := h.client.Request(h.t.Context(), events.RequestMessage{Labels: []string{"b"}, Requestor: "tester"}, "tester")
	if err != nil {
		h.t.Fatal(err)
	}
	h.until(20*time.Second, "two ready nodes of b again, and the one in use", func() bool {
		return h.countNodes(func(n *kv.Node) bool {
			return n.Provider == provider && n.Pool == pool && n.State == kv.NodeReady && n.AllocatedTo == ""
		}) == 2 && h.poolNodes(provider, pool, kv.NodeInUse) == 1
	})
	return taken[0]
}

// failedMinReady waits for min-ready's request of a label to fail (every
// live pool declined it): min-ready and the pools looked at the label
// since the reload.
func (h *harness) failedMinReady(label string) {
	h.t.Helper()
	h.until(20*time.Second, "min-ready's request of "+label+" declined by every pool", func() bool {
		r, ok := h.request(consumers.MinReadyID(label, 0))
		return ok && r.State == kv.RequestFailed
	})
}

const drainPools = `
labels:
  - name: a
  - name: b
    min-ready: 2
providers:
  - name: cloud
    driver: fake
    cloud: %s
    pools:
      - name: keep
        labels: [a]
%s`

// A pool removed by a reload launches nothing more; its ready nodes are
// deleted at once, its node in use once given back; nothing of it is
// left in the buckets or the cloud.
func TestReloadRemovingAPoolDrainsIt(t *testing.T) {
	t.Parallel()
	gone := `      - name: gone
        labels: [b]
`
	h := newHarness(t, fmt.Sprintf(drainPools, "drain-pool", gone))
	l := h.startLauncher("l1")
	inUse := h.readyAndInUse("cloud", "gone")
	if n := h.instanceCount("drain-pool"); n != 3 {
		t.Fatalf("%d instances, want 3", n)
	}
	made := h.instancesEverCreated("drain-pool")

	h.reload(l, fmt.Sprintf(drainPools, "drain-pool", ""))
	h.until(30*time.Second, "the removed pool's ready nodes and their instances deleted", func() bool {
		return h.poolNodes("cloud", "gone") == 1 && h.instanceCount("drain-pool") == 1
	})
	h.failedMinReady("b")
	if n := h.instancesEverCreated("drain-pool"); n != made {
		t.Errorf("%d instances were launched after the reload", n-made)
	}
	if n, ok := h.node(inUse.ID); !ok || n.State != kv.NodeInUse {
		t.Errorf("the node in use was not left to its holder: %+v", n)
	}

	if err := h.client.Return(t.Context(), inUse.ID); err != nil {
		t.Fatal(err)
	}
	h.until(30*time.Second, "the returned node of the removed pool deleted", func() bool {
		return h.poolNodes("cloud", "gone") == 0 && h.instanceCount("drain-pool") == 0
	})
	if n := h.instancesEverCreated("drain-pool"); n != made {
		t.Errorf("%d instances were launched after the reload", n-made)
	}
	h.checkConsistent("drain-pool")
}

// A label removed from a pool (the pool stays) launches nothing more; its
// ready nodes are deleted, its node in use once given back.
func TestReloadRemovingALabelDrainsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fmt.Sprintf(drainPools, "drain-label", `      - name: both
        labels: [a, b]
`))
	l := h.startLauncher("l1")
	inUse := h.readyAndInUse("cloud", "both")
	made := h.instancesEverCreated("drain-label")

	h.reload(l, fmt.Sprintf(drainPools, "drain-label", `      - name: both
        labels: [a]
`))
	h.until(30*time.Second, "the removed label's ready nodes deleted", func() bool {
		return h.poolNodes("cloud", "both") == 1 && h.instanceCount("drain-label") == 1
	})
	h.failedMinReady("b")
	if err := h.client.Return(t.Context(), inUse.ID); err != nil {
		t.Fatal(err)
	}
	h.until(30*time.Second, "the returned node of the removed label deleted", func() bool {
		return h.poolNodes("cloud", "both") == 0 && h.instanceCount("drain-label") == 0
	})
	if n := h.instancesEverCreated("drain-label"); n != made {
		t.Errorf("%d instances were launched after the reload", n-made)
	}
	// The pool still serves what it kept.
	if _, err := h.client.Request(t.Context(), events.RequestMessage{Labels: []string{"a"}, Requestor: "tester"}, "tester"); err != nil {
		t.Fatal(err)
	}
}

const drainPending = `
labels: [{name: a}, {name: b}]
providers:
  - name: slow
    driver: fake
    cloud: %[1]s-slow
    boot-delay: 120
    pools:
      - name: first
        priority: 1
        labels: [%[2]s]
%[3]s
  - name: fast
    driver: fake
    cloud: %[1]s-fast
    pools:
      - name: second
        priority: 2
        labels: [b]
`

// A request pending in a pool that a reload takes its label, or the pool
// itself, from does not hang: it is served by another pool; the node
// being launched for it in the removed pool or label is deleted.
func TestReloadRemovingWhatAPendingRequestWaitsOn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, cloud, before, after string }{
		{"label", "pl-slow", fmt.Sprintf(drainPending, "pl", "a, b", ""), fmt.Sprintf(drainPending, "pl", "a", "")},
		{"pool", "pp-slow", fmt.Sprintf(drainPending, "pp", "a", "      - name: doomed\n        priority: 1\n        labels: [b]"), fmt.Sprintf(drainPending, "pp", "a", "")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, c.before)
			l := h.startLauncher("l1")
			id := h.submit(events.RequestMessage{Labels: []string{"b"}, Requestor: "tester"})
			h.until(20*time.Second, "the request pending in the slow provider, its node booting", func() bool {
				r, ok := h.request(id)
				return ok && r.State == kv.RequestPending && r.Provider == "slow" && h.poolNodes("slow", "", kv.NodeBuilding) == 1
			})
			h.reload(l, c.after)
			h.until(30*time.Second, "the request served by the other pool, the slow node deleted", func() bool {
				r, ok := h.request(id)
				return ok && r.State == kv.RequestFulfilled && r.Provider == "fast" && h.poolNodes("slow", "") == 0 && h.instanceCount(c.cloud) == 0
			})
		})
	}
}

// A node of a removed pool that no launch had started yet (the
// launcher claims it after the reload, or after a restart without the
// pool) is not launched: no attempt fails on the missing pool, its
// request is not failed; the drain deletes the node and another pool
// serves the request.
func TestNodeOfARemovedPoolIsNotLaunched(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fmt.Sprintf(drainPending, "nl", "a", ""))
	now := time.Now().UTC()
	req := kv.Request{ID: "pending-1", State: kv.RequestPending, Labels: []string{"b"}, Nodes: []string{"doomed-node"},
		DeclinedBy: []string{}, Provider: "slow", Pool: "doomed", Requestor: "tester", Created: now, StateTime: now}
	if _, err := h.b.Requests.Create(t.Context(), req.ID, &req); err != nil {
		t.Fatal(err)
	}
	node := kv.Node{ID: "doomed-node", State: kv.NodeBuilding, Labels: []string{"b"}, Provider: "slow", Pool: "doomed",
		AllocatedTo: req.ID, Created: now, StateTime: now}
	if _, err := h.b.Nodes.Create(t.Context(), node.ID, &node); err != nil {
		t.Fatal(err)
	}
	h.startLauncher("l1")
	h.until(30*time.Second, "the request served by the other pool, the doomed node deleted", func() bool {
		r, ok := h.request(req.ID)
		if ok && r.State == kv.RequestFailed {
			t.Fatalf("the request failed: %s", r.Reason)
		}
		_, nodeLeft := h.node(node.ID)
		return ok && r.State == kv.RequestFulfilled && r.Provider == "fast" && !nodeLeft
	})
	if n := h.instancesEverCreated("nl-slow"); n != 0 {
		t.Errorf("%d instances were launched in the removed pool", n)
	}
}

const drainProviders = `
labels:
  - name: a
  - name: b
    min-ready: 2
providers:
  - name: stay
    driver: fake
    cloud: %[1]s-stay
    pools: [{name: p, labels: [a]}]
%[2]s`

const goneProvider = `  - name: gone
    driver: fake
    cloud: %s-gone
    pools: [{name: p, labels: [b]}]
`

// A provider removed by a reload, or by a restart without it, is
// drained through its remembered section: its ready nodes deleted, its
// node in use once given back, its uploads (image and record), leaked
// instances and images deleted; then its section is forgotten.
func TestRemovedProviderIsDrained(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"reload", "restart"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			cloud := "drain-" + how
			h := newHarness(t, fmt.Sprintf(drainProviders, cloud, fmt.Sprintf(goneProvider, cloud)))
			recs, uploads := h.watchDrain()
			images := h.watchImages(cloud + "-gone")
			l := h.startLauncher("l1")
			h.until(10*time.Second, "both providers' sections remembered", func() bool {
				return recs.Has("stay") && recs.Has("gone")
			})
			inUse := h.readyAndInUse("gone", "p")

			// An upload of the provider's, an image it left, an instance it
			// leaked.
			gone, ok := drivers.As[*fake.Provider](l.Providers["gone"])
			if !ok {
				t.Fatalf("provider gone is a %T", l.Providers["gone"])
			}
			key := kv.UploadKey("img", "0000000001", "gone", "0000000001")
			uploaded, err := gone.InjectImage(t.Context(), "img-0000000001", map[string]string{drivers.TagProvider: "gone", drivers.TagUpload: key})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC()
			if _, err := kv.NewImageStores(h.b.Images).Uploads.Create(t.Context(), key, &kv.ImageUpload{Image: "img", BuildID: "0000000001",
				Provider: "gone", ID: "0000000001", State: kv.ImageReady, StateTime: now, ExternalID: uploaded, Created: now}); err != nil {
				t.Fatal(err)
			}
			if _, err := gone.InjectImage(t.Context(), "img-left", map[string]string{drivers.TagProvider: "gone"}); err != nil {
				t.Fatal(err)
			}
			if _, err := gone.Inject(t.Context(), "npghost", map[string]string{drivers.TagProvider: "gone", drivers.TagNode: "ghost"}, 1, 1); err != nil {
				t.Fatal(err)
			}
			h.until(10*time.Second, "the upload recorded, the images there", func() bool { return uploads.Len() == 1 && images.Len() == 2 })
			made := h.instancesEverCreated(cloud + "-gone")

			without := fmt.Sprintf(drainProviders, cloud, "")
			switch how {
			case "reload":
				h.reload(l, without)
			case "restart":
				l.Stop()
				h.startLauncherWith("l2", parseConfig(t, without))
			}
			h.until(30*time.Second, "the removed provider's ready nodes, leaked instance, upload and images deleted", func() bool {
				return h.poolNodes("gone", "") == 1 && h.instanceCount(cloud+"-gone") == 1 && uploads.Len() == 0 && images.Len() == 0
			})
			if r, ok := recs.Get("gone"); !ok || r.Value.DrainingSince == nil || r.Value.Problem != "" {
				t.Errorf("the removed provider's record does not say it drains: %+v", r.Value)
			}
			if err := h.client.Return(t.Context(), inUse.ID); err != nil {
				t.Fatal(err)
			}
			h.until(30*time.Second, "the returned node deleted and the provider's section forgotten", func() bool {
				return h.poolNodes("gone", "") == 0 && h.instanceCount(cloud+"-gone") == 0 && !recs.Has("gone")
			})
			if !recs.Has("stay") {
				t.Errorf("the configured provider's section was forgotten")
			}
			// Launched in the removed provider after the removal: only the
			// leaked instance injected before.
			if n := h.instancesEverCreated(cloud + "-gone"); n != made {
				t.Errorf("%d instances were launched in the removed provider", n-made)
			}
		})
	}
}

// A removed provider whose driver cannot be made (its cloud's
// credentials are gone) says so in its record and the gauges, and no
// record is written again and again; `nodepool erase` gives it up.
func TestRemovedProviderThatCannotBeDrained(t *testing.T) {
	t.Parallel()
	cloud := "drain-broken"
	h := newHarness(t, fmt.Sprintf(drainProviders, cloud, fmt.Sprintf(goneProvider, cloud)))
	recs, _ := h.watchDrain()
	var attempts atomic.Int32
	h.options = func(o *consumers.Options) {
		o.NewDriver = func(ctx context.Context, pc *config.Provider) (drivers.Provider, error) {
			attempts.Add(1)
			return nil, errors.New("no credentials for cloud " + pc.Cloud)
		}
	}
	l := h.startLauncher("l1")
	h.until(10*time.Second, "the sections remembered", func() bool { return recs.Has("gone") })
	h.until(20*time.Second, "two ready nodes of the doomed provider", func() bool { return h.poolNodes("gone", "p", kv.NodeReady) == 2 })

	h.reload(l, fmt.Sprintf(drainProviders, cloud, ""))
	h.until(30*time.Second, "its nodes to delete and its record saying why it cannot", func() bool {
		r, ok := recs.Get("gone")
		return h.poolNodes("gone", "", kv.NodeDeleting) == 2 && ok && strings.Contains(r.Value.Problem, "no credentials for cloud drain-broken-gone")
	})
	reg := l.Metrics().Registry()
	if v := reg.Sum("nodepool_draining_providers", "state=stuck"); v != 1 {
		t.Errorf("nodepool_draining_providers{state=stuck} = %v, want 1", v)
	}
	if v := reg.Sum("nodepool_draining_nodes", "state=deleting"); v != 2 {
		t.Errorf("nodepool_draining_nodes{state=deleting} = %v, want 2", v)
	}
	revs := map[string]uint64{}
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if e.Value.Provider == "gone" {
			revs[e.Key] = e.Revision
		}
		return true
	})
	rec, _ := recs.Get("gone")
	// Many sweeps (each tries to make the driver again), well past the
	// revisit sweep's two sweeps and a lease TTL.
	from := attempts.Load()
	h.until(30*time.Second, "twenty more sweeps", func() bool {
		return attempts.Load() >= from+20
	})
	h.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
		if rev, ok := revs[e.Key]; ok && e.Revision != rev {
			t.Errorf("node %s was written again (revision %d, then %d): %+v", e.Key, rev, e.Revision, e.Value)
		}
		return true
	})
	if now, _ := recs.Get("gone"); now.Revision != rec.Revision {
		t.Errorf("the provider's record was written again: %+v", now.Value)
	}

	// The operator gives up on it.
	n, u, err := h.client.EraseProvider(t.Context(), "gone")
	if err != nil || n != 2 || u != 0 {
		t.Fatalf("erase: %d nodes, %d uploads, %v", n, u, err)
	}
	h.until(20*time.Second, "the provider forgotten", func() bool {
		return !recs.Has("gone") && reg.Sum("nodepool_draining_providers", "state=stuck") == 0
	})
}

// A metastatic provider removed by a reload: its carved nodes in use go
// when given back, and each backing node it holds is given back (and
// deleted by its own provider) once empty; then its section is
// forgotten.
func TestRemovedMetastaticProviderGivesBackItsBackingNodes(t *testing.T) {
	t.Parallel()
	with := metaConfig("0.05", "            max-parallel-jobs: 4\n            grace-time: 600\n")
	without := with[:strings.Index(with, "  - name: meta\n")]
	h := newHarness(t, with)
	recs, _ := h.watchDrain()
	l := h.startLauncher("l1")
	carved := h.requestSmall(2)
	if n := len(h.backings()); n != 1 {
		t.Fatalf("%d backing nodes, want 1", n)
	}
	h.reload(l, without)
	h.until(30*time.Second, "the removed provider draining", func() bool {
		r, ok := recs.Get("meta")
		return ok && r.Value.DrainingSince != nil
	})
	h.returnNodes(carved[0])
	h.until(30*time.Second, "the first carved node deleted", func() bool { _, ok := h.node(carved[0]); return !ok })
	if n := len(h.backings()); n != 1 {
		t.Fatalf("the backing node was given back while a carved node uses it (%d held)", n)
	}
	h.returnNodes(carved[1])
	h.until(30*time.Second, "the carved nodes deleted, the backing node given back and deleted, the section forgotten", func() bool {
		return h.poolNodes("meta", "") == 0 && h.poolNodes("cloud", "") == 0 && h.instanceCount("cloud") == 0 && !recs.Has("meta")
	})
}

// putCounter counts the writes of each key of the nodes bucket from the
// time it starts (puts, and whether the key was deleted), and wakes the
// harness's waits on each.
type putCounter struct {
	mu      sync.Mutex
	puts    map[string]int
	deleted map[string]bool
	seen    map[string][]string // what the watch saw of each key, for a failure's message
	// afterDelete counts the puts of a key seen after its deletion.
	afterDelete map[string]int
}

func (h *harness) countPuts() *putCounter {
	h.t.Helper()
	w, err := h.b.Nodes.Bucket().WatchAll(h.t.Context(), jetstream.UpdatesOnly())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = w.Stop() })
	pc := &putCounter{puts: map[string]int{}, deleted: map[string]bool{}, seen: map[string][]string{}, afterDelete: map[string]int{}}
	signal := make(chan struct{}, 1)
	go func() {
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			pc.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				pc.puts[e.Key()]++
				if pc.deleted[e.Key()] {
					pc.afterDelete[e.Key()]++
				}
				var n kv.Node
				_ = json.Unmarshal(e.Value(), &n)
				pc.seen[e.Key()] = append(pc.seen[e.Key()], fmt.Sprintf("put rev %d %s", e.Revision(), n.State))
			} else {
				pc.deleted[e.Key()] = true
				pc.seen[e.Key()] = append(pc.seen[e.Key()], fmt.Sprintf("%s rev %d", e.Operation(), e.Revision()))
			}
			pc.mu.Unlock()
			select {
			case signal <- struct{}{}:
			default:
			}
		}
	}()
	h.watched = append(h.watched, func() (<-chan struct{}, func(), func()) {
		return signal, func() {}, func() {}
	})
	return pc
}

// history says what the watch saw of a key.
func (pc *putCounter) history(key string) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return strings.Join(pc.seen[key], ", ")
}

// written says how often a key was seen written, and after its deletion.
func (pc *putCounter) written(key string) (puts, afterDelete int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.puts[key], pc.afterDelete[key]
}

func (pc *putCounter) get(key string) (puts int, deleted bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.puts[key], pc.deleted[key]
}

// The reproduced bug: the records of a provider that no process has and
// that no launcher ever remembered (removed in the change that brought
// this version in) were left, and a deleting one was written again every
// two sweeps for ever. Nothing can make its driver: its records go, each
// once it is freed and with a log line, and none is written again; then
// the provider is forgotten.
func TestRemovedProviderNobodyRemembered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fmt.Sprintf(drainProviders, "drain-ghost", ""))
	// A failure prints what the watch saw and the launcher's log.
	var rec *logtest.Recorder
	h.log, rec = logtest.New(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("launcher log:\n%s", rec)
		}
	})
	recs, _ := h.watchDrain()
	puts := h.countPuts()
	now := time.Now().UTC()
	states := map[string]kv.NodeState{"ghost-deleting": kv.NodeDeleting, "ghost-used": kv.NodeUsed, "ghost-failed": kv.NodeFailed,
		"ghost-ready": kv.NodeReady, "ghost-inuse": kv.NodeInUse}
	for id, st := range states {
		n := kv.Node{ID: id, State: st, Labels: []string{"b"}, Provider: "ghost", Pool: "p", ExternalID: "i-" + id,
			Created: now, StateTime: now}
		if st == kv.NodeInUse {
			n.Holder = "someone"
		}
		if _, err := h.b.Nodes.Create(t.Context(), id, &n); err != nil {
			t.Fatal(err)
		}
	}
	h.startLauncher("l1")
	h.until(30*time.Second, "the freed records of the provider nobody remembered removed, its record saying why", func() bool {
		r, ok := recs.Get("ghost")
		for _, id := range []string{"ghost-deleting", "ghost-used", "ghost-failed", "ghost-ready"} {
			if _, deleted := puts.get(id); !deleted {
				return false
			}
		}
		return ok && strings.Contains(r.Value.Problem, "no launcher recorded its configuration section")
	})
	// The records are written at most this often (ready: created, then
	// deleting), and none again once deleted. A watch of a bucket that
	// keeps one revision per key may miss a write the next one replaced
	// before it was delivered (it once saw ghost-ready's creation and
	// deletion, not the deleting between, on a busy machine), so the
	// counts seen are at most these, and the move of the ready node to
	// deleting is read from the launcher's log. The node in use is
	// written once and then left alone: its one write is always seen.
	most := map[string]int{"ghost-deleting": 1, "ghost-used": 1, "ghost-failed": 1, "ghost-ready": 2}
	check := func() {
		t.Helper()
		for id, n := range most {
			if got, again := puts.written(id); got > n || again > 0 {
				t.Errorf("node %s was written %d times, %d of them after its deletion; want at most %d, none after (seen: %s)", id, got, again, n, puts.history(id))
			}
		}
		if got, _ := puts.written("ghost-inuse"); got != 1 {
			t.Errorf("the node in use was written %d times, want once (seen: %s)", got, puts.history("ghost-inuse"))
		}
	}
	check()
	if len(rec.Lines("deleting a node of a removed provider", "node=ghost-ready")) == 0 {
		t.Errorf("the ready node was not moved to deleting before its record was removed: %q",
			rec.Lines("node=ghost-ready"))
	}
	if n, ok := h.node("ghost-inuse"); !ok || n.State != kv.NodeInUse {
		t.Errorf("the node in use was not left to its holder: %+v", n)
	}
	// Well past the revisit sweep's two sweeps and a lease TTL: nothing
	// is written again.
	first, _ := h.components.Get("l1")
	h.until(10*time.Second, "two lease TTLs of the launcher's heartbeats", func() bool {
		c, ok := h.components.Get("l1")
		return ok && c.Value.Heartbeat.Sub(first.Value.Heartbeat) >= 2*leaseTTL
	})
	check()

	if _, err := h.b.Nodes.Modify(t.Context(), "ghost-inuse", func(n *kv.Node) error {
		n.SetState(kv.NodeUsed, time.Now().UTC())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h.until(30*time.Second, "the returned node's record removed and the provider forgotten", func() bool {
		_, deleted := puts.get("ghost-inuse")
		return deleted && !recs.Has("ghost")
	})
}

// beatAsBuilder keeps a builder's component record (a process without
// the launcher role) naming providers, until the returned stop is called
// (which deletes the record).
func (h *harness) beatAsBuilder(id string, providers ...string) (stop func()) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(h.t.Context())
	beat := func() error {
		now := time.Now().UTC()
		_, err := h.b.Components.Upsert(ctx, id, func(cur *kv.Component, _ bool) {
			*cur = kv.Component{ID: id, Roles: []string{config.RoleBuilder}, Started: now, Heartbeat: now, Providers: providers}
		})
		return err
	}
	if err := beat(); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(leaseTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = beat()
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if e, err := h.b.Components.Get(h.t.Context(), id); err == nil {
				_ = h.b.Components.Delete(h.t.Context(), id, e.Revision)
			}
		})
	}
	h.t.Cleanup(stop)
	return stop
}

// A provider removed from the launchers' configuration that a builder
// not reloaded yet still names: its nodes and their instances are
// deleted all the same (no launcher could), its uploads are left to the
// builder; once the builder no longer names it, its uploads go too and
// it is forgotten.
func TestRemovedProviderABuilderStillNames(t *testing.T) {
	t.Parallel()
	cloud := "drain-builder"
	h := newHarness(t, fmt.Sprintf(drainProviders, cloud, fmt.Sprintf(goneProvider, cloud)))
	recs, uploads := h.watchDrain()
	images := h.watchImages(cloud + "-gone")
	l := h.startLauncher("l1")
	h.until(20*time.Second, "two ready nodes of the doomed provider, its section remembered", func() bool {
		return h.poolNodes("gone", "p", kv.NodeReady) == 2 && recs.Has("gone")
	})
	gone, ok := drivers.As[*fake.Provider](l.Providers["gone"])
	if !ok {
		t.Fatalf("provider gone is a %T", l.Providers["gone"])
	}
	key := kv.UploadKey("img", "0000000001", "gone", "0000000001")
	uploaded, err := gone.InjectImage(t.Context(), "img-0000000001", map[string]string{drivers.TagProvider: "gone", drivers.TagUpload: key})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if _, err := kv.NewImageStores(h.b.Images).Uploads.Create(t.Context(), key, &kv.ImageUpload{Image: "img", BuildID: "0000000001",
		Provider: "gone", ID: "0000000001", State: kv.ImageReady, StateTime: now, ExternalID: uploaded, Created: now}); err != nil {
		t.Fatal(err)
	}
	stopBuilder := h.beatAsBuilder("b1", "stay", "gone")
	h.until(10*time.Second, "the upload and its image recorded, the builder live", func() bool {
		return uploads.Len() == 1 && images.Len() == 1 && h.components.Has("b1")
	})

	h.reload(l, fmt.Sprintf(drainProviders, cloud, ""))
	h.until(30*time.Second, "the removed provider's nodes and instances deleted", func() bool {
		return h.poolNodes("gone", "") == 0 && h.instanceCount(cloud+"-gone") == 0
	})
	if uploads.Len() != 1 || images.Len() != 1 {
		t.Errorf("the upload or its image, the builder's, was deleted (%d uploads, %d images)", uploads.Len(), images.Len())
	}
	if r, ok := recs.Get("gone"); !ok || r.Value.DrainingSince == nil {
		t.Errorf("the removed provider's record does not say it drains: %+v", r.Value)
	}

	stopBuilder()
	h.until(30*time.Second, "its upload and image deleted, the provider forgotten", func() bool {
		return uploads.Len() == 0 && images.Len() == 0 && !recs.Has("gone")
	})
}

// A remembered section that goes missing (its bucket deleted and made
// again, an erase forced on a provider still configured) is recorded
// again by the launchers that have the provider, without a reload.
func TestMissingSectionIsRememberedAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fmt.Sprintf(drainProviders, "remember-again", ""))
	recs, _ := h.watchDrain()
	h.startLauncher("l1")
	h.until(10*time.Second, "the section remembered", func() bool { return recs.Has("stay") })
	e, _ := recs.Get("stay")
	if err := h.b.Providers.Delete(t.Context(), "stay", e.Revision); err != nil {
		t.Fatal(err)
	}
	h.until(10*time.Second, "the section forgotten", func() bool { return !recs.Has("stay") })
	h.until(10*time.Second, "the section remembered again", func() bool {
		r, ok := recs.Get("stay")
		return ok && r.Value.Launcher == "l1" && len(r.Value.Section) > 0
	})
}
