package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	devaws "github.com/nodepool-nats/nodepool/internal/devcloud/aws"
	"github.com/nodepool-nats/nodepool/internal/natstest"
	"github.com/nodepool-nats/nodepool/internal/waitfor"
	"github.com/nodepool-nats/nodepool/kv"
)

const awsKillConfig = `
labels:
  - name: small
providers:
  - name: ec2
    driver: aws
    region-name: us-east-1
    rate: 100
    cloud-images:
      - name: debian
        image-id: ami-0a1b2c3d4e5f60001
    pools:
      - name: main
        host-key-checking: false
        labels:
          - name: small
            cloud-image: debian
            instance-type: t3.medium
            key-name: zuul
`

// awsEnv points a nodepool process's AWS SDK at a dev cloud, with static
// credentials and nothing read from this machine's AWS files.
func awsEnv(env map[string]string, endpoint string) map[string]string {
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "dev", "AWS_SECRET_ACCESS_KEY": "dev",
		"AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true",
	} {
		env[k] = v
	}
	return env
}

// A launcher is killed (SIGKILL) while its AWS instance boots; another
// launcher resumes the launch from the node's driver_data: the node gets
// that instance, and no second one is made.
func TestAWSLaunchResumedAfterKill(t *testing.T) {
	t.Parallel()
	k := devaws.DefaultKnobs()
	k.BootTime, k.InstanceAddress = devaws.Duration(4*time.Second), "127.0.0.1"
	cloud := devaws.New(devaws.Options{Knobs: k})
	srv, err := devaws.Listen("127.0.0.1:0", cloud)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ns := natstest.Start(t)
	url := ns.ClientURL()
	cfg := writeConfig(t, awsKillConfig)
	p1 := startRun(t, awsEnv(launcherEnv(url, "aws-1"), srv.URL()), "-c", cfg)
	p1.waitLog("launcher running", 60*time.Second)

	_, c := connectClient(t, url)
	nodes := kv.NewCache(c.Buckets().Nodes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(nodes.Start())
	if _, err := c.JetStream().Publish(t.Context(), "nodepool.requests.new", []byte(`{"id": "k1", "labels": ["small"]}`)); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func(*kv.Node) bool) kv.Node {
		t.Helper()
		sub := nodes.Subscribe()
		defer nodes.Unsubscribe(sub)
		var found *kv.Node
		waitfor.Until(t, 60*time.Second, what, func() bool {
			nodes.Range(func(e *kv.Entry[kv.Node]) bool {
				if cond(&e.Value) {
					n := e.Value
					found = &n
					return false
				}
				return true
			})
			return found != nil
		}, waitfor.Changes(sub))
		return *found
	}
	booting := wait("the launch recorded in driver_data", func(n *kv.Node) bool {
		return n.State == kv.NodeBuilding && strings.Contains(string(n.DriverData), `"instance_id"`)
	})
	var st struct {
		InstanceID string `json:"instance_id"`
	}
	if err := json.Unmarshal(booting.DriverData, &st); err != nil {
		t.Fatal(err)
	}
	_ = p1.stop(syscall.SIGKILL, 10*time.Second)

	p2 := startRun(t, awsEnv(launcherEnv(url, "aws-2"), srv.URL()), "-c", cfg)
	p2.waitLog("launcher running", 60*time.Second)
	ready := wait("the node ready", func(n *kv.Node) bool { return n.ID == booting.ID && n.State == kv.NodeReady })
	if ready.ExternalID != st.InstanceID {
		t.Fatalf("the node has instance %s; the killed launcher made %s", ready.ExternalID, st.InstanceID)
	}
	if n := cloud.Calls()["RunInstances"]; n != 1 {
		t.Fatalf("%d RunInstances calls for one node", n)
	}
	_ = p2.stop(syscall.SIGTERM, 20*time.Second)
}
