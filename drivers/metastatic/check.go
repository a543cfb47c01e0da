package metastatic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nodepool-nats/nodepool/drivers/hostkeys"
	"github.com/nodepool-nats/nodepool/record"
)

// checkConnection checks, for a label with host-key-checking, that a
// carved node can be reached on its backing node before it is handed out,
// as Nodepool does each time it allocates a slot: the SSH host keys are
// gathered by a handshake (and become the carved node's host_keys); a
// winrm node must accept a TCP connection. boot-timeout bounds it.
func (p *Provider) checkConnection(ctx context.Context, bn *record.Node) ([]string, error) {
	port := bn.ConnectionPort
	if port == 0 {
		port = 22
	}
	if bn.InterfaceIP == "" {
		return nil, fmt.Errorf("backing node %s has no interface_ip to check", bn.ID)
	}
	addr := net.JoinHostPort(bn.InterfaceIP, strconv.Itoa(port))
	timeout := p.cfg.BootTimeout.D()
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if bn.ConnectionType == "winrm" {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%s is unreachable: %w", addr, err)
		}
		_ = c.Close()
		return []string{}, nil
	}
	keys, err := hostkeys.Scan(ctx, addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("host-key scan of %s: %w", addr, err)
	}
	return keys, nil
}

// failBacking marks a backing node failed after a check of a carved node
// on it failed: it takes no new slots, and goes back as soon as its carved
// nodes are gone.
func (p *Provider) failBacking(ctx context.Context, id string, why error) {
	_, err := p.nodes.Modify(ctx, id, func(n *record.Node) error {
		d, ok := p.owned(n)
		if !ok || d.Failed != "" {
			return record.ErrSkip
		}
		d.Failed = truncate(why.Error())
		n.UserData = encodeJSON(d)
		return nil
	})
	switch {
	case err == nil:
		p.log.Warn("backing node failed a host-key check; it takes no new slots", "backing_node", id, "err", why)
	case !errors.Is(err, record.ErrSkip) && !errors.Is(err, record.ErrNotFound) && ctx.Err() == nil:
		p.log.Warn("could not mark a backing node failed", "backing_node", id, "err", err)
	}
}
