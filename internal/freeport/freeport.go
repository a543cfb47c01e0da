// Package freeport finds TCP ports of 127.0.0.1 that nothing listens on,
// for servers that need their ports known before they start (the members
// of a NATS cluster name each other's routes).
package freeport

import "net"

// Ports returns n distinct free ports, holding them all open at once so
// that they differ; they are closed again when it returns.
func Ports(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
