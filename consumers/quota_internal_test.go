package consumers

import (
	"testing"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
)

// A kubernetes pool's limits: max-servers, max-cores and max-ram, and its
// max-resources by name (cores, ram and instances among them, as
// Nodepool's quota takes them), rounded down; the provider's are its
// pools' defaults.
func TestKubernetesPoolLimits(t *testing.T) {
	cfg, err := config.Parse("nodepool.yaml", []byte(`
labels: [{name: pod}]
providers:
  - name: k8s
    driver: kubernetes
    context: admin
    max-ram: 4096
    pools:
      - name: main
        max-servers: 5
        max-cores: 8
        max-resources: {nvidia.com/gpu: 2.5, ephemeral-storage: 1000, cores: 6, instances: 7}
        labels: [{name: pod, type: pod, image: x}]
      - name: other
        labels: [{name: pod, type: pod, image: x}]
`))
	if err != nil {
		t.Fatal(err)
	}
	main := poolLimits(&cfg.Providers[0].Pools[0])
	if main.Instances != 5 || main.Cores != 6 || main.RAM != 4096 || main.Other["nvidia.com/gpu"] != 2 || main.Other["ephemeral-storage"] != 1000 {
		t.Errorf("pool main's limits %+v", main)
	}
	other := poolLimits(&cfg.Providers[0].Pools[1])
	if _, limited := other.Other["nvidia.com/gpu"]; other.Instances != drivers.Unlimited || other.Cores != drivers.Unlimited || other.RAM != 4096 || limited {
		t.Errorf("pool other's limits %+v", other)
	}
	// Three pods of a GPU each do not fit in pool main; two do.
	need := drivers.Resources{Instances: 3, Other: map[string]int{"nvidia.com/gpu": 3}}
	if why, over := exceeds(need, main); !over || why != "3 nvidia.com/gpu, limit 2" {
		t.Errorf("exceeds = %q, %v", why, over)
	}
	need.Instances, need.Other["nvidia.com/gpu"] = 2, 2
	if why, over := exceeds(need, main); over {
		t.Errorf("two GPUs exceed: %s", why)
	}
}
