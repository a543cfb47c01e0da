package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// upstreamFixture is what loading one of Nodepool's own test fixtures
// (testdata/upstream, see its README) must give.
type upstreamFixture struct {
	// refused: the file must not load, and the errors contain each of
	// errors; otherwise it must load, and its warnings contain each of
	// warnings.
	refused  bool
	errors   []string
	warnings []string
	// noWarning: no warning contains any of these.
	noWarning []string
	// wants are loaded values, as in testdata/configs (# want lines).
	wants [][2]string
	// secure is the secure file loaded with it.
	secure string
	// unavailable: the file loads, and its providers of these drivers are
	// ones this build reads but cannot run.
	unavailable []string
	// onlyDriverErrors: every error is about a driver this build does not
	// have (the rest of the file is valid).
	onlyDriverErrors bool
	// pre3: the file is told first that it looks written before Nodepool
	// 3.0 (and only such files are).
	pre3 bool
}

// upstreamFixtures are every file of testdata/upstream, each listed: the
// valid ones load (warnings allowed), those Nodepool's validator refuses
// are refused here too, and files written for Nodepool before 3.0 are
// refused with what to do. upstreamValid and upstreamRefused count them.
var upstreamFixtures = map[string]upstreamFixture{
	// Nodepool's config-validate fixtures. good.yaml is valid but for its
	// openshift provider, a driver not carried over.
	"config_validate/good.yaml": {refused: true, onlyDriverErrors: true, errors: []string{
		"providers[4].driver: driver openshift was not carried over from Nodepool"}},
	"config_validate/duplicate_diskimage_name.yaml": {refused: true, errors: []string{
		`diskimages[1].name: diskimage "trusty" is defined twice (also diskimages[0])`}},
	"config_validate/no_diskimage_name.yaml": {refused: true, errors: []string{
		`diskimages[0]: missing required key "name"`}},
	"config_validate/missing_parent_diskimage_provider.yaml": {refused: true, errors: []string{
		`providers[0].diskimages[0]: diskimage "focal" is not defined; expected one of the names under the top-level diskimages (none defined)`}},
	"config_validate/schema_error.yaml": {refused: true, errors: []string{
		"nothandled: unknown key; expected one of:"}},
	"config_validate/static_error.yaml": {refused: true, errors: []string{
		"providers[0].cloud: the static driver has no such key (it is a key of the fake, openstack driver)"}},
	"config_validate/yaml_error.yaml": {refused: true, errors: []string{
		"yaml_error.yaml:57: not valid YAML"}},
	"config_validate/aws-fleet-exclusive-error.yaml": {refused: true, errors: []string{
		`providers[0].pools[0].labels[0].fleet: missing required key "allocation-strategy"`}},
	"config_validate/aws-fleet-good.yaml": {warnings: []string{
		`fleet.instance-requirements: EC2's attribute-based instance selection (a key of some Nodepool builds) is not sent by this launcher, so every launch of label "ubuntu1404-on-demand" fails`}},
	// include.yaml is a Nodepool 2 file with a !include of the next one,
	// a fragment that is no configuration on its own.
	"config_validate/include.yaml": {refused: true, pre3: true, errors: []string{
		"zmq-publishers: zmq-publishers was removed in Nodepool 3.0.0 (2018)",
		"labels[0].ready-script: ready-script was removed in Nodepool 3.0.0 (2018)",
		"providers[0].service-type: service-type was removed in Nodepool 3.0.0 (2018)",
		"providers[8].api-timeout: api-timeout was removed in Nodepool 3.0.0 (2018)"}},
	"config_validate/zmq-publishers.yaml": {refused: true, errors: []string{
		"zmq-publishers.yaml:1: expected a mapping of sections (labels, providers, diskimages...), got a list"}},

	// Fixtures Nodepool's tests load without its validator, which refuses
	// them: refused here, with the nearest key or the release that
	// removed it.
	"broken_provider_config.yaml": {refused: true, errors: []string{
		`azookeeper-servers: unknown key; did you mean "zookeeper-servers"?`}},
	"node_two_image_remove.yaml": {refused: true, errors: []string{
		"cron: cron was removed in Nodepool 3.0.0 (2018): cleanup and checks run continuously"}},
	"aws-bad-config-images.yaml": {refused: true, errors: []string{
		`zookeeper-servers[1]: missing required key "host"`}},
	"aws.yaml": {refused: true, errors: []string{
		`zookeeper-servers[0].host: expected a host name or address, got ""`,
		"providers[0].cloud-images[4]: give image-id or image-filters, not both",
		"providers[0].pools[1].labels[6].iam-instance-profile: expected name or arn (one of them)"}},
	// Nodepool 2 files.
	"capacity.yaml": {refused: true, pre3: true, errors: []string{
		"dburi: dburi was removed in Nodepool 3.0.0 (2018)",
		"labels[0].providers: providers was removed in Nodepool 3.0.0 (2018): a label is provided by the pools that list it",
		"providers[0].images: images was removed in Nodepool 3.0.0 (2018): split each entry",
		"providers[0].max-servers: max-servers is a key of each pool (providers[].pools[]) for the openstack driver, not of the provider: move it there",
		"targets: targets was removed in Nodepool 3.0.0 (2018)"}},
	"integration.yaml": {refused: true, pre3: true, errors: []string{
		"gearman-servers: gearman-servers was removed in Nodepool 3.0.0 (2018)",
		"providers[0].keypair: keypair was removed in Nodepool 3.0.0 (2018): set key-name on each pool label",
		"providers[0].networks: networks is a key of each pool (providers[].pools[]) for the openstack driver, not of the provider: move it there"}},
	"integration_osc.yaml": {refused: true, pre3: true, errors: []string{
		"providers[0].pool: pool was removed in Nodepool 3.0.0 (2018)"}},
	"leaked_node_2.yaml": {refused: true, pre3: true, errors: []string{
		"providers[0].images: images was removed in Nodepool 3.0.0 (2018)", "script-dir: script-dir was removed in Nodepool 3.0.0 (2018)"}},
	"leaked_node_launcher_id.yaml": {refused: true, pre3: true, errors: []string{
		"providers[0].auth-url: auth-url was removed in Nodepool 3.0.0 (2018): the endpoint comes from clouds.yaml"}},
	"node_dib.yaml": {refused: true, pre3: true, errors: []string{
		"dburi: dburi was removed in Nodepool 3.0.0 (2018)"}},
	"node_dib_provider_disabled.yaml": {refused: true, pre3: true},
	"node_dib_upload_ordering.yaml":   {refused: true, pre3: true},
	"node_net_name.yaml":              {refused: true, pre3: true},

	// AWS: Nodepool's spellings and values load; what EC2 refuses is a
	// warning that says so.
	"aws/aws.yaml": {
		warnings: []string{
			`providers[0].pools[0].labels[7].tags.has-tags: the boolean true is sent as the string "True"`,
			`providers[0].cloud-images[1].image-id: "bad-ami-name" is not an AMI id (such as ami-0123456789abcdef0): EC2 refuses it`},
		wants: [][2]string{
			{"providers[0].pools[0].labels[7].tags.has-tags", "True"},
			{"providers[0].pools[0].labels[7].dynamic-tags.tenant-name", "{request.tenant_name}"},
			{"providers[0].cloud-images[3].image-filters[0].name", "name"},
			{"providers[0].cloud-images[3].image-filters[0].values", "[ubuntu*]"},
		}},
	"aws/aws-min-ready.yaml":          {warnings: []string{`tags.has-tags: the boolean true is sent as the string "True"`}},
	"aws/aws-fleet.yaml":              {noWarning: []string{"throughput"}},
	"aws/aws-fleet-old-template.yaml": {},
	"aws/aws-invalid.yaml":            {},
	"aws/aws-limits.yaml":             {wants: [][2]string{{"tenant-resource-limits[0].L-43DA4232", "224"}}},
	"aws/aws-instance-capacity.yaml": {
		warnings: []string{`providers[0].pools[0].labels[0].instance-type: a list here is read as its first entry, "t3.large"`},
		wants:    [][2]string{{"providers[0].pools[0].labels[0].instance-type", "t3.large"}}},
	"aws/aws-instance-types.yaml": {
		warnings: []string{`instance-type: a list here is read as its first entry, "t3.large": some Nodepool builds take a list`},
		wants:    [][2]string{{"providers[0].pools[0].labels[0].instance-type", "t3.large"}}},
	// The label's throughput goes to the root volume of its diskimage,
	// which is gp3.
	"aws/diskimage.yaml": {noWarning: []string{"throughput"}, wants: [][2]string{{"providers[0].pools[0].labels[0].throughput", "200"}}},

	// Kubernetes.
	"kubernetes.yaml": {wants: [][2]string{
		{"providers[0].pools[0].labels[1].image-pull", "IfNotPresent"},
		{"providers[0].pools[0].labels[1].python-path", "auto"}}},
	"kubernetes-default-resources.yaml": {
		warnings: []string{`pod label "pod-default" has no image (nor spec): Kubernetes refuses a container without an image`},
		wants: [][2]string{
			{"providers[0].pools[0].labels[0].cpu", "2"}, {"providers[0].pools[0].labels[0].memory", "1024"}, {"providers[0].pools[0].labels[0].storage", "10"},
			{"providers[0].pools[0].labels[1].cpu", "4"}, {"providers[0].pools[0].labels[2].memory", "2048"}, {"providers[0].pools[0].labels[3].storage", "20"}}},
	"functional/kubernetes/basic.yaml": {},

	// OpenStack (Nodepool's fake driver is its openstack driver with a
	// simulated cloud: its fixtures are openstack files).
	"integration_noocc.yaml": {warnings: []string{"providers[0]: no cloud given: Nodepool's openstacksdk would then use OS_CLOUD"}},
	"node.yaml": {wants: [][2]string{
		{"providers[0].rate", "10000"}, {"providers[0].pools[0].node-attributes.key1", "value1"},
		{"providers[0].diskimages[0].meta.key2", "value"}}},
	"secure_file_config.yaml": {secure: "secure_file_secure.yaml", wants: [][2]string{
		{"zookeeper-servers[0].host", "localhost"}, {"diskimages[0].env-vars.REG_PASSWORD", "secret"}}},
	"node_quota.yaml": {wants: [][2]string{{"providers[0].driver", "openstack"}}},
	// Keys of some Nodepool builds that its documentation does not list:
	// loaded, each with a warning that says what is done with it.
	"ignore_quota_true.yaml": {warnings: []string{"pools[0].ignore-quota: ignore-quota: the name Nodepool 3.x first gave ignore-provider-quota"},
		wants: [][2]string{{"providers[0].pools[0].ignore-provider-quota", "true"}}},
	"ignore_quota_false.yaml":            {warnings: []string{"ignore-quota: the name Nodepool 3.x first gave"}, wants: [][2]string{{"providers[0].pools[0].ignore-provider-quota", "false"}}},
	"decline_from_quota_true.yaml":       {warnings: []string{"pools[0].decline-from-quota: decline-from-quota: a pool key of some Nodepool builds"}},
	"decline_from_quota_false.yaml":      {warnings: []string{"decline-from-quota: a pool key of some Nodepool builds"}},
	"launcher_two_provider.yaml":         {warnings: []string{"zookeeper-auth: zookeeper-auth: ZooKeeper authentication (SASL)"}},
	"leaked_node.yaml":                   {warnings: []string{"zookeeper-auth: ZooKeeper authentication (SASL)"}},
	"pause_declined_2.yaml":              {warnings: []string{"zookeeper-auth: ZooKeeper authentication (SASL)"}},
	"node-executor-zone.yaml":            {warnings: []string{"pools[0].executor-zone: executor-zone: a pool key of some Nodepool builds"}},
	"node_floating_ip_pool.yaml":         {warnings: []string{"pools[0].floating-ip-pool: floating-ip-pool: a pool key of some Nodepool builds"}},
	"node_admin_webapp.yaml":             {warnings: []string{"webapp.admin_port: admin_port: Nodepool's admin web port is not served here"}},
	"node_builder_id.yaml":               {warnings: []string{"builder-id-file: builder-id-file: the file a Nodepool 3.x builder kept its id in"}},
	"node_diskimage_globals.yaml":        {warnings: []string{"diskimages-globals: diskimages-globals: settings that some Nodepool builds merged into every diskimage"}},
	"node_diskimage_limit_builders.yaml": {warnings: []string{"diskimages[0].builders: builders: a diskimage key of some Nodepool builds"}},

	// Static: ssh-port, Nodepool's deprecated name of connection-port, and
	// shell_type, an old spelling of shell-type.
	"static.yaml": {warnings: []string{"providers[0].pools[0].nodes[0].ssh-port: ssh-port is Nodepool's old name of connection-port"},
		wants: [][2]string{{"providers[0].pools[0].nodes[0].connection-port", "22022"}, {"providers[0].pools[0].nodes[1].connection-port", "22"}}},
	"static-basic.yaml": {warnings: []string{`expected an SSH public key such as "ssh-ed25519 AAAA...", got "ssh-rsa FAKEKEY"`}},
	"static-shell-type.yaml": {warnings: []string{"nodes[0].shell_type: shell_type: read as shell-type"},
		wants: [][2]string{{"providers[0].pools[0].nodes[0].shell-type", "cmd"}}},

	// Valid fixtures that load as they are.
	"disabled_provider.yaml":              {},
	"diskimage_build_timeout.yaml":        {},
	"ignore_provider_quota_false.yaml":    {},
	"ignore_provider_quota_true.yaml":     {},
	"info_cmd_two_provider.yaml":          {},
	"info_cmd_two_provider_remove.yaml":   {},
	"integration_occ.yaml":                {},
	"launcher_reg1.yaml":                  {},
	"launcher_reg2.yaml":                  {},
	"launcher_reload2.yaml":               {},
	"launcher_two_provider_max_1.yaml":    {},
	"launcher_two_provider_remove.yaml":   {},
	"leaked_node_nodepool_id.yaml":        {},
	"metastatic.yaml":                     {},
	"multiple_pools.yaml":                 {},
	"multiproviders.yaml":                 {},
	"node-host-key-checking.yaml":         {},
	"node-network_cli.yaml":               {},
	"node_auto_floating_ip.yaml":          {},
	"node_az.yaml":                        {},
	"node_az_change.yaml":                 {},
	"node_boot_from_volume.yaml":          {},
	"node_cleanup_port.yaml":              {},
	"node_cmd.yaml":                       {},
	"node_delete_error.yaml":              {},
	"node_disabled_label.yaml":            {},
	"node_diskimage_cleanup_formats.yaml": {},
	"node_diskimage_fail.yaml":            {},
	"node_diskimage_formats.yaml":         {},
	"node_diskimage_only.yaml":            {},
	"node_diskimage_parents.yaml":         {},
	"node_diskimage_pause.yaml":           {},
	"node_flavor_name.yaml":               {},
	"node_image_upload_pause.yaml":        {},
	"node_ipv6.yaml":                      {},
	"node_label_provider.yaml":            {},
	"node_launch_retry.yaml":              {},
	"node_lost_requests.yaml":             {},
	"node_many_labels.yaml":               {},
	"node_max_hold_age.yaml":              {},
	"node_max_hold_age_2.yaml":            {},
	"node_max_hold_age_no_default.yaml":   {},
	"node_max_ready_age.yaml":             {},
	"node_min_ready_capacity.yaml":        {},
	"node_no_min_ready.yaml":              {},
	"node_quota_cloud.yaml":               {},
	"node_quota_pool_cores.yaml":          {},
	"node_quota_pool_instances.yaml":      {},
	"node_quota_pool_ram.yaml":            {},
	"node_second_provider.yaml":           {},
	"node_security_group.yaml":            {},
	"node_two_image.yaml":                 {},
	"node_two_provider.yaml":              {},
	"node_two_provider_remove.yaml":       {},
	"node_unmanaged_image.yaml":           {},
	"node_upload_fail.yaml":               {},
	"node_vhd.yaml":                       {},
	"node_vhd_and_qcow2.yaml":             {},
	"pause_declined_1.yaml":               {},
	"static-2-nodes.yaml":                 {},
	"static-multilabel.yaml":              {},
	"static-parallel-increase.yaml":       {},
	"static-unresolvable.yaml":            {},
	"static-update.yaml":                  {},
	"unmanaged_image_provider_id.yaml":    {},
	"unmanaged_image_provider_name.yaml":  {},
	"webapp.yaml":                         {},
	"wedge_test.yaml":                     {},
}

