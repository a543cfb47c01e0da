package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// What an unknown key is told. In order: a key Nodepool removed names the
// release that removed it and what replaces it; a key of another level of
// the file (a pool's key written on its provider) or of another driver
// says where it belongs; another key says which known key is nearest; and
// every message lists the keys expected there.

// level is a kind of mapping in nodepool.yaml.
type level struct {
	// name is how a message calls one such mapping ("the provider").
	name string
	// where is how to reach them ("each pool (providers[].pools[])").
	where string
	// neighbours are the levels whose keys are often written at this one
	// by mistake, nearest first.
	neighbours []reflect.Type
}

var (
	typeConfig            = reflect.TypeFor[Config]()
	typeLabel             = reflect.TypeFor[Label]()
	typeProvider          = reflect.TypeFor[Provider]()
	typePool              = reflect.TypeFor[Pool]()
	typePoolLabel         = reflect.TypeFor[PoolLabel]()
	typeDiskimage         = reflect.TypeFor[Diskimage]()
	typeProviderDiskimage = reflect.TypeFor[ProviderDiskimage]()
	typeWebapp            = reflect.TypeFor[Webapp]()
	typeStaticNode        = reflect.TypeFor[StaticNode]()
)

// levels are the mappings whose keys may belong to one another.
var levels = map[reflect.Type]level{
	typeConfig:            {name: "the top level", where: "the top level of the file", neighbours: []reflect.Type{typeProvider}},
	typeLabel:             {name: "a top-level label", where: "each top-level label (labels[])", neighbours: []reflect.Type{typePoolLabel}},
	typeProvider:          {name: "the provider", where: "each pool (providers[].pools[])", neighbours: []reflect.Type{typePool, typePoolLabel, typeConfig}},
	typePool:              {name: "a pool", where: "each pool (providers[].pools[])", neighbours: []reflect.Type{typePoolLabel, typeProvider}},
	typePoolLabel:         {name: "a pool label", where: "each label of a pool (providers[].pools[].labels[])", neighbours: []reflect.Type{typePool, typeLabel, typeProvider}},
	typeDiskimage:         {name: "a top-level diskimage", where: "each top-level diskimage (diskimages[])", neighbours: []reflect.Type{typeProviderDiskimage}},
	typeProviderDiskimage: {name: "a provider's diskimage", where: "each diskimage of a provider (providers[].diskimages[])", neighbours: []reflect.Type{typeDiskimage}},
}

// levelWhere says where keys of a level are written, for "move it into
// ..." (the provider: the providers list's entries).
func levelWhere(t reflect.Type) string {
	if t == typeProvider {
		return "the provider (providers[])"
	}
	return levels[t].where
}

// removal is what Nodepool did with a key it no longer reads.
type removal struct {
	// in is the Nodepool release that removed the key.
	in string
	// instead says what replaces it, as advice.
	instead string
	// drivers limits the entry to providers of these drivers (nil: any).
	drivers []string
}

// Releases that removed keys.
const (
	nodepool3 = "3.0.0 (2018)"
)

