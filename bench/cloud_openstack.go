package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
)

// openstackTarget runs the openstack driver against the OpenStack on
// loopback. Nodes get no floating IP and no host-key scan: what is
// measured is the driver's and the launcher's work against Nova's latency
// and boot time.
var openstackTarget = CloudTarget{
	Config: func(n int, callsPerSecond float64) string {
		rate := 0.0 // openstack's rate is seconds between calls
		if callsPerSecond > 0 {
			rate = 1 / callsPerSecond
		}
		return fmt.Sprintf(`labels:
  - name: bench
providers:
  - name: bench
    cloud: devcloud
    rate: %g
    boot-timeout: 600
    cloud-images:
      - name: cirros
        image-name: cirros-0.6.2-x86_64-disk
    pools:
      - name: main
        max-servers: %d
        auto-floating-ip: false
        host-key-checking: false
        labels:
          - name: bench
            cloud-image: cirros
            flavor-name: m1.tiny
`, rate, max(5000, n))
	},
	Start: func(_ context.Context, workDir string, latency, boot time.Duration) (CloudRun, error) {
		unlimited := devos.Quota{Instances: -1, Cores: -1, RAM: -1, Volumes: -1, Gigabytes: -1, FloatingIPs: -1}
		srv, err := devos.Start("127.0.0.1:0", devos.Options{Latency: latency, BootTime: boot, DeleteTime: boot / 4, Quota: &unlimited})
		if err != nil {
			return CloudRun{}, err
		}
		file, err := srv.WriteCloudsYAML(filepath.Join(workDir, "clouds.yaml"), "devcloud")
		if err != nil {
			_ = srv.Close()
			return CloudRun{}, err
		}
		return CloudRun{
			Env: []string{"OS_CLIENT_CONFIG_FILE=" + file},
			Calls: func() (int, int) {
				st := srv.Stats()
				total := 0
				for _, c := range st.Calls {
					total += c
				}
				return total, st.RateLimited
			},
			Servers: func() int { return len(srv.Servers()) },
			Times: func() map[string][2]time.Time {
				out := map[string][2]time.Time{}
				for _, s := range srv.Servers() {
					out[s.ID] = [2]time.Time{s.Created, s.Launched}
				}
				return out
			},
			Stop: func() { _ = srv.Close() },
		}, nil
	},
}
