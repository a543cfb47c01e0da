package natstest

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy stands between NATS clients and a server, so that a test can cut
// one process off from NATS while the others go on, and see every message
// that process publishes (the subjects of its PUB and HPUB, as the server
// receives them).
//
// Cut closes the connections and refuses new ones, as a server that died
// would; Stall stops forwarding without closing anything, as a network
// partition would (what is sent meanwhile arrives when Restore is called,
// as TCP delivers it once the path heals); Delay makes what the server
// sends arrive late, as a slow path back would.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	resume chan struct{} // closed when a stall ends
	delay  time.Duration // of what the server sends
	conns  map[net.Conn]bool
	pubs   []Publish
}

// Publish is a message a client sent through the proxy.
type Publish struct {
	Time    time.Time
	Subject string
}

// StartProxy starts a proxy to a test server; it stops when the test ends.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	return StartProxyTo(t, s.Addr().String())
}

// StartProxyTo forwards a random local port to a server's client address
// (host:port, or a nats:// URL); it stops when the test ends.
func StartProxyTo(t testing.TB, addr string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: strings.TrimPrefix(addr, "nats://"), conns: map[net.Conn]bool{}}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.Restore()
	})
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.cut
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		pr, pw := io.Pipe()
		go p.parse(pr)
		go p.pipe(s, c, pw, false) // client to server, read by the parser
		go p.pipe(c, s, nil, true)
	}
}

// chunk is what was read from one side, to be written to the other.
type chunk struct {
	data   []byte
	due    time.Time     // not before (Delay)
	resume chan struct{} // read during a stall: held until it ends
}

// pipe copies from src to dst, holding what is read while stalled until
// the stall ends and, if delayed, what is read while a Delay is set until
// it has passed; tap gets what was forwarded.
func (p *Proxy) pipe(dst, src net.Conn, tap *io.PipeWriter, delayed bool) {
	chunks := make(chan chunk, 256)
	done := make(chan struct{})
	defer func() {
		close(done)
		_ = dst.Close()
		_ = src.Close()
		if tap != nil {
			_ = tap.Close()
		}
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	go func() {
		defer close(chunks)
		buf := make([]byte, 32*1024)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				c := chunk{data: append([]byte(nil), buf[:n]...), resume: p.resume}
				if delayed && p.delay > 0 {
					c.due = time.Now().Add(p.delay)
				}
				p.mu.Unlock()
				select {
				case chunks <- c:
				case <-done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d) // the path's latency
		}
		if c.resume != nil {
			<-c.resume
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
		if tap != nil {
			if _, err := tap.Write(c.data); err != nil {
				return
			}
		}
	}
}

// parse reads the client protocol and records each PUB and HPUB.
func (p *Proxy) parse(r io.Reader) {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			_, _ = io.Copy(io.Discard, br)
			return
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var size int
		switch strings.ToUpper(f[0]) {
		case "PUB":
			size, _ = strconv.Atoi(f[len(f)-1])
		case "HPUB":
			size, _ = strconv.Atoi(f[len(f)-1])
		default:
			continue
		}
		p.mu.Lock()
		p.pubs = append(p.pubs, Publish{Time: time.Now(), Subject: f[1]})
		p.mu.Unlock()
		if _, err := br.Discard(size + 2); err != nil {
			_, _ = io.Copy(io.Discard, br)
			return
		}
	}
}

// Cut closes every connection through the proxy and refuses new ones
// until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Stall stops forwarding in both directions until Restore, keeping the
// connections open.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Delay makes what the server sends from now on reach the clients d late
// (0: at once); what is on its way when a Stall starts still arrives.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Restore ends a Cut or a Stall.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// Published lists what clients published through the proxy since it
// started, in the order the server received it.
func (p *Proxy) Published() []Publish {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Publish(nil), p.pubs...)
}
