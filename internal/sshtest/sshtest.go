// Package sshtest runs real SSH servers (golang.org/x/crypto/ssh) on
// 127.0.0.1 for tests of host key scanning: each has its own host keys and
// can be switched between serving SSH, refusing connections and hanging.
package sshtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Mode is how a server answers a connection.
type Mode int32

const (
	// Up serves SSH: the key exchange runs and shows the host key.
	Up Mode = iota
	// Refusing accepts a connection and closes it at once, like a host
	// whose SSH daemon is down behind a port forwarder.
	Refusing
	// Silent accepts a connection and never says a word, like a host that
	// hangs: clients run into their timeout.
	Silent
)

// Key types a server can have.
const (
	Ed25519 = "ed25519"
	ECDSA   = "ecdsa"
	RSA     = "rsa"
)

// Server is a running SSH server.
type Server struct {
	Host string
	Port int

	cfg      *ssh.ServerConfig
	keys     []string
	ln       net.Listener
	mode     atomic.Int32
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
	// next is closed (and replaced) whenever a connection is accepted.
	next chan struct{}
}

// Start starts a server with a new host key of each type given (ed25519
// only if none), in mode Up. It stops when the test ends.
func Start(t testing.TB, keyTypes ...string) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Serve(ln, keyTypes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Serve serves SSH on a listener with new host keys of the types given.
func Serve(ln net.Listener, keyTypes ...string) (*Server, error) {
	if len(keyTypes) == 0 {
		keyTypes = []string{Ed25519}
	}
	cfg := &ssh.ServerConfig{
		PasswordCallback: func(ssh.ConnMetadata, []byte) (*ssh.Permissions, error) {
			return nil, errors.New("no logins on a test server")
		},
	}
	s := &Server{cfg: cfg, ln: ln, conns: map[net.Conn]struct{}{}, next: make(chan struct{})}
	for _, kt := range keyTypes {
		signer, err := newSigner(kt)
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		cfg.AddHostKey(signer)
		s.keys = append(s.keys, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))))
	}
	addr := ln.Addr().(*net.TCPAddr)
	s.Host, s.Port = addr.IP.String(), addr.Port
	s.wg.Go(s.accept)
	return s, nil
}

func newSigner(keyType string) (ssh.Signer, error) {
	var key any
	var err error
	switch keyType {
	case Ed25519:
		_, key, err = ed25519.GenerateKey(rand.Reader)
	case ECDSA:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RSA:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		return nil, errors.New("sshtest: unknown key type " + keyType)
	}
	if err != nil {
		return nil, err
	}
	return ssh.NewSignerFromKey(key)
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// HostKeys are the server's public host keys, each "type base64" as in a
// node's host_keys.
func (s *Server) HostKeys() []string { return append([]string(nil), s.keys...) }

// SetMode changes how new connections are answered.
func (s *Server) SetMode(m Mode) { s.mode.Store(int32(m)) }

// Accepted counts the connections accepted so far.
func (s *Server) Accepted() int64 { return s.accepted.Load() }

// WaitAccepted waits until more than n connections were accepted, or ctx
// ends; it reports whether they were.
func (s *Server) WaitAccepted(ctx context.Context, n int64) bool {
	for {
		s.mu.Lock()
		next := s.next
		s.mu.Unlock()
		if s.accepted.Load() > n {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-next:
		}
	}
}

// Close stops the server and drops its connections.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	_ = s.ln.Close()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.accepted.Add(1)
		close(s.next)
		s.next = make(chan struct{})
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			s.handle(c)
		})
	}
}

func (s *Server) handle(c net.Conn) {
	switch Mode(s.mode.Load()) {
	case Refusing:
		return
	case Silent:
		// Read until the client gives up or the server closes.
		buf := make([]byte, 512)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	default:
		conn, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
		if err != nil {
			return // a key scanner hangs up once it has the key
		}
		go ssh.DiscardRequests(reqs)
		for ch := range chans {
			_ = ch.Reject(ssh.Prohibited, "test server")
		}
		_ = conn.Close()
	}
}
