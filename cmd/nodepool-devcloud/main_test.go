package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/k8stest"
)

// binary is the nodepool-devcloud command built once for these tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodepool-devcloud-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "nodepool-devcloud")
	cmd := exec.Command("go", "build", "-o", binary, ".")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building nodepool-devcloud:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cloud is a running nodepool-devcloud.
type cloud struct {
	cmd     *exec.Cmd
	exports map[string]string
	done    chan struct{}
	err     error
}

// start runs nodepool-devcloud and waits for its line of exports.
func start(t *testing.T, args ...string) *cloud {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &cloud{cmd: cmd, done: make(chan struct{})}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "export ") {
				select {
				case line <- sc.Text():
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("nodepool-devcloud %s:\n%s", strings.Join(args, " "), stderr.String())
		}
	})
	select {
	case l := <-line:
		c.exports = map[string]string{}
		for _, kv := range strings.Fields(strings.TrimPrefix(l, "export ")) {
			k, v, _ := strings.Cut(kv, "=")
			c.exports[k] = v
		}
	case <-c.done:
		t.Fatalf("nodepool-devcloud %s exited: %v\n%s", strings.Join(args, " "), c.err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("nodepool-devcloud %s printed no exports within a minute", strings.Join(args, " "))
	}
	return c
}

// stop sends SIGTERM and waits for the process to end.
func (c *cloud) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		if c.err != nil {
			t.Errorf("nodepool-devcloud ended with %v on SIGTERM", c.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nodepool-devcloud did not end within 30 s of SIGTERM")
	}
}

// env is the environment with the cloud's exports, and nothing read from
// this machine's cloud settings.
func (c *cloud) env(t *testing.T) []string {
	env := append(os.Environ(), "HOME="+t.TempDir(), "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=")
	for k, v := range c.exports {
		env = append(env, k+"="+v)
	}
	return env
}

// cli runs a CLI with the cloud's exports and decodes its JSON output.
func (c *cloud) cli(t *testing.T, v any, name string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("the %s CLI is not installed: this test drives the dev cloud with it; install it with `apt-get install -y awscli python3-openstackclient` (.ci/run does)", name)
	}
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Env = c.env(t)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("%s %s printed no JSON: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// `nodepool-devcloud aws` prints the exports a user pastes, and the aws
// CLI works with them (and --endpoint-url, which Debian's awscli 2.9 needs:
// it does not read AWS_ENDPOINT_URL); SIGTERM ends it.
func TestAWS(t *testing.T) {
	t.Parallel()
	c := start(t, "aws", "--listen", "127.0.0.1:0", "--quota", "L-7A658B76=100", "--image", "ami-0123456789abcdef0=test-image")
	if !strings.HasPrefix(c.exports["AWS_ENDPOINT_URL"], "http://127.0.0.1:") || c.exports["AWS_DEFAULT_REGION"] != "us-east-1" ||
		c.exports["AWS_ACCESS_KEY_ID"] == "" || c.exports["AWS_SECRET_ACCESS_KEY"] == "" {
		t.Fatalf("exports: %v", c.exports)
	}
	var images struct {
		Images []struct{ ImageId, Name string }
	}
	url := c.exports["AWS_ENDPOINT_URL"]
	c.cli(t, &images, "aws", "--endpoint-url", url, "ec2", "describe-images", "--image-ids", "ami-0123456789abcdef0", "--output", "json")
	if len(images.Images) != 1 || images.Images[0].Name != "test-image" {
		t.Errorf("describe-images: %+v", images)
	}
	var quota struct{ Quota struct{ Value float64 } }
	c.cli(t, &quota, "aws", "--endpoint-url", url, "service-quotas", "get-service-quota", "--service-code", "ebs", "--quota-code", "L-7A658B76", "--output", "json")
	if quota.Quota.Value != 100 {
		t.Errorf("gp3 storage quota set to 100: %+v", quota)
	}
	c.stop(t)
}

// `nodepool-devcloud openstack --clouds-yaml FILE` writes the clouds.yaml,
// prints the exports that name it, and the openstack CLI works with them
// alone (no --os-cloud); SIGTERM ends it.
func TestOpenStack(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "clouds.yaml")
	c := start(t, "openstack", "--listen", "127.0.0.1:0", "--clouds-yaml", file, "--quota-instances", "7")
	if c.exports["OS_CLIENT_CONFIG_FILE"] != file || c.exports["OS_CLOUD"] != "devcloud" {
		t.Fatalf("exports: %v", c.exports)
	}
	var images []map[string]any
	c.cli(t, &images, "openstack", "image", "list", "-f", "json")
	if len(images) != 1 || images[0]["Name"] != "cirros-0.6.2-x86_64-disk" {
		t.Errorf("image list: %v", images)
	}
	var quota map[string]any
	c.cli(t, &quota, "openstack", "quota", "show", "-f", "json")
	if quota["instances"] != 7.0 {
		t.Errorf("quota show: %v", quota)
	}
	c.stop(t)
}

// `nodepool-devcloud kubernetes` runs the tests' cluster and prints the
// export of its kubeconfig; kubectl reaches it with that alone and sees
// its Ready node; SIGTERM stops it and its processes.
func TestKubernetes(t *testing.T) {
	t.Parallel()
	if err := k8stest.Available(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := start(t, "kubernetes", "--dir", dir)
	kc := c.exports["KUBECONFIG"]
	if !strings.HasPrefix(kc, dir) {
		t.Fatalf("exports: %v", c.exports)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(k8stest.Tools(), "kubectl"), "get", "nodes", "-o", "json")
	cmd.Env = append(c.env(t), "KUBERC=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl get nodes: %v", err)
	}
	var nodes struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				Conditions []struct{ Type, Status string }
			}
		}
	}
	if err := json.Unmarshal(out, &nodes); err != nil || len(nodes.Items) != 1 || nodes.Items[0].Metadata.Name != "kwok-node-0" {
		t.Fatalf("nodes: %v %s", err, out)
	}
	ready := false
	for _, c := range nodes.Items[0].Status.Conditions {
		ready = ready || c.Type == "Ready" && c.Status == "True"
	}
	if !ready {
		t.Errorf("kwok-node-0 is not Ready: %s", out)
	}
	c.stop(t)
	// The API server is gone with it.
	cmd = exec.CommandContext(t.Context(), filepath.Join(k8stest.Tools(), "kubectl"), "get", "nodes", "--request-timeout=5s")
	cmd.Env = append(c.env(t), "KUBERC=off")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("the cluster still answers after SIGTERM: %s", out)
	}
}

// Flags it cannot take are refused before it listens, with what was
// expected.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"aws", "--quota", "L-1216C47A"}, `--quota "L-1216C47A": expected CODE=VALUE`},
		{[]string{"aws", "--image", "debian"}, `--image "debian": expected AMI_ID=NAME`},
		{[]string{"openstack", "--flavor", "big"}, `--flavor "big": expected NAME:VCPUS:RAM_MIB:DISK_GIB`},
		{[]string{"openstack", "--error-rate", "2"}, "--error-rate must be from 0 to 1"},
		{[]string{"aws", "--log-level", "loud"}, `--log-level "loud": expected debug, info, warn or error`},
		{[]string{"gcp"}, `unknown command "gcp"`},
	} {
		out, err := exec.CommandContext(t.Context(), binary, tc.args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("nodepool-devcloud %s: %v, %q; want exit 1 saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
}