// The fixtures' count: every file of testdata/upstream but the secure
// file, valid and refused.
const (
	upstreamValid   = 101
	upstreamRefused = 23
)

// upstreamValues are the values of the Python format fields of the
// fixtures (Nodepool's tests fill them with str.format).
var upstreamValues = map[string]string{
	"images_dir": "/var/lib/nodepool/images", "build_log_dir": "/var/log/nodepool/builds",
	"zookeeper_host": "localhost", "zookeeper_port": "2281", "zookeeper_chroot": "/nodepool",
	"zookeeper_ca": "/etc/nodepool/zk-ca.pem", "zookeeper_cert": "/etc/nodepool/zk-client.pem", "zookeeper_key": "/etc/nodepool/zk-client.key",
	"subnet_id": "subnet-0123456789abcdef0", "security_group_id": "sg-0123456789abcdef0",
	"instance_profile_arn": "arn:aws:iam::123456789012:instance-profile/not-a-real-profile",
	"gearman_port":         "4730", "dburi": "mysql://nodepool@localhost/nodepool",
}

var (
	formatFieldRE = regexp.MustCompile(`\{\{|\}\}|\{([A-Za-z_]*)\}`)
	fakeDriverRE  = regexp.MustCompile(`(?m)^(\s*)driver: fake\s*$`)
)

