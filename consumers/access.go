package consumers

import (
	"maps"

	"github.com/nodepool-nats/nodepool/config"
	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/kv"
)

// Defaults of what a node record says about reaching a node, when neither
// the label's diskimage nor the driver says otherwise (Nodepool's).
const (
	defaultUsername       = "zuul"
	defaultPythonPath     = "auto"
	defaultShellType      = "sh"
	defaultConnectionType = "ssh"
	defaultSSHPort        = 22
	defaultWinRMPort      = 5986
)

// access is what a consumer needs to reach and use a node.
type access struct {
	username, connectionType, pythonPath, shellType string
	connectionPort                                  int
}

// fillFromInstance records a created instance in its node: where it is,
// and how it is reached, layered as Nodepool does: the defaults; then the
// label's diskimage (the username, python-path and shell-type its upload
// was built with, the connection-type and -port of the provider's entry
// for the image); then whatever the driver reports on the instance (a
// cloud image's settings, a backing node's). The pool's node-attributes
// go over the attributes the instance brings.
func (l *Launcher) fillFromInstance(n *kv.Node, inst *drivers.Instance, prov *config.Provider) {
	n.ExternalID = inst.ExternalID
	if inst.Name != "" {
		n.Hostname = inst.Name
	}
	n.Cloud = prov.Cloud
	if inst.Cloud != "" {
		n.Cloud = inst.Cloud
	}
	n.Kubernetes = inst.Kubernetes
	n.Region, n.AZ = inst.Region, inst.AZ
	n.InterfaceIP, n.PublicIPv4, n.PrivateIPv4, n.PublicIPv6 = inst.InterfaceIP, inst.PublicIPv4, inst.PrivateIPv4, inst.PublicIPv6
	if inst.HostKeys != nil {
		n.HostKeys = inst.HostKeys
	}
	if inst.ImageID != "" {
		n.ImageID = inst.ImageID
	}

	a := l.imageAccess(n, prov)
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&a.username, inst.Username)
	set(&a.pythonPath, inst.PythonPath)
	set(&a.shellType, inst.ShellType)
	if inst.ConnectionType != "" {
		a.connectionType = inst.ConnectionType
		a.connectionPort = defaultPort(a.connectionType)
	}
	if inst.ConnectionPort != 0 {
		a.connectionPort = inst.ConnectionPort
	}
	n.Username, n.ConnectionType, n.ConnectionPort = a.username, a.connectionType, a.connectionPort
	n.PythonPath, n.ShellType = a.pythonPath, a.shellType

	attrs := maps.Clone(inst.Attributes)
	if attrs == nil {
		attrs = map[string]string{}
	}
	if pool, ok := prov.Pool(n.Pool); ok {
		maps.Copy(attrs, pool.NodeAttributes)
	}
	n.Attributes = attrs
}

func defaultPort(connectionType string) int {
	switch connectionType {
	case "winrm":
		return defaultWinRMPort
	case "namespace", "kubectl":
		// A kubernetes node is reached through the API server, which
		// its record's kubernetes names: no port.
		return 0
	}
	return defaultSSHPort
}

// imageAccess is how a node of its label is reached before the driver
// says more: the defaults, or the label's diskimage's settings.
func (l *Launcher) imageAccess(n *kv.Node, prov *config.Provider) access {
	a := access{username: defaultUsername, pythonPath: defaultPythonPath, shellType: defaultShellType,
		connectionType: defaultConnectionType, connectionPort: defaultSSHPort}
	pool, ok := prov.Pool(n.Pool)
	if !ok || len(n.Labels) == 0 {
		return a
	}
	pl, ok := pool.Label(n.Labels[0])
	if !ok || pl.Diskimage == "" {
		return a
	}
	if pd, ok := prov.Diskimage(pl.Diskimage); ok {
		a.connectionType, a.connectionPort = pd.ConnectionType, pd.ConnectionPort
	}
	// The upload the node boots from says what its build was made with;
	// the configuration is the fallback (an upload recorded before these
	// fields existed, or one no longer listed).
	if di, ok := l.config().Diskimage(pl.Diskimage); ok {
		a.username, a.pythonPath, a.shellType = di.Username, di.PythonPath, di.ShellType
	}
	if u, ok := l.images.upload(pl.Diskimage, prov.Name, n.ImageID); ok {
		if u.Username != "" {
			a.username = u.Username
		}
		if u.PythonPath != "" {
			a.pythonPath = u.PythonPath
		}
		if u.ShellType != "" {
			a.shellType = u.ShellType
		}
	}
	return a
}
