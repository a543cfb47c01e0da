package config

import (
	"reflect"
	"strings"
)

// secureFile is the schema of Nodepool's secure file (`nodepool -s`): the
// secrets kept out of nodepool.yaml: the diskimages' env-vars, and the
// ZooKeeper servers and TLS files, which replace those of nodepool.yaml
// when given, as in Nodepool.
type secureFile struct {
	Diskimages       []secureDiskimage `yaml:"diskimages"`
	ZooKeeperServers []ZooKeeperServer `yaml:"zookeeper-servers"`
	ZooKeeperTLS     *ZooKeeperTLS     `yaml:"zookeeper-tls"`
}

// secureDiskimage adds environment variables to a diskimage's builds.
type secureDiskimage struct {
	Name    string            `yaml:"name" required:"true"`
	EnvVars map[string]string `yaml:"env-vars" required:"true"`
}

// mergeSecure merges the secure file over the configuration, as Nodepool
// does: each entry's env-vars are added to those of the diskimage it
// names (after inheritance), its values winning. Problems are reported
// against the secure file.
func (c *Config) mergeSecure(d *decoder, file string, data []byte) {
	sd := &decoder{file: file}
	defer func() {
		d.errs = append(d.errs, sd.errs...)
		d.warns = append(d.warns, sd.warns...)
	}()
	if len(strings.TrimSpace(string(data))) == 0 {
		return // an empty secure file is fine, as in Nodepool
	}
	root := sd.parseYAML(data)
	if root == nil {
		return
	}
	var sf secureFile
	sd.decodeStruct("", root, reflect.ValueOf(&sf).Elem())
	if len(sf.ZooKeeperServers) > 0 {
		c.ZooKeeperServers = sf.ZooKeeperServers
	}
	if sf.ZooKeeperTLS != nil {
		c.ZooKeeperTLS = sf.ZooKeeperTLS
	}
	for i, sdi := range sf.Diskimages {
		path := indexPath("diskimages", i)
		di, ok := c.Diskimage(sdi.Name)
		switch {
		case sdi.Name == "":
			continue
		case !ok:
			sd.fail(path+".name", nodeAt(root, "diskimages", i, "name"), "diskimage %q is not defined in %s; expected one of: %s", sdi.Name, c.File, nameList(c.DiskimageNames()))
			continue
		case di.Abstract:
			sd.fail(path+".name", nodeAt(root, "diskimages", i, "name"), "diskimage %q is abstract; secure env-vars apply to the images that are built (%s)", sdi.Name, nameList(c.DiskimageNames()))
			continue
		}
		if di.EnvVars == nil {
			di.EnvVars = map[string]string{}
		}
		if di.secret == nil {
			di.secret = map[string]bool{}
		}
		for k, v := range sdi.EnvVars {
			di.EnvVars[k] = v
			di.secret[k] = true
		}
	}
}