// removedKeys are the keys Nodepool removed, by the level they were
// written at (checked in Nodepool 2's configuration validator and
// documentation, and in Nodepool 3's).
var removedKeys = map[reflect.Type]map[string]removal{
	typeConfig: {
		"targets":         {in: nodepool3, instead: "Zuul requests nodes itself; Jenkins targets are gone: remove the section"},
		"gearman-servers": {in: nodepool3, instead: "Zuul and Nodepool talk through ZooKeeper (zookeeper-servers; here the zookeeper role, see docs/zuul.md): remove the section"},
		"zmq-publishers":  {in: nodepool3, instead: "Jenkins' ZeroMQ events went with Jenkins: remove the section"},
		"dburi":           {in: nodepool3, instead: "nodes are recorded in ZooKeeper since Nodepool 3, in NATS JetStream here: remove the key"},
		"cron":            {in: nodepool3, instead: "cleanup and checks run continuously, and each diskimage's rebuild-age says when it is rebuilt (image-update): remove the section"},
		"script-dir":      {in: nodepool3, instead: "setup scripts are gone: build what a node needs into its image with diskimage-builder elements (elements-dir), and remove the key"},
	},
	typeLabel: {
		"image":        {in: nodepool3, instead: "a label's image is set where a pool provides it: diskimage or cloud-image on providers[].pools[].labels[]"},
		"providers":    {in: nodepool3, instead: "a label is provided by the pools that list it: add it to providers[].pools[].labels[] of each provider that should serve it"},
		"ready-script": {in: nodepool3, instead: "there is no script run on ready nodes: build what it did into the image, or do it in the job"},
		"subnodes":     {in: nodepool3, instead: "a job that needs several nodes asks Zuul for a nodeset of several nodes"},
	},
	typeProvider: {
		"images":            {in: nodepool3, drivers: []string{"openstack"}, instead: "split each entry: a diskimage nodepool builds goes into the provider's diskimages, an image the cloud has into its cloud-images, and min-ram, flavor-name and key-name onto the pool labels that boot it (providers[].pools[].labels[])"},
		"username":          {in: nodepool3, drivers: []string{"openstack"}, instead: "credentials come from clouds.yaml: name the entry with cloud"},
		"password":          {in: nodepool3, drivers: []string{"openstack"}, instead: "credentials come from clouds.yaml: name the entry with cloud"},
		"auth-url":          {in: nodepool3, drivers: []string{"openstack"}, instead: "the endpoint comes from clouds.yaml: name the entry with cloud"},
		"project-id":        {in: nodepool3, drivers: []string{"openstack"}, instead: "the project comes from clouds.yaml: name the entry with cloud"},
		"project-name":      {in: nodepool3, drivers: []string{"openstack"}, instead: "the project comes from clouds.yaml: name the entry with cloud"},
		"service-type":      {in: nodepool3, drivers: []string{"openstack"}, instead: "the services come from clouds.yaml and the cloud's catalog: remove the key"},
		"service-name":      {in: nodepool3, drivers: []string{"openstack"}, instead: "the services come from clouds.yaml and the cloud's catalog: remove the key"},
		"keypair":           {in: nodepool3, drivers: []string{"openstack"}, instead: "set key-name on each pool label (providers[].pools[].labels[].key-name)"},
		"pool":              {in: nodepool3, drivers: []string{"openstack"}, instead: "floating IPs come from the cloud's default pool (auto-floating-ip: false on a pool turns them off): remove the key"},
		"api-timeout":       {in: nodepool3, drivers: []string{"openstack"}, instead: "API calls use openstacksdk's (here the driver's) own timeouts: remove the key"},
		"ipv6-preferred":    {in: nodepool3, drivers: []string{"openstack"}, instead: "a node's interface IP is its public IPv6 address when it has one, else its IPv4 address: remove the key"},
		"image-type":        {in: nodepool3, drivers: []string{"openstack"}, instead: "the upload format is the cloud's image_format in clouds.yaml (qcow2 by default); a diskimage's formats add more: remove the key"},
		"template-hostname": {in: nodepool3, drivers: []string{"openstack"}, instead: "node names are not configurable: remove the key"},
		"hostname-format":   {in: "after 3.x (its documentation no longer has it)", drivers: []string{"openstack"}, instead: "instances are named by node; this launcher names them np<node id>: remove the key"},
	},
	typeDiskimage: {
		"dib_cmd": {in: "3.x, when it was renamed dib-cmd (Nodepool has ignored dib_cmd since, building with disk-image-create)", instead: "rename it dib-cmd"},
	},
}

// tolerance is a key that some Nodepool release or build read and
// Nodepool's documentation does not (or no longer) lists: its files load,
// with a warning that says what this launcher does with it.
type tolerance struct {
	// drivers limits the entry to providers of these drivers (nil: any).
	drivers []string
	// alias is the key it is read as ("": it is not read).
	alias string
	// why is the warning, after "<key>: ".
	why string
}

// toleratedKeys are such keys, by the level they are written at. They
// come from Nodepool's own test fixtures, which its launcher loads.
var toleratedKeys = map[reflect.Type]map[string]tolerance{
	typeConfig: {
		"zookeeper-auth":     {why: "ZooKeeper authentication (SASL), a key of some Nodepool builds that its documentation does not list, is not supported by this launcher's zookeeper role, which connects without it: the key is ignored; authenticate with zookeeper-tls (client certificates) instead"},
		"builder-id-file":    {why: "the file a Nodepool 3.x builder kept its id in; a process here takes its id from NODEPOOL_ID (hostname and pid by default) and keeps no such file: the key is ignored, remove it"},
		"diskimages-globals": {why: "settings that some Nodepool builds merged into every diskimage are not read by this launcher: its elements and env-vars are NOT added to the diskimages, so their builds differ from Nodepool's; put them into an abstract diskimage and name it as each diskimage's parent"},
	},
	typeWebapp: {
		"admin_port":           {why: "Nodepool's admin web port is not served here (the status API and metrics listen on NODEPOOL_HTTP_ADDR): the key is ignored"},
		"admin_listen_address": {why: "Nodepool's admin web address is not served here (the status API and metrics listen on NODEPOOL_HTTP_ADDR): the key is ignored"},
	},
	typePool: {
		"ignore-quota":       {drivers: []string{"fake", "openstack"}, alias: "ignore-provider-quota", why: "the name Nodepool 3.x first gave ignore-provider-quota; it is read as ignore-provider-quota: rename it"},
		"decline-from-quota": {drivers: []string{"fake", "openstack"}, why: "a pool key of some Nodepool builds (decline a request at quota rather than wait), not of its documentation: this launcher never declines for quota, a request waits for quota in priority order; the key is ignored"},
		"executor-zone":      {drivers: []string{"fake", "openstack"}, why: "a pool key of some Nodepool builds, not of its documentation: the key is ignored; to have Zuul run a node's jobs on executors of a zone, set node-attributes: {executor-zone: ...} on the pool, as Nodepool documents"},
		"floating-ip-pool":   {drivers: []string{"fake", "openstack"}, why: "a pool key of some Nodepool builds, not of its documentation: this launcher takes floating IPs from the cloud's default pool (auto-floating-ip turns them off); the key is ignored"},
	},
	typeDiskimage: {
		"builders": {why: "a diskimage key of some Nodepool builds (the builder hosts that may build it), not of its documentation: any builder process here builds any diskimage; the key is ignored"},
	},
	typeStaticNode: {
		"shell_type": {drivers: []string{"static"}, alias: "shell-type", why: "read as shell-type, as Nodepool 4's static driver read it: rename it shell-type"},
	},
}