// upstreamText prepares a fixture as Nodepool's tests do (str.format with
// the values above), and makes its fake providers openstack ones.
func upstreamText(t *testing.T, data []byte) []byte {
	t.Helper()
	text := formatFieldRE.ReplaceAllStringFunc(string(data), func(m string) string {
		switch m {
		case "{{":
			return "{"
		case "}}":
			return "}"
		}
		v, ok := upstreamValues[m[1:len(m)-1]]
		if !ok {
			t.Fatalf("no value for the format field %s", m)
		}
		return v
	})
	return []byte(fakeDriverRE.ReplaceAllString(text, "${1}driver: openstack"))
}

// TestUpstreamFixtures loads every fixture of Nodepool's own tests kept in
// testdata/upstream: the valid ones load (warnings allowed), and the ones
// Nodepool's validator refuses are refused here too, each with what to do.
func TestUpstreamFixtures(t *testing.T) {
	root := filepath.Join("testdata", "upstream")
	var files []string
	secure := map[string]bool{}
	for _, f := range upstreamFixtures {
		if f.secure != "" {
			secure[f.secure] = true
		}
	}
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if !secure[filepath.ToSlash(rel)] {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for name := range upstreamFixtures {
		if !slices.Contains(files, name) {
			t.Errorf("%s is in the table but not in %s", name, root)
		}
	}
	loaded, valid, refused, refusedOK := 0, 0, 0, 0
	for _, name := range files {
		want, listed := upstreamFixtures[name]
		if !listed {
			t.Errorf("%s is not in upstreamFixtures: list it as valid or refused", name)
			continue
		}
		if want.refused {
			refused++
		} else {
			valid++
		}
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, name))
			if err != nil {
				t.Fatal(err)
			}
			in := Input{File: name, Data: upstreamText(t, data), Env: []string{}}
			if want.secure != "" {
				sdata, err := os.ReadFile(filepath.Join(root, want.secure))
				if err != nil {
					t.Fatal(err)
				}
				in.SecureFile, in.SecureData = want.secure, upstreamText(t, sdata)
			}
			cfg, err := Decode(in)
			if want.refused {
				if checkRefused(t, name, err, want) {
					refusedOK++
				}
				return
			}
			if err != nil {
				t.Fatalf("does not load:\n%v", err)
			}
			loaded++
			warns := cfg.Warnings.Error()
			for _, w := range want.warnings {
				if !strings.Contains(warns, w) {
					t.Errorf("warnings lack %q:\n%s", w, warns)
				}
			}
			for _, w := range want.noWarning {
				for _, got := range cfg.Warnings {
					if strings.Contains(got.Error(), w) {
						t.Errorf("unexpected warning: %v", got)
					}
				}
			}
			for _, w := range want.wants {
				got, err := valueAt(reflect.ValueOf(cfg).Elem(), w[0])
				if err != nil || got != w[1] {
					t.Errorf("%s = %q (%v), want %q", w[0], got, err, w[1])
				}
			}
			var unavailable []string
			for _, p := range cfg.Unavailable() {
				unavailable = append(unavailable, p.Driver)
			}
			if !slices.Equal(slices.Compact(unavailable), want.unavailable) {
				t.Errorf("providers this build cannot run: %v, want %v", unavailable, want.unavailable)
			}
			if (cfg.Runnable() == nil) != (len(want.unavailable) == 0) {
				t.Errorf("Runnable() = %v", cfg.Runnable())
			}
		})
	}
	t.Logf("%d of %d valid fixtures load; %d of %d refused fixtures are refused with what to do", loaded, valid, refusedOK, refused)
	if valid != upstreamValid || refused != upstreamRefused {
		t.Errorf("%d valid and %d refused fixtures listed, want %d and %d", valid, refused, upstreamValid, upstreamRefused)
	}
	if loaded != valid || refusedOK != refused {
		t.Errorf("%d of %d valid fixtures load, %d of %d refused fixtures are refused as expected", loaded, valid, refusedOK, refused)
	}
}

