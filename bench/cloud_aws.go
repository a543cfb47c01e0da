package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// benchAMI is the public AMI the bench's AWS offers (nodepool-devcloud aws
// --image).
const benchAMI = "ami-0be0c0000000be0c1"

// awsInstance is an instance as nodepool-devcloud lists it
// (/_devcloud/instances).
type awsInstance struct {
	ID       string     `json:"id"`
	Launched time.Time  `json:"launched"`
	Running  *time.Time `json:"running"`
}

// awsTarget runs the aws driver against `nodepool-devcloud aws`: t3.micro
// instances from a public AMI, no host-key scan, quotas out of the way;
// what is measured is the driver's and the launcher's work against EC2's
// latency and boot time.
var awsTarget = CloudTarget{
	Config: func(n int, callsPerSecond float64) string {
		return fmt.Sprintf(`labels:
  - name: bench
providers:
  - name: bench
    driver: aws
    region-name: us-east-1
    rate: %g
    boot-timeout: 600
    cloud-images:
      - name: debian
        image-id: %s
    pools:
      - name: main
        max-servers: %d
        host-key-checking: false
        labels:
          - name: bench
            cloud-image: debian
            instance-type: t3.micro
            key-name: bench
`, callsPerSecond, benchAMI, max(5000, n))
	},
	Start: func(ctx context.Context, devcloud, workDir string, latency, boot time.Duration) (CloudRun, error) {
		args := []string{"aws", "--listen", "127.0.0.1:0", "--api-latency", latency.String(), "--boot-time", boot.String(),
			"--terminate-time", (boot / 4).String(), "--image", benchAMI + "=bench-debian-12"}
		for _, q := range awsquota.Quotas {
			args = append(args, "--quota", q.Code+"=1000000")
		}
		d, err := startDevCloud(ctx, devcloud, workDir, args...)
		if err != nil {
			return CloudRun{}, err
		}
		url := d.exports["AWS_ENDPOINT_URL"]
		if url == "" {
			d.stop()
			return CloudRun{}, fmt.Errorf("nodepool-devcloud aws exported no AWS_ENDPOINT_URL: %v", d.exports)
		}
		env := []string{"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true"}
		for k, v := range d.exports {
			env = append(env, k+"="+v)
		}
		instances := func() ([]awsInstance, error) {
			var out []awsInstance
			return out, getJSON(url+"/_devcloud/instances", &out)
		}
		return CloudRun{
			Env: env,
			Calls: func() (int, int, error) {
				var calls map[string]int
				if err := getJSON(url+"/_devcloud/calls", &calls); err != nil {
					return 0, 0, err
				}
				total, refused := 0, 0
				for action, n := range calls {
					switch {
					case action == "throttled":
						refused += n
					case !strings.HasPrefix(action, "s3.") && !strings.HasPrefix(action, "ebs."):
						total += n
					}
				}
				return total, refused, nil
			},
			Servers: func() (int, error) {
				in, err := instances()
				return len(in), err
			},
			Times: func() (map[string][2]time.Time, error) {
				in, err := instances()
				out := map[string][2]time.Time{}
				for _, i := range in {
					if i.Running != nil {
						out[i.ID] = [2]time.Time{i.Launched, *i.Running}
					}
				}
				return out, err
			},
			Stop: d.stop,
		}, nil
	},
}