// tolerated decodes a tolerated key of t, if key is one: it warns, and
// decodes the value into the key it is an alias of (unless that key is
// given too). It reports whether key was one.
func (d *decoder) tolerated(path string, n *yaml.Node, p pair, v reflect.Value, set map[string]bool) bool {
	key := p.key.Value
	tol, ok := toleratedKeys[v.Type()][key]
	if !ok || (tol.drivers != nil && !slices.Contains(tol.drivers, d.driver)) {
		return false
	}
	kpath := joinPath(path, key)
	if tol.alias == "" {
		d.warn(kpath, p.key, "%s: %s", key, tol.why)
		return true
	}
	if mappingValue(n, tol.alias) != nil {
		d.warn(kpath, p.key, "%s: %s; %s is given too and wins, so %s is ignored: remove it", key, tol.why, tol.alias, key)
		return true
	}
	f, ok := d.findField(fieldsOf(v.Type()), tol.alias)
	if !ok {
		return false
	}
	d.warn(kpath, p.key, "%s: %s", key, tol.why)
	if !isNull(resolveAlias(p.val)) {
		set[tol.alias] = true
	}
	d.decode(kpath, p.val, v.FieldByIndex(f.index))
	return true
}

// renamedKeys are keys written where another was meant (the first is in
// an example of Nodepool's own documentation).
var renamedKeys = map[string]string{
	"base": "parent",
}

