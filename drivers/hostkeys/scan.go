// Package hostkeys gathers the SSH host keys a machine offers, as ssh-keyscan
// does, for drivers that check a node before it goes into service (static
// hosts, booted cloud instances).
package hostkeys

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// hostKeyAlgorithms are asked for one per handshake, so that every host key
// the host has is gathered, as ssh-keyscan does. ssh-rsa (SHA-1 signatures)
// comes last, for hosts too old for rsa-sha2-512.
var hostKeyAlgorithms = []string{
	ssh.KeyAlgoED25519,
	ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
	ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSA,
}

// errGotKey aborts a handshake once the host key is in hand: a scan never
// logs in.
var errGotKey = errors.New("host key received")

// Scan connects to an SSH server and returns the host keys it
// offers, each as "type base64" (the form of a node's host_keys). timeout
// bounds each connection, from dial to key. An error means the host could
// not be reached or did not speak SSH.
func Scan(ctx context.Context, addr string, timeout time.Duration) ([]string, error) {
	var keys []string
	var offered []string // the host's algorithms, once a negotiation told them
	for _, algo := range hostKeyAlgorithms {
		if offered != nil && !slices.Contains(offered, algo) {
			continue
		}
		if algo == ssh.KeyAlgoRSA && slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, ssh.KeyAlgoRSA+" ") }) {
			continue // the RSA key was gathered already with rsa-sha2-512
		}
		key, err := scanOne(ctx, addr, algo, timeout)
		var ne *ssh.AlgorithmNegotiationError
		switch {
		case err == nil:
			if !slices.Contains(keys, key) {
				keys = append(keys, key)
			}
		case errors.As(err, &ne) && ne.What == "host key":
			offered = ne.RequestedAlgorithms
		default:
			return nil, err
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s offers no host key of a known type (offered %s)", addr, strings.Join(offered, ", "))
	}
	return keys, nil
}

// scanOne runs one handshake asking for one host key algorithm.
func scanOne(ctx context.Context, addr, algo string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "", fmt.Errorf("no connection to %s within %s", addr, timeout)
		}
		return "", err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	var got ssh.PublicKey
	_, _, _, err = ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User:              "nodepool",
		HostKeyAlgorithms: []string{algo},
		Timeout:           timeout,
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			got = key
			return errGotKey
		},
	})
	if got != nil {
		return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(got))), nil
	}
	var netErr net.Error
	if ctx.Err() != nil || (errors.As(err, &netErr) && netErr.Timeout()) {
		return "", fmt.Errorf("no SSH handshake from %s within %s", addr, timeout)
	}
	if err == nil {
		return "", fmt.Errorf("%s: handshake ended without a host key", addr)
	}
	return "", err
}
