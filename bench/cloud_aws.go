package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
)

// awsTarget runs the aws driver against the AWS on loopback: t3.micro
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
`, callsPerSecond, devaws.DefaultImages[0].ID, max(5000, n))
	},
	Start: func(_ context.Context, _ string, latency, boot time.Duration) (CloudRun, error) {
		k := devaws.DefaultKnobs()
		k.APILatency, k.BootTime, k.TerminateTime = devaws.Duration(latency), devaws.Duration(boot), devaws.Duration(boot/4)
		for code := range k.Quotas {
			k.Quotas[code] = 1e6
		}
		cloud := devaws.New(devaws.Options{Knobs: k})
		srv, err := devaws.Listen("127.0.0.1:0", cloud)
		if err != nil {
			return CloudRun{}, err
		}
		return CloudRun{
			Env: []string{"AWS_ENDPOINT_URL=" + srv.URL(), "AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench",
				"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true"},
			Calls: func() (int, int) {
				total, refused := 0, 0
				for action, n := range cloud.Calls() {
					switch {
					case action == "throttled":
						refused += n
					case !strings.HasPrefix(action, "s3.") && !strings.HasPrefix(action, "ebs."):
						total += n
					}
				}
				return total, refused
			},
			Servers: func() int { return cloud.LiveInstances() },
			Stop:    srv.Close,
		}, nil
	},
}
