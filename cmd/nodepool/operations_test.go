package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	out, errOut, code := nodepool(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(out, "nodepool ") || !strings.Contains(out, "commit") || !strings.Contains(out, "go1.") {
		t.Errorf("--version: code %d %q %q", code, out, errOut)
	}
}

// The operator's commands of Nodepool against `nodepool run`: list with
// --fields and --detail, label-list, the guards of return and delete,
// request-delete, info and erase, export-image-data and import-image-data.
func TestCLIOperations(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(cliConfig, "0.1"))
	port := freePort(t)
	env := runEnv(t, t.TempDir(), port)
	env["NODEPOOL_ID"] = "ops-launcher"
	env["NODEPOOL_ROLES"] = "launcher" // a builder would delete the image records of images not configured
	p := startRun(t, env, "-c", cfg)
	p.waitLog("launcher running", 30*time.Second)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	rec := watchRecords(t, url, "cloud1")
	cli := map[string]string{"NODEPOOL_NATS_URL": url, "NODEPOOL_CONFIG": cfg}
	ctx := t.Context()

	var ready kv.Node
	rec.until(20*time.Second, "a min-ready node", func() bool {
		rec.nodes.Range(func(e *kv.Entry[kv.Node]) bool {
			if e.Value.State == kv.NodeReady && e.Value.AllocatedTo == "" {
				ready = e.Value
			}
			return ready.ID == ""
		})
		return ready.ID != ""
	})

	// list: Nodepool's columns, node age beside state age; --fields in
	// the order given; --detail; --json with the same keys.
	out, errOut, code := nodepool(t, cli, "list")
	header := strings.Split(out, "\n")[1]
	for _, h := range []string{"| ID ", "| Provider ", "| Label ", "| Server ID ", "| Public IPv4 ", "| IPv6 ", "| State ", "| State Age ", "| Node Age ", "| Locked ", "| Holder ", "| Comment "} {
		if code != 0 || !strings.Contains(header, h) {
			t.Errorf("list: no column %q (code %d %s)\n%s", h, code, errOut, out)
		}
	}
	if strings.Contains(header, "Driver Data") {
		t.Errorf("list shows --detail's columns:\n%s", out)
	}
	out, _, _ = nodepool(t, cli, "list", "--fields", "state,id")
	if lines := strings.Split(out, "\n"); !strings.HasPrefix(lines[1], "| State | ID ") || !strings.Contains(out, "| ready | "+ready.ID+" |") {
		t.Errorf("list --fields state,id:\n%s", out)
	}
	out, _, _ = nodepool(t, cli, "list", "--detail")
	if !strings.Contains(out, "| Driver Data ") || !strings.Contains(out, "| Allocated To ") || !strings.Contains(out, "| Launcher ") {
		t.Errorf("list --detail:\n%s", out)
	}
	out, _, _ = nodepool(t, cli, "list", "--json", "--fields", "id,launcher,locked")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) == 0 || len(rows[0]) != 3 || rows[0]["launcher"] != "ops-launcher" {
		t.Errorf("list --json --fields: %v\n%s", err, out)
	}
	_, errOut, code = nodepool(t, cli, "list", "--fields", "id,colour")
	if code == 0 || !strings.Contains(errOut, `--fields: unknown field "colour"; expected some of: id, provider,`) {
		t.Errorf("list --fields colour: code %d %q", code, errOut)
	}
	out, _, _ = nodepool(t, cli, "label-list")
	if !strings.Contains(out, "| big ") || !strings.Contains(out, "| small ") {
		t.Errorf("label-list:\n%s", out)
	}

	// A held node is refused by return and delete without --force.
	if _, errOut, code := nodepool(t, cli, "hold", ready.ID, "--reason", "look at it"); code != 0 {
		t.Fatalf("hold: %s", errOut)
	}
	// The launcher serves the table (the CLI does not read the buckets),
	// brought up to date first: the hold just written is in it. Read
	// from the buckets, the same line.
	debug := maps.Clone(cli)
	debug["NODEPOOL_LOG_LEVEL"] = "debug"
	for _, args := range [][]string{{"list"}, {"list", "--from-buckets"}} {
		out, errOut, code := nodepool(t, debug, append(args, "--json", "--fields", "id,state,comment")...)
		var rows []map[string]any
		_ = json.Unmarshal([]byte(out), &rows)
		if code != 0 || !slices.ContainsFunc(rows, func(r map[string]any) bool {
			return r["id"] == ready.ID && r["state"] == "hold" && r["comment"] == "look at it"
		}) {
			t.Errorf("%v right after the hold: code %d %s\n%s", args, code, errOut, out)
		}
		if len(args) == 1 && strings.Contains(errOut, "reading the buckets") {
			t.Errorf("list read the buckets instead of asking the launcher: %s", errOut)
		}
	}
	for _, verb := range []string{"return", "delete"} {
		_, errOut, code := nodepool(t, cli, verb, ready.ID)
		if code != 1 || !strings.Contains(errOut, "the node is on hold (look at it); refused (--force to "+verb+" it anyway)") {
			t.Errorf("%s of a held node: code %d %q", verb, code, errOut)
		}
	}
	if _, errOut, code := nodepool(t, cli, "delete", "--force", ready.ID); code != 0 {
		t.Errorf("delete --force of a held node: %s", errOut)
	}
	rec.until(10*time.Second, "the held node deleted", func() bool { _, ok := rec.nodes.Get(ready.ID); return !ok })

	// request-delete.
	if _, err := rec.client.Submit(ctx, events.RequestMessage{ID: "bad-1", Labels: []string{"nope"}}); err != nil {
		t.Fatal(err)
	}
	rec.until(10*time.Second, "bad-1 failed", func() bool { e, ok := rec.requests.Get("bad-1"); return ok && e.Value.Done() })
	out, errOut, code = nodepool(t, cli, "request-delete", "bad-1", "nosuch")
	if code != 1 || !strings.Contains(out, "bad-1 deleted") || !strings.Contains(errOut, `no request "nosuch"`) {
		t.Errorf("request-delete: code %d %q %q", code, out, errOut)
	}
	rec.until(10*time.Second, "bad-1 gone", func() bool { _, ok := rec.requests.Get("bad-1"); return !ok })

	// info and erase of a provider no launcher serves any more.
	now := time.Now().UTC()
	old := kv.Node{ID: "old-node-1", State: kv.NodeInUse, Labels: []string{"small"}, Provider: "old-cloud", Pool: "main",
		ExternalID: "i-old", Holder: "someone", Created: now, StateTime: now}
	if _, err := rec.client.Buckets().Nodes.Create(ctx, old.ID, &old); err != nil {
		t.Fatal(err)
	}
	images := rec.client.Images()
	oldUpload := kv.ImageUpload{Image: "debian", BuildID: "0000000002", Provider: "old-cloud", ID: "0000000003", State: kv.ImageReady,
		ExternalID: "img-old", StateTime: now, Created: now}
	if _, err := images.Uploads.Create(ctx, oldUpload.Key(), &oldUpload); err != nil {
		t.Fatal(err)
	}
	// Its remembered section names a cloud that clouds.yaml no longer has:
	// the launchers cannot drain it, its records stay for erase.
	providers, err := rec.client.Providers(ctx)
	if err != nil || providers == nil {
		t.Fatalf("the providers bucket: %v", err)
	}
	if _, err := providers.Create(ctx, kv.ProviderKey("old-cloud"), &kv.ProviderRecord{Name: "old-cloud", Driver: "openstack",
		Section: []byte(`{"Name": "old-cloud", "Driver": "openstack", "Cloud": "no-such-cloud"}`), Recorded: now, Launcher: "gone-launcher"}); err != nil {
		t.Fatal(err)
	}
	out, _, code = nodepool(t, cli, "info", "old-cloud")
	if code != 0 || !strings.Contains(out, "| old-node-1 ") || !strings.Contains(out, "| i-old ") || !strings.Contains(out, "| debian ") ||
		!strings.Contains(out, "| 0000000003 ") || !strings.Contains(out, "Not in "+cfg) {
		t.Errorf("info old-cloud: code %d\n%s", code, out)
	}
	out, _, _ = nodepool(t, cli, "info", "--json", "old-cloud")
	var info struct {
		Uploads []map[string]any `json:"uploads"`
		Nodes   []map[string]any `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Uploads) != 1 || len(info.Nodes) != 1 || info.Nodes[0]["id"] != "old-node-1" {
		t.Errorf("info --json: %v\n%s", err, out)
	}
	_, errOut, code = nodepool(t, cli, "erase", "cloud1")
	if code == 0 || !strings.Contains(errOut, "provider cloud1 is served by the live launchers ops-launcher") {
		t.Errorf("erase of a served provider: code %d %q", code, errOut)
	}
	_, errOut, code = nodepool(t, cli, "erase", "old-cloud") // no answer on stdin
	if code == 0 || !strings.Contains(errOut, "not erased") {
		t.Errorf("erase without an answer: code %d %q", code, errOut)
	}
	out, errOut, code = nodepool(t, cli, "erase", "--force", "old-cloud")
	if code != 0 || !strings.Contains(out, "erased 1 node records and 1 upload records of provider old-cloud, and its remembered configuration") {
		t.Errorf("erase --force: code %d %q %q", code, out, errOut)
	}
	out, _, _ = nodepool(t, cli, "info", "old-cloud")
	if strings.Contains(out, "old-node-1") || strings.Contains(out, "img-old") {
		t.Errorf("info after erase:\n%s", out)
	}

	// export-image-data, lose the records, import-image-data.
	build := kv.ImageBuild{Image: "debian", ID: "0000000002", State: kv.ImageReady, StateTime: now, Builder: "b1", Formats: []string{"qcow2"}, Created: now}
	upload := kv.ImageUpload{Image: "debian", BuildID: "0000000002", Provider: "cloud1", ID: "0000000004", State: kv.ImageReady,
		ExternalID: "img-4", StateTime: now, Created: now}
	di := kv.DiskImage{Name: "debian", BuildSeq: 2, UploadSeq: 4}
	if _, err := images.Images.Create(ctx, "debian", &di); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Builds.Create(ctx, build.Key(), &build); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Uploads.Create(ctx, upload.Key(), &upload); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "images.json")
	out, errOut, code = nodepool(t, cli, "export-image-data", file)
	if code != 0 || !strings.Contains(out, "exported 1 images, 1 builds and 1 uploads") {
		t.Fatalf("export-image-data: code %d %q %q", code, out, errOut)
	}
	for _, key := range []string{"debian", build.Key(), upload.Key()} {
		if err := rec.client.Buckets().Images.Purge(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code = nodepool(t, cli, "import-image-data", file)
	if code != 0 || !strings.Contains(out, "3 records created") {
		t.Fatalf("import-image-data: code %d %q %q", code, out, errOut)
	}
	got, err := images.Uploads.Get(ctx, upload.Key())
	if err != nil || got.Value.ExternalID != "img-4" {
		t.Errorf("the upload after import: %v %+v", err, got.Value)
	}
	if e, err := images.Images.Get(ctx, "debian"); err != nil || e.Value.BuildSeq != 2 || e.Value.UploadSeq != 4 {
		t.Errorf("the id counters after import: %v %+v", err, e.Value)
	}
	out, _, code = nodepool(t, cli, "import-image-data", file)
	if code != 0 || !strings.Contains(out, "0 records created, 3 already there") {
		t.Errorf("import-image-data again: code %d %q", code, out)
	}
	if _, err := images.Uploads.Modify(ctx, upload.Key(), func(u *kv.ImageUpload) error { u.ExternalID = "img-other"; return nil }); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = nodepool(t, cli, "import-image-data", file)
	if code != 1 || !strings.Contains(errOut, upload.Key()+": exists with other content; kept as it is") {
		t.Errorf("import over a changed record: code %d %q", code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"format": "nodepool-image-data", "version": 1, "builds": [{"image": "a b", "id": "1", "state": "ready"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = nodepool(t, cli, "import-image-data", bad)
	if code == 0 || !strings.Contains(errOut, `builds[0]: image "a b": expected 1 to 64 of A-Z a-z 0-9 _ - and inner dots`) {
		t.Errorf("import of a bad file: code %d %q", code, errOut)
	}
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("nodepool run exited with %v", err)
	}
}