// checkRefused checks a fixture that must be refused; it reports whether
// it was, as expected.
func checkRefused(t *testing.T, name string, err error, want upstreamFixture) bool {
	t.Helper()
	before := t.Failed()
	if err == nil {
		t.Error("loaded; Nodepool's validator refuses it")
		return false
	}
	var es Errors
	if !IsErrors(err) {
		t.Errorf("error is %T, not config.Errors: %v", err, err)
		return false
	}
	es = err.(Errors)
	text := err.Error()
	for _, w := range want.errors {
		if !strings.Contains(text, w) {
			t.Errorf("errors lack %q:\n%s", w, text)
		}
	}
	isPre3 := strings.Contains(es[0].Msg, "looks written for Nodepool before 3.0")
	if isPre3 != want.pre3 {
		t.Errorf("first error %q; told it is a file written before Nodepool 3.0: %v, want %v", es[0], isPre3, want.pre3)
	}
	if want.pre3 {
		if es[0].Line != 0 || !strings.Contains(es[0].Msg, OldFileAnchor) {
			t.Errorf("the first error should be the one line about old files, with the page to read: %v", es[0])
		}
		if strings.Count(text, "looks written for Nodepool before 3.0") != 1 {
			t.Errorf("told more than once:\n%s", text)
		}
	}
	if want.onlyDriverErrors {
		for _, e := range es {
			if !strings.Contains(e.Msg, "was not carried over from Nodepool") {
				t.Errorf("an error besides the drivers': %v", e)
			}
		}
	}
	return !t.Failed() || before
}
