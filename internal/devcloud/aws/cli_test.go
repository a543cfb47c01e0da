package aws

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// awsCLI runs the aws CLI against a cloud on loopback, as a user would
// with the exports nodepool-devcloud prints: nothing is read from this
// machine's AWS files.
type awsCLI struct {
	t        *testing.T
	bin, url string
}

func newAWSCLI(t *testing.T, c *Cloud) *awsCLI {
	t.Helper()
	bin, err := exec.LookPath("aws")
	if err != nil {
		t.Fatal("the aws CLI is not installed: this test checks the dev cloud with it; install it with `apt-get install -y awscli` (.ci/run does)")
	}
	srv, err := Listen("127.0.0.1:0", c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &awsCLI{t: t, bin: bin, url: srv.URL()}
}

// run runs a command and returns its exit error, standard output and
// standard error.
func (a *awsCLI) run(args ...string) ([]byte, string, error) {
	cmd := exec.CommandContext(a.t.Context(), a.bin, append([]string{"--endpoint-url", a.url, "--output", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=dev", "AWS_SECRET_ACCESS_KEY=dev", "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out, string(ee.Stderr), err
	}
	return out, "", err
}

// json runs a command that must succeed and decodes what it prints.
func (a *awsCLI) json(args ...string) map[string]any {
	a.t.Helper()
	out, stderr, err := a.run(args...)
	if err != nil {
		a.t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		a.t.Fatalf("aws %s printed no JSON: %s", strings.Join(args, " "), out)
	}
	return v
}

// fails runs a command that must fail, saying want.
func (a *awsCLI) fails(want string, args ...string) {
	a.t.Helper()
	out, stderr, err := a.run(args...)
	if err == nil || !strings.Contains(stderr, want) {
		a.t.Errorf("aws %s: %v, want a failure saying %q\n%s%s", strings.Join(args, " "), err, want, out, stderr)
	}
}

// list is the items of a listing's field.
func list(v map[string]any, field string) []map[string]any {
	var out []map[string]any
	items, _ := v[field].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		out = append(out, m)
	}
	return out
}

// The aws CLI (botocore, another real client with parsers of its own)
// manages instances as a user would: images, a launch, the listing and
// the termination.
func TestAWSCLIInstances(t *testing.T) {
	t.Parallel()
	aws := newAWSCLI(t, New(Options{Knobs: fast()}))
	im := aws.json("ec2", "describe-images", "--owners", "amazon")
	if len(list(im, "Images")) != len(DefaultImages) {
		t.Fatalf("describe-images: %v", im)
	}
	im = aws.json("ec2", "describe-images", "--image-ids", DefaultImages[0].ID)
	if got := list(im, "Images"); len(got) != 1 || got[0]["Name"] != DefaultImages[0].Name {
		t.Fatalf("describe-images --image-ids: %v", im)
	}
	run := aws.json("ec2", "run-instances", "--image-id", DefaultImages[0].ID, "--instance-type", "t3.micro", "--count", "2",
		"--tag-specifications", "ResourceType=instance,Tags=[{Key=nodepool_provider_name,Value=cli}]")
	var ids []string
	for _, in := range list(run, "Instances") {
		ids = append(ids, in["InstanceId"].(string))
	}
	if len(ids) != 2 {
		t.Fatalf("run-instances made %d instances: %v", len(ids), run)
	}
	d := aws.json("ec2", "describe-instances", "--filters", "Name=tag:nodepool_provider_name,Values=cli")
	res := list(d, "Reservations")
	if len(res) != 1 || len(list(res[0], "Instances")) != 2 {
		t.Fatalf("describe-instances: %v", d)
	}
	for _, in := range list(res[0], "Instances") {
		if st := in["State"].(map[string]any)["Name"]; st != "pending" && st != "running" {
			t.Errorf("instance %v is %v", in["InstanceId"], st)
		}
	}
	term := aws.json(append([]string{"ec2", "terminate-instances", "--instance-ids"}, ids...)...)
	for _, ti := range list(term, "TerminatingInstances") {
		if st := ti["CurrentState"].(map[string]any)["Name"]; st != "shutting-down" && st != "terminated" {
			t.Errorf("terminate-instances: %v is %v", ti["InstanceId"], st)
		}
	}
	if n := len(list(term, "TerminatingInstances")); n != 2 {
		t.Errorf("terminate-instances: %d instances: %v", n, term)
	}
	d = aws.json("ec2", "describe-instances", "--instance-ids", ids[0])
	st := list(list(d, "Reservations")[0], "Instances")[0]["State"].(map[string]any)["Name"]
	if st != "shutting-down" && st != "terminated" {
		t.Errorf("a terminated instance is %v", st)
	}
	aws.fails("InvalidInstanceID.NotFound", "ec2", "terminate-instances", "--instance-ids", "i-0123456789abcdef0")
}

// Service Quotas answers the aws CLI for EC2 and EBS as AWS does: every
// code Nodepool's aws driver reads (vCPUs per instance family, dedicated
// hosts, EBS storage and IOPS per volume type), one by one, listed page
// by page and by default value; unknown services and quotas are
// NoSuchResourceException.
func TestAWSCLIServiceQuotas(t *testing.T) {
	t.Parallel()
	c := New(Options{Knobs: fast()})
	c.SetKnobs(func(k *Knobs) { k.Quotas["L-7A658B76"] = 200 })
	aws := newAWSCLI(t, c)
	quota := func(service, code string) map[string]any {
		t.Helper()
		q, _ := aws.json("service-quotas", "get-service-quota", "--service-code", service, "--quota-code", code)["Quota"].(map[string]any)
		return q
	}
	if q := quota("ec2", "L-1216C47A"); q["Value"] != 256.0 || q["QuotaName"] != "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances" {
		t.Errorf("ec2 L-1216C47A: %v", q)
	}
	q := quota("ebs", "L-D18FCD1D")
	if q["Value"] != 50.0 || q["QuotaName"] != "Storage for General Purpose SSD (gp2) volumes, in TiB" || q["ServiceCode"] != "ebs" ||
		q["ServiceName"] != "Amazon Elastic Block Store (Amazon EBS)" || q["QuotaArn"] != "arn:aws:servicequotas:us-east-1:123456789012:ebs/L-D18FCD1D" {
		t.Errorf("ebs L-D18FCD1D: %v", q)
	}
	if q := quota("ebs", "L-8D977E7E"); q["Value"] != 100000.0 || q["QuotaName"] != "IOPS for Provisioned IOPS SSD (io2) volumes" {
		t.Errorf("ebs L-8D977E7E: %v", q)
	}
	// A quota set by the knobs, and its default.
	if q := quota("ebs", "L-7A658B76"); q["Value"] != 200.0 {
		t.Errorf("ebs L-7A658B76 set to 200: %v", q)
	}
	def := aws.json("service-quotas", "get-aws-default-service-quota", "--service-code", "ebs", "--quota-code", "L-7A658B76")
	if v := def["Quota"].(map[string]any)["Value"]; v != 50.0 {
		t.Errorf("default of ebs L-7A658B76: %v", v)
	}

	// Listed as Nodepool reads them (boto's paginator); the CLI follows
	// NextToken, here three quotas a page.
	values := func(service string, extra ...string) map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, q := range list(aws.json(append([]string{"service-quotas", "list-service-quotas", "--service-code", service}, extra...)...), "Quotas") {
			if q["ServiceCode"] != service {
				t.Errorf("%s listing holds %v", service, q)
			}
			out[q["QuotaCode"].(string)] = q["Value"].(float64)
		}
		return out
	}
	ebs := values("ebs", "--page-size", "3")
	for typ, vq := range awsquota.VolumeQuotas {
		if _, ok := ebs[vq.Storage]; !ok {
			t.Errorf("no storage quota %s of %s volumes in %v", vq.Storage, typ, ebs)
		}
		if _, ok := ebs[vq.IOPS]; vq.IOPS != "" && !ok {
			t.Errorf("no IOPS quota %s of %s volumes in %v", vq.IOPS, typ, ebs)
		}
	}
	if len(ebs) != 10 || ebs["L-7A658B76"] != 200 || ebs["L-09BD8365"] != 20 || ebs["L-B3A130E6"] != 300000 {
		t.Errorf("ebs quotas: %v", ebs)
	}
	ec2 := values("ec2", "--page-size", "7")
	for _, qu := range awsquota.Quotas {
		if _, ok := ec2[qu.Code]; !ok {
			t.Errorf("no vCPU quota %s in %v", qu.Code, ec2)
		}
	}
	if ec2["L-8B7BF662"] != 2 || ec2["L-1586174D"] != 2 { // dedicated m5 and t3 hosts
		t.Errorf("ec2 quotas: %v", ec2)
	}
	// One page at a time, by the CLI's own tokens.
	first := aws.json("service-quotas", "list-service-quotas", "--service-code", "ebs", "--max-items", "4")
	token, _ := first["NextToken"].(string)
	if len(list(first, "Quotas")) != 4 || token == "" {
		t.Fatalf("first page: %v", first)
	}
	rest := aws.json("service-quotas", "list-service-quotas", "--service-code", "ebs", "--starting-token", token)
	if n := len(list(rest, "Quotas")); n != 6 {
		t.Errorf("the rest after %s: %d quotas", token, n)
	}
	defaults := values("ebs")
	if defaults["L-7A658B76"] != 200 {
		t.Errorf("list-service-quotas gives the account's value: %v", defaults["L-7A658B76"])
	}
	for _, q := range list(aws.json("service-quotas", "list-aws-default-service-quotas", "--service-code", "ebs"), "Quotas") {
		if q["QuotaCode"] == "L-7A658B76" && q["Value"] != 50.0 {
			t.Errorf("list-aws-default-service-quotas: %v", q)
		}
	}

	var services []string
	for _, s := range list(aws.json("service-quotas", "list-services", "--page-size", "1"), "Services") {
		services = append(services, s["ServiceCode"].(string)+"="+s["ServiceName"].(string))
	}
	if !slices.Equal(services, []string{"ebs=Amazon Elastic Block Store (Amazon EBS)", "ec2=Amazon Elastic Compute Cloud (Amazon EC2)"}) {
		t.Errorf("list-services: %v", services)
	}

	aws.fails("NoSuchResourceException", "service-quotas", "get-service-quota", "--service-code", "ebs", "--quota-code", "L-1216C47A")
	aws.fails("NoSuchResourceException", "service-quotas", "get-service-quota", "--service-code", "nosuch", "--quota-code", "L-1216C47A")
	aws.fails("NoSuchResourceException", "service-quotas", "list-service-quotas", "--service-code", "nosuch")
}
