package fake_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/drivers/fake"
	"github.com/nodepool-nats/nodepool/internal/natstest"
)

func provider(t *testing.T, yaml string) *fake.Provider {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	p, err := fake.New(t.Context(), js, &cfg.Providers[0], fake.Options{Replicas: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

const cloud = `
labels: [{name: small}, {name: big}]
providers:
  - name: p
    driver: fake
    boot-delay: %s
    delete-delay: 0
    quota: {instances: 2, cores: 10}
    flavors:
      - {name: s, cores: 2, ram: 1024}
      - {name: l, cores: 8, ram: 8192}
    pools:
      - name: main
        labels:
          - {name: small, flavor-name: s}
          - {name: big, flavor-name: l}
`

// run advances a machine to completion, waiting as it asks.
func run(t *testing.T, sm drivers.StateMachine) (*drivers.Instance, error) {
	t.Helper()
	for range 100 {
		step, err := sm.Advance(t.Context())
		if err != nil {
			return nil, err
		}
		if step.Done {
			return step.Instance, nil
		}
		if step.Wait > 0 {
			time.Sleep(step.Wait) // the machine's own hint: the simulated boot time
		}
	}
	t.Fatal("machine did not finish")
	return nil, nil
}

func req(node string, attempt int, label string) drivers.CreateRequest {
	return drivers.CreateRequest{NodeID: node, Hostname: "np" + node, Provider: "p", Pool: "main", Label: label, Attempt: attempt,
		Tags: map[string]string{drivers.TagProvider: "p", drivers.TagNode: node}}
}

func TestCreateResumeAndQuota(t *testing.T) {
	t.Parallel()
	p := provider(t, fmt.Sprintf(cloud, "0.05"))
	sm, _ := p.Create(req("n1", 1, "small"), nil)
	if _, err := sm.Advance(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Another process resumes the machine from its stored state.
	resumed, err := p.Create(req("n1", 1, "small"), sm.State())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := run(t, resumed)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ExternalID != sm.ExternalID() || inst.Resources.Cores != 2 || inst.NodeID() != "n1" {
		t.Errorf("instance = %+v", inst)
	}
	// The same attempt started afresh finds its instance (idempotency
	// token) instead of creating a second one.
	again, _ := p.Create(req("n1", 1, "small"), nil)
	if inst2, err := run(t, again); err != nil || inst2.ExternalID != inst.ExternalID {
		t.Fatalf("repeated attempt: %v, %v", inst2, err)
	}
	// 2 + 8 cores fit the 10-core quota; a third instance does not fit the
	// instance quota.
	if _, err := run(t, must(p.Create(req("n2", 1, "big"), nil))); err != nil {
		t.Fatal(err)
	}
	_, err = run(t, must(p.Create(req("n3", 1, "small"), nil)))
	if !errors.Is(err, drivers.ErrQuotaExceeded) {
		t.Fatalf("third instance: %v, want ErrQuotaExceeded", err)
	}
	insts, err := p.ListInstances(t.Context())
	if err != nil || len(insts) != 2 {
		t.Fatalf("list = %d instances, %v", len(insts), err)
	}
	// Delete frees quota.
	if _, err := run(t, must(p.Delete(inst.ExternalID, nil))); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, must(p.Create(req("n3", 1, "small"), nil))); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	// Deleting what is gone is done at once.
	if _, err := run(t, must(p.Delete("i-0000000000000000", nil))); err != nil {
		t.Fatal(err)
	}
}

// driver_data and external ids from a record are checked before use: what
// the fake could not have written is refused with the reason, never acted
// on.
func TestDriverDataIsValidated(t *testing.T) {
	t.Parallel()
	p := provider(t, fmt.Sprintf(cloud, "0"))
	for _, tc := range []struct {
		name, state string
	}{
		{"not JSON", `{"step":`},
		{"not an object", `[1,2]`},
		{"unknown field", `{"step":"boot","instance":"i-0123456789abcdef","rm":"-rf"}`},
		{"unknown step", `{"step":"explode","instance":"i-0123456789abcdef"}`},
		{"boot without instance", `{"step":"boot"}`},
		{"instance not of this cloud", `{"step":"boot","instance":"../../etc"}`},
		{"two objects", `{"step":"boot","instance":"i-0123456789abcdef"}{}`},
	} {
		if _, err := p.Create(req("n1", 1, "small"), json.RawMessage(tc.state)); err == nil {
			t.Errorf("create resumed from %s (%s)", tc.name, tc.state)
		}
	}
	for _, ext := range []string{"", "i-", "i-missing", "i-0123456789ABCDEF", "a.b", "i-0123456789abcdef0"} {
		if _, err := p.Delete(ext, nil); !errors.Is(err, drivers.ErrNotFound) {
			t.Errorf("delete of %q: %v, want not found", ext, err)
		}
	}
	if _, err := p.Delete("i-0123456789abcdef", json.RawMessage(`{"step":"deleting","instance":"i-fedcba9876543210"}`)); err == nil {
		t.Error("a delete resumed from another instance's driver_data")
	}
	for _, ok := range []string{"", "null", `{}`, `{"step":"boot","instance":"i-0123456789abcdef"}`} {
		if _, err := p.Create(req("n1", 1, "small"), json.RawMessage(ok)); err != nil {
			t.Errorf("create from %q: %v", ok, err)
		}
	}
}

func TestForeignInstancesCountAgainstQuota(t *testing.T) {
	t.Parallel()
	p := provider(t, fmt.Sprintf(cloud, "0"))
	for _, name := range []string{"theirs-1", "theirs-2"} {
		if _, err := p.Inject(t.Context(), name, nil, 1, 512); err != nil {
			t.Fatal(err)
		}
	}
	if insts, _ := p.ListInstances(t.Context()); len(insts) != 2 {
		t.Fatalf("%d instances listed, want the 2 injected", len(insts))
	}
	_, err := run(t, must(p.Create(req("n1", 1, "small"), nil)))
	if !errors.Is(err, drivers.ErrQuotaExceeded) {
		t.Fatalf("create with the quota used by others: %v", err)
	}
}

func TestFailureRateOne(t *testing.T) {
	t.Parallel()
	p := provider(t, `
labels: [{name: small}]
providers:
  - name: p
    driver: fake
    failure-rate: 1
    pools: [{name: main, labels: [small]}]
`)
	_, err := run(t, must(p.Create(req("n1", 1, "small"), nil)))
	if err == nil {
		t.Fatal("a boot with failure-rate 1 succeeded")
	}
}

func must(sm drivers.StateMachine, err error) drivers.StateMachine {
	if err != nil {
		panic(err)
	}
	return sm
}

// The listing says whether each instance runs, in the cloud's words, and
// what Stop, Start, Break and Remove do out of band shows in the next
// listing.
func TestListingRunStates(t *testing.T) {
	t.Parallel()
	p := provider(t, fmt.Sprintf(cloud, "0"))
	ids := map[string]string{}
	for _, node := range []string{"stopped", "broken"} { // the cloud's quota: 2 instances
		sm, _ := p.Create(req(node, 1, "small"), nil)
		inst, err := run(t, sm)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Run != drivers.Running || inst.Status != fake.StatusActive {
			t.Fatalf("a new instance is %v (%s)", inst.Run, inst.Status)
		}
		ids[node] = inst.ExternalID
	}
	if err := p.Stop(t.Context(), ids["stopped"]); err != nil {
		t.Fatal(err)
	}
	if err := p.Break(t.Context(), ids["broken"]); err != nil {
		t.Fatal(err)
	}
	listed := func() map[string]drivers.Instance {
		t.Helper()
		insts, err := p.ListInstances(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]drivers.Instance{}
		for _, in := range insts {
			out[in.ExternalID] = in
		}
		return out
	}
	got := listed()
	for _, c := range []struct {
		node   string
		run    drivers.RunState
		status string
	}{{"stopped", drivers.Down, fake.StatusShutoff}, {"broken", drivers.Down, fake.StatusError}} {
		if in := got[ids[c.node]]; in.Run != c.run || in.Status != c.status {
			t.Errorf("%s: listed %v (%s), want %v (%s)", c.node, in.Run, in.Status, c.run, c.status)
		}
	}
	if err := p.Start(t.Context(), ids["stopped"]); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(t.Context(), ids["broken"]); err != nil {
		t.Fatal(err)
	}
	got = listed()
	if in := got[ids["stopped"]]; in.Run != drivers.Running || in.Status != fake.StatusActive {
		t.Errorf("started again: listed %v (%s)", in.Run, in.Status)
	}
	if _, ok := got[ids["broken"]]; ok {
		t.Error("a removed instance is still listed")
	}
	if err := p.Remove(t.Context(), ids["broken"]); !errors.Is(err, drivers.ErrNotFound) {
		t.Errorf("removing it again: %v; want not found", err)
	}
	if err := p.Stop(t.Context(), ids["broken"]); !errors.Is(err, drivers.ErrNotFound) {
		t.Errorf("stopping a removed instance: %v; want not found", err)
	}
}