// unknownKey reports a key that is no field of t for the current driver.
func (d *decoder) unknownKey(path string, at *yaml.Node, key string, t reflect.Type) {
	fields := fieldsOf(t)
	names := d.fieldNames(fields)
	expected := "expected one of: " + strings.Join(names, ", ")
	if len(names) == 0 {
		expected = "expected no keys here"
	}
	if r, ok := removedKeys[t][key]; ok && (r.drivers == nil || slices.Contains(r.drivers, d.driver)) {
		d.fail(path, at, "%s was removed in Nodepool %s: %s", key, r.in, r.instead)
		return
	}
	if alt, ok := renamedKeys[key]; ok && slices.Contains(names, alt) {
		d.fail(path, at, "unknown key; did you mean %q?", alt)
		return
	}
	// A key of another level, for this driver.
	// Outside the providers, no driver is current: a key of any driver's
	// pool labels (say) counts.
	inProvider := t == typeProvider || t == typePool || t == typePoolLabel || t == typeProviderDiskimage
	for _, nt := range levels[t].neighbours {
		if inProvider {
			if _, ok := d.findField(fieldsOf(nt), key); !ok {
				continue
			}
		} else if !slices.ContainsFunc(fieldsOf(nt), func(f field) bool { return f.name == key }) {
			continue
		}
		here := levels[t].name
		there := levelWhere(nt)
		if inProvider && d.driver != "" && (nt == typeProvider || nt == typePool || nt == typePoolLabel) {
			there += " for the " + d.driver + " driver"
		}
		d.fail(path, at, "%s is a key of %s, not of %s: move it there; %s", key, there, here, expected)
		return
	}
	// A key of another driver, at this level.
	var others []string
	for _, f := range fields {
		if f.name == key {
			if drivers := f.tag.Get("drivers"); drivers != "" {
				others = append(others, strings.Split(drivers, ",")...)
			}
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		d.fail(path, at, "the %s driver has no such key (it is a key of the %s driver); %s", d.driver, strings.Join(slices.Compact(others), ", "), expected)
		return
	}
	for _, f := range fields {
		if f.name == key {
			d.fail(path, at, "the %s driver has no such key; %s", d.driver, expected)
			return
		}
	}
	if alt := nearest(key, names); alt != "" {
		d.fail(path, at, "unknown key; did you mean %q? (%s)", alt, expected)
		return
	}
	d.fail(path, at, "unknown key; %s", expected)
}

// nearest returns the name nearest to s, if one is near enough to be
// what was meant: the same but for case and _ for -, or within a few
// edits (a letter more, less, changed, or two swapped).
func nearest(s string, names []string) string {
	norm := func(x string) string { return strings.ReplaceAll(strings.ToLower(x), "_", "-") }
	best, bestDist := "", -1
	for _, n := range names {
		if norm(n) == norm(s) {
			return n
		}
		dist := editDistance(norm(s), norm(n))
		if bestDist < 0 || dist < bestDist {
			best, bestDist = n, dist
		}
	}
	limit := 1
	switch {
	case len(s) > 10:
		limit = 3
	case len(s) > 4:
		limit = 2
	}
	if bestDist < 0 || bestDist > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent letters.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// OldFileAnchor is the section of docs/moving-from-nodepool.md for files
// written before Nodepool 3.0.
const OldFileAnchor = "docs/moving-from-nodepool.md#files-written-for-nodepool-before-30"

// looksPre3 finds the signs that a file was written for Nodepool before
// 3.0: keys of the top level, of its labels and of its providers that
// only Nodepool 2 had. A sure sign (a section Nodepool 3 dropped, labels
// naming images or providers, providers listing images) is enough; keys
// that some early Nodepool 3 files kept (cron, api-timeout...) count when
// there are two of them. It returns the signs found, for the message.
func looksPre3(root *yaml.Node) []string {
	sure := map[string]bool{"targets": true, "gearman-servers": true, "zmq-publishers": true, "dburi": true}
	weak := map[string]bool{"cron": true, "script-dir": true, "api-timeout": true, "ipv6-preferred": true, "image-type": true, "template-hostname": true, "keypair": true}
	var strong, soft []string
	seen := map[string]bool{}
	add := func(list *[]string, sign string) {
		if !seen[sign] {
			seen[sign] = true
			*list = append(*list, sign)
		}
	}
	var quiet decoder
	for _, p := range quiet.pairs("", root) {
		k := p.key.Value
		switch {
		case sure[k]:
			add(&strong, k)
		case weak[k]:
			add(&soft, k)
		}
	}
	for _, l := range seqItems(mappingValue(root, "labels")) {
		for _, k := range []string{"image", "providers", "ready-script", "subnodes"} {
			if mappingValue(l, k) != nil {
				add(&strong, "labels with "+k)
			}
		}
	}
	for _, p := range seqItems(mappingValue(root, "providers")) {
		if dn := mappingValue(p, "driver"); dn != nil && !isNull(dn) && dn.Value != "openstack" {
			continue
		}
		if mappingValue(p, "images") != nil {
			add(&strong, "providers with images")
		}
		for _, k := range []string{"auth-url", "project-id", "project-name", "username", "password"} {
			if mappingValue(p, k) != nil {
				add(&strong, "providers with "+k)
			}
		}
		for _, k := range []string{"api-timeout", "ipv6-preferred", "image-type", "template-hostname", "keypair", "pool"} {
			if mappingValue(p, k) != nil {
				add(&soft, k)
			}
		}
	}
	if len(strong) == 0 && len(soft) < 2 {
		return nil
	}
	return append(strong, soft...)
}

// seqItems returns the items of a sequence node (nil for anything else).
func seqItems(n *yaml.Node) []*yaml.Node {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	out := make([]*yaml.Node, 0, len(n.Content))
	for _, c := range n.Content {
		out = append(out, resolveAlias(c))
	}
	return out
}

// pre3Message is the one line a file written before Nodepool 3.0 is told
// first.
func pre3Message(signs []string) string {
	if len(signs) > 6 {
		signs = append(signs[:5:5], fmt.Sprintf("%d more", len(signs)-5))
	}
	return fmt.Sprintf("this file looks written for Nodepool before 3.0 (2018): it has %s, which Nodepool 3.0 removed; its labels, providers and images are laid out differently since (labels in pools, images in diskimages and cloud-images, credentials in clouds.yaml): see %s, then the errors below", joinAnd(signs), OldFileAnchor)
}

// joinAnd joins words as a sentence does: "a, b and c".
func joinAnd(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// nameList lists names for "expected one of" ("none defined" if there are
// none).
func nameList(names []string) string {
	if len(names) == 0 {
		return "none defined"
	}
	return strings.Join(names, ", ")
}
