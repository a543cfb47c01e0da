package openstack_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	devos "github.com/nodepool-nats/nodepool/internal/devcloud/openstack"
)

// osCLI runs the openstack CLI (python3-openstackclient: keystoneauth,
// novaclient, cinderclient, openstacksdk, each with parsers of its own)
// against a cloud on loopback, through the clouds.yaml the cloud writes, as
// a user of nodepool-devcloud would.
type osCLI struct {
	t   *testing.T
	bin string
	env []string
}

func newOSCLI(t *testing.T, opts devos.Options) (*devos.Server, *osCLI) {
	t.Helper()
	bin, err := exec.LookPath("openstack")
	if err != nil {
		t.Fatal("the openstack CLI is not installed: this test checks the dev cloud with it; install it with `apt-get install -y python3-openstackclient` (.ci/run does)")
	}
	srv, err := devos.Start("127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	file, err := srv.WriteCloudsYAML(filepath.Join(t.TempDir(), "clouds.yaml"), "devcloud")
	if err != nil {
		t.Fatal(err)
	}
	return srv, &osCLI{t: t, bin: bin, env: append(os.Environ(), "OS_CLIENT_CONFIG_FILE="+file, "OS_CLOUD=devcloud", "HOME="+t.TempDir())}
}

func (o *osCLI) run(args ...string) ([]byte, string, error) {
	cmd := exec.CommandContext(o.t.Context(), o.bin, args...)
	cmd.Env = o.env
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out, string(ee.Stderr), err
	}
	return out, "", err
}

// json runs a command that must succeed with -f json and decodes what it
// prints into v.
func (o *osCLI) json(v any, args ...string) {
	o.t.Helper()
	args = append(args, "-f", "json")
	out, stderr, err := o.run(args...)
	if err != nil {
		o.t.Fatalf("openstack %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	if err := json.Unmarshal(out, v); err != nil {
		o.t.Fatalf("openstack %s printed no JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// The openstack CLI reads the project's quota, lists images, and
// creates, lists and deletes a server; Nova's quota refuses a server over
// it, in words the CLI shows.
func TestOpenStackCLI(t *testing.T) {
	t.Parallel()
	q := devos.DefaultQuota
	q.Instances, q.Cores = 1, 4
	srv, cli := newOSCLI(t, devos.Options{Quota: &q})

	var quota map[string]any
	cli.json(&quota, "quota", "show")
	for k, want := range map[string]float64{"instances": 1, "cores": 4, "ram": 51200, "volumes": 10, "gigabytes": 1000, "floating-ips": 50, "networks": 100, "ports": 500} {
		if quota[k] != want {
			t.Errorf("quota show: %s is %v, want %v", k, quota[k], want)
		}
	}
	if quota["project"] == nil || quota["project"] == "" || quota["project_name"] != devos.DefaultProject {
		t.Errorf("quota show: project %v (%v)", quota["project"], quota["project_name"])
	}
	cli.json(&quota, "quota", "show", "--default")
	if quota["instances"] != 10.0 || quota["cores"] != 20.0 {
		t.Errorf("quota show --default: %v", quota)
	}

	var images []map[string]any
	cli.json(&images, "image", "list")
	if len(images) != 1 || images[0]["Name"] != "cirros-0.6.2-x86_64-disk" || images[0]["Status"] != "active" || images[0]["ID"] != srv.Images()[0].ID {
		t.Errorf("image list: %v", images)
	}

	var created map[string]any
	cli.json(&created, "server", "create", "--image", "cirros-0.6.2-x86_64-disk", "--flavor", "m1.tiny", "--network", "private", "cli-test")
	id, _ := created["id"].(string)
	if id == "" || created["name"] != "cli-test" {
		t.Fatalf("server create: %v", created)
	}
	var servers []map[string]any
	cli.json(&servers, "server", "list")
	if len(servers) != 1 || servers[0]["ID"] != id || servers[0]["Name"] != "cli-test" || servers[0]["Flavor"] != "m1.tiny" ||
		servers[0]["Image"] != "cirros-0.6.2-x86_64-disk" {
		t.Errorf("server list: %v", servers)
	}
	if st := servers[0]["Status"]; st != "ACTIVE" && st != "BUILD" {
		t.Errorf("server list: status %v", st)
	}
	out, stderr, err := cli.run("server", "create", "--image", "cirros-0.6.2-x86_64-disk", "--flavor", "m1.tiny", "--network", "private", "over-quota")
	if err == nil || !strings.Contains(stderr, "Quota exceeded for instances") {
		t.Errorf("a server over quota: %v\n%s%s", err, out, stderr)
	}
	if _, stderr, err := cli.run("server", "delete", "cli-test"); err != nil {
		t.Fatalf("server delete: %v\n%s", err, stderr)
	}
	cli.json(&servers, "server", "list")
	if slices.ContainsFunc(servers, func(s map[string]any) bool { return s["ID"] == id && s["Status"] != "DELETED" }) {
		t.Errorf("server list after the delete: %v", servers)
	}
	for _, s := range srv.Servers() {
		if s.ID == id && !s.Deleting {
			t.Errorf("the deleted server is %s", s.Status)
		}
	}
}
