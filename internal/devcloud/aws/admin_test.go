package aws

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/nodepool-nats/nodepool/internal/awsbody"
)

// The dev cloud's own API lists the instances not terminated with their
// times (what `nodepool bench cloud` reads) and counts the calls.
func TestAdminInstancesAndCalls(t *testing.T) {
	t.Parallel()
	k := fast()
	k.BootTime, k.TerminateTime = 0, Duration(time.Hour)
	c := New(Options{Knobs: k})
	srv, err := Listen("127.0.0.1:0", c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cl := ec2.NewFromConfig(sdkaws.Config{Region: "us-east-1", BaseEndpoint: sdkaws.String(srv.URL()), RetryMaxAttempts: 1, HTTPClient: awsbody.Client(nil),
		Credentials: sdkaws.AnonymousCredentials{}})
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var none []InstanceInfo
	get("/_devcloud/instances", &none)
	if len(none) != 0 {
		t.Fatalf("instances of a new cloud: %+v", none)
	}
	run, err := cl.RunInstances(t.Context(), &ec2.RunInstancesInput{ImageId: sdkaws.String(DefaultImages[0].ID),
		InstanceType: ec2types.InstanceTypeT3Micro, MinCount: sdkaws.Int32(2), MaxCount: sdkaws.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.TerminateInstances(t.Context(), &ec2.TerminateInstancesInput{InstanceIds: []string{*run.Instances[1].InstanceId}}); err != nil {
		t.Fatal(err)
	}
	var got []InstanceInfo
	get("/_devcloud/instances", &got)
	state := map[string]string{}
	for _, in := range got {
		state[in.ID] = in.State
		if in.Type != "t3.micro" || in.Running == nil || in.Running.Before(in.Launched) {
			t.Errorf("instance: %+v", in)
		}
	}
	// The terminated one is listed while it shuts down.
	if len(got) != 2 || state[*run.Instances[0].InstanceId] != "running" || state[*run.Instances[1].InstanceId] != "shutting-down" {
		t.Errorf("instances: %+v", got)
	}
	var calls map[string]int
	get("/_devcloud/calls", &calls)
	if calls["RunInstances"] != 1 || calls["TerminateInstances"] != 1 {
		t.Errorf("calls: %v", calls)
	}
}
