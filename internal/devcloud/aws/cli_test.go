package aws

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"
)

// The aws CLI (botocore, another real client with parsers of its own)
// reads what the cloud holds.
func TestAWSCLI(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("aws")
	if err != nil {
		t.Fatal("the aws CLI is not installed: this test checks the dev cloud with it; install it with `apt-get install -y awscli` (.ci/run does)")
	}
	c := New(Options{Knobs: fast()})
	srv, err := Listen("127.0.0.1:0", c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	env := append(os.Environ(), "AWS_ACCESS_KEY_ID=dev", "AWS_SECRET_ACCESS_KEY=dev", "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true")
	aws := func(args ...string) map[string]any {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, append([]string{"--endpoint-url", srv.URL(), "--output", "json"}, args...)...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("aws %v: %v\n%s", args, err, stderr)
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("aws %v printed no JSON: %s", args, out)
		}
		return v
	}
	run := aws("ec2", "run-instances", "--image-id", DefaultImages[0].ID, "--instance-type", "t3.micro", "--count", "2",
		"--tag-specifications", "ResourceType=instance,Tags=[{Key=nodepool_provider_name,Value=cli}]")
	if n := len(run["Instances"].([]any)); n != 2 {
		t.Fatalf("run-instances made %d instances", n)
	}
	d := aws("ec2", "describe-instances", "--filters", "Name=tag:nodepool_provider_name,Values=cli")
	res := d["Reservations"].([]any)
	if len(res) != 1 || len(res[0].(map[string]any)["Instances"].([]any)) != 2 {
		t.Fatalf("describe-instances: %v", d)
	}
	im := aws("ec2", "describe-images", "--owners", "amazon")
	if len(im["Images"].([]any)) != len(DefaultImages) {
		t.Fatalf("describe-images: %v", im)
	}
	q := aws("service-quotas", "get-service-quota", "--service-code", "ec2", "--quota-code", "L-1216C47A")
	if q["Quota"].(map[string]any)["Value"].(float64) != 256 {
		t.Fatalf("get-service-quota: %v", q)
	}
}
