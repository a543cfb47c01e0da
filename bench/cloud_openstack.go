package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// openstackTarget runs the openstack driver against `nodepool-devcloud
// openstack`. Nodes get no floating IP and no host-key scan: what is
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
	Start: func(ctx context.Context, devcloud, workDir string, latency, boot time.Duration) (CloudRun, error) {
		file := filepath.Join(workDir, "clouds.yaml")
		args := []string{"openstack", "--listen", "127.0.0.1:0", "--latency", latency.String(), "--boot-time", boot.String(),
			"--delete-time", (boot / 4).String(), "--clouds-yaml", file, "--cloud-name", "devcloud"}
		for _, q := range []string{"instances", "cores", "ram", "volumes", "gigabytes", "floating-ips"} {
			args = append(args, "--quota-"+q+"=-1")
		}
		d, err := startDevCloud(ctx, devcloud, workDir, args...)
		if err != nil {
			return CloudRun{}, err
		}
		url, err := cloudsYAMLBase(file)
		if err != nil {
			d.stop()
			return CloudRun{}, err
		}
		type server struct {
			ID       string     `json:"id"`
			Created  time.Time  `json:"created"`
			Launched *time.Time `json:"launched"`
		}
		servers := func() ([]server, error) {
			var out []server
			return out, getJSON(url+"/_devcloud/servers", &out)
		}
		return CloudRun{
			Env: []string{"OS_CLIENT_CONFIG_FILE=" + file},
			Calls: func() (int, int, error) {
				var st struct {
					Calls       map[string]int `json:"calls"`
					RateLimited int            `json:"rate_limited"`
				}
				if err := getJSON(url+"/_devcloud/stats", &st); err != nil {
					return 0, 0, err
				}
				total := 0
				for _, c := range st.Calls {
					total += c
				}
				return total, st.RateLimited, nil
			},
			Servers: func() (int, error) {
				s, err := servers()
				return len(s), err
			},
			Times: func() (map[string][2]time.Time, error) {
				s, err := servers()
				out := map[string][2]time.Time{}
				for _, sv := range s {
					var launched time.Time
					if sv.Launched != nil {
						launched = *sv.Launched
					}
					out[sv.ID] = [2]time.Time{sv.Created, launched}
				}
				return out, err
			},
			Stop: d.stop,
		}, nil
	},
}

// cloudsYAMLBase is the address of the cloud a clouds.yaml written by
// nodepool-devcloud names (its auth_url less /identity/v3).
func cloudsYAMLBase(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if _, url, ok := strings.Cut(sc.Text(), "auth_url: "); ok {
			return strings.TrimSuffix(strings.TrimSpace(url), "/identity/v3"), nil
		}
	}
	return "", fmt.Errorf("%s names no auth_url", path)
}
