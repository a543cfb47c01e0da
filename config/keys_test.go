package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What an unknown key is told, from the release that removed it to the
// nearest known key.
func TestUnknownKeyMessages(t *testing.T) {
	const osProvider = "labels: [{name: a}]\nproviders:\n  - name: p\n    driver: openstack\n    cloud: c\n    cloud-images: [{name: ci}]\n%s    pools:\n      - name: main\n        labels: [{name: a, cloud-image: ci, flavor-name: f}]\n"
	provider := func(extra string) string { return strings.Replace(osProvider, "%s", extra, 1) }
	for _, tc := range []struct {
		name, yaml string
		want       []string
		notWant    string
	}{
		{"cron", "cron:\n  cleanup: '*/1 * * * *'\nlabels: []\n", []string{"nodepool.yaml:1: cron: cron was removed in Nodepool 3.0.0 (2018): cleanup and checks run continuously"}, "looks written for Nodepool before 3.0"},
		{"dburi", "dburi: mysql://x\nlabels: []\n", []string{"dburi: dburi was removed in Nodepool 3.0.0 (2018): nodes are recorded in ZooKeeper since Nodepool 3, in NATS JetStream here"}, ""},
		{"script-dir", "script-dir: /etc/nodepool/scripts\nlabels: []\n", []string{"script-dir: script-dir was removed in Nodepool 3.0.0 (2018): setup scripts are gone"}, ""},
		{"api-timeout", provider("    api-timeout: 60\n"), []string{"providers[0].api-timeout: api-timeout was removed in Nodepool 3.0.0 (2018): API calls use openstacksdk's (here the driver's) own timeouts"}, ""},
		{"ipv6-preferred", provider("    ipv6-preferred: true\n"), []string{"providers[0].ipv6-preferred: ipv6-preferred was removed in Nodepool 3.0.0 (2018)"}, ""},
		{"image-type", provider("    image-type: qcow2\n"), []string{"providers[0].image-type: image-type was removed in Nodepool 3.0.0 (2018): the upload format is the cloud's image_format in clouds.yaml"}, ""},
		{"hostname-format", provider("    hostname-format: '{label.name}'\n"), []string{"hostname-format was removed in Nodepool after 3.x"}, ""},
		{"dib_cmd", "labels: []\ndiskimages:\n  - name: d\n    dib_cmd: dib\n", []string{"diskimages[0].dib_cmd: dib_cmd was removed in Nodepool 3.x, when it was renamed dib-cmd"}, ""},
		// A removed openstack key on another driver is only unknown.
		{"images on aws", "labels: []\nproviders:\n  - name: p\n    driver: aws\n    region-name: r\n    images: []\n    pools: []\n", []string{"providers[0].images: unknown key"}, "was removed"},
		// A key of another level says where it belongs.
		{"max-servers on an openstack provider", provider("    max-servers: 10\n"), []string{"providers[0].max-servers: max-servers is a key of each pool (providers[].pools[]) for the openstack driver, not of the provider: move it there"}, "aws driver"},
		{"min-ready on a pool label", strings.Replace(provider(""), "flavor-name: f}", "flavor-name: f, min-ready: 2}", 1), []string{"providers[0].pools[0].labels[0].min-ready: min-ready is a key of each top-level label (labels[]), not of a pool label: move it there"}, ""},
		{"flavor-name on a top-level label", "labels: [{name: a, flavor-name: big}]\n", []string{"labels[0].flavor-name: flavor-name is a key of each label of a pool (providers[].pools[].labels[])"}, ""},
		{"zookeeper-servers on a provider", provider("    zookeeper-servers: []\n"), []string{"providers[0].zookeeper-servers: zookeeper-servers is a key of the top level of the file, not of the provider: move it there"}, ""},
		// A key of another driver says whose it is.
		{"boot-delay on static", "labels: []\nproviders:\n  - name: s\n    driver: static\n    boot-delay: 1\n    pools: []\n", []string{"providers[0].boot-delay: the static driver has no such key (it is a key of the fake driver)"}, ""},
		// Else the nearest known key.
		{"misspelt", "labels: [{name: a, min-redy: 1}]\n", []string{`labels[0].min-redy: unknown key; did you mean "min-ready"? (expected one of: max-ready-age, min-ready, name)`}, ""},
		{"underscore", "labels: [{name: a, max_ready_age: 1}]\n", []string{`labels[0].max_ready_age: unknown key; did you mean "max-ready-age"?`}, ""},
		{"far from any", "labels: [{name: a, colour: blue}]\n", []string{"labels[0].colour: unknown key; expected one of: max-ready-age, min-ready, name"}, "did you mean"},
		{"misspelt driver", "labels: []\nproviders:\n  - name: p\n    driver: kubernets\n    pools: []\n", []string{`providers[0].driver: unknown driver "kubernets"; did you mean "kubernetes"?`}, ""},
		// An old name given with the new one: the new one wins, said so.
		{"ignore-quota and its new name", strings.Replace(provider(""), "      - name: main\n", "      - name: main\n        ignore-quota: true\n        ignore-provider-quota: false\n", 1), []string{"ignore-provider-quota is given too and wins, so ignore-quota is ignored"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode(Input{File: "nodepool.yaml", Data: []byte(tc.yaml), Env: []string{}})
			var text string
			switch {
			case err != nil:
				text = err.Error()
			case cfg != nil:
				text = cfg.Warnings.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("lacks %q:\n%s", w, text)
				}
			}
			if tc.notWant != "" && strings.Contains(text, tc.notWant) {
				t.Errorf("says %q:\n%s", tc.notWant, text)
			}
		})
	}
}

