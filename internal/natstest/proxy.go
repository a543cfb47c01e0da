package natstest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a server that a test can cut, as a
// network partition would: every connection through it is closed and new
// ones are refused until it is restored.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

// StartProxy starts a proxy to a server; it stops when the test ends.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: s.Addr().String(), conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
	})
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		go p.pipe(c)
	}
}

func (p *Proxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
		wg.Go(func() {
			_, _ = io.Copy(pair[0], pair[1])
			_ = pair[0].Close()
			_ = pair[1].Close()
		})
	}
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