// A file that looks written before Nodepool 3.0 is told so once, first,
// with the page to read; one key removed in 3.0 alone is not enough.
func TestPre3File(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		pre3       bool
		signs      string
	}{
		{"targets", "targets:\n  - name: jenkins\nlabels: []\n", true, "it has targets"},
		{"label with image and providers", "labels:\n  - name: a\n    image: img\n    providers: [{name: p}]\n", true, "labels with image and labels with providers"},
		{"provider with images", "labels: []\nproviders:\n  - name: p\n    images: [{name: i}]\n", true, "providers with images"},
		{"two weak signs", "cron: {}\nlabels: []\nproviders:\n  - name: p\n    cloud: c\n    api-timeout: 60\n    pools: []\n", true, "cron and api-timeout"},
		{"one weak sign", "cron: {}\nlabels: []\n", false, ""},
		{"not for aws images", "labels: []\nproviders:\n  - name: p\n    driver: aws\n    region-name: r\n    images: []\n    pools: []\n", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(Input{File: "nodepool.yaml", Data: []byte(tc.yaml), Env: []string{}})
			es, ok := err.(Errors)
			if !ok || len(es) == 0 {
				t.Fatalf("loaded or not config.Errors: %v", err)
			}
			text := err.Error()
			got := strings.Count(text, "looks written for Nodepool before 3.0")
			if !tc.pre3 {
				if got != 0 {
					t.Fatalf("told it is a pre-3.0 file:\n%s", text)
				}
				return
			}
			if got != 1 || es[0].Line != 0 || !strings.Contains(es[0].Msg, OldFileAnchor) || !strings.Contains(es[0].Msg, tc.signs) {
				t.Fatalf("first error %q, want the one line about pre-3.0 files naming %q and %s (told %d times)", es[0], tc.signs, OldFileAnchor, got)
			}
		})
	}
}

func TestNearest(t *testing.T) {
	names := []string{"max-ready-age", "min-ready", "name", "providers", "labels"}
	for _, tc := range []struct{ in, want string }{
		{"min-redy", "min-ready"},
		{"MIN_READY", "min-ready"},
		{"provider", "providers"},
		{"lables", "labels"},
		{"nmae", "name"},
		{"x", ""},
		{"colour", ""},
		{"maximum-ready-age", ""},
	} {
		if got := nearest(tc.in, names); got != tc.want {
			t.Errorf("nearest(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The page a pre-3.0 file is sent to has the section the message names.
func TestOldFileAnchorExists(t *testing.T) {
	page, anchor, _ := strings.Cut(OldFileAnchor, "#")
	data, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		title, ok := strings.CutPrefix(line, "## ")
		if !ok {
			continue
		}
		slug := strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
				return r
			case r >= 'A' && r <= 'Z':
				return r + 'a' - 'A'
			case r == ' ':
				return '-'
			}
			return -1
		}, title)
		if slug == anchor {
			return
		}
	}
	t.Fatalf("%s has no section whose anchor is #%s", page, anchor)
}
