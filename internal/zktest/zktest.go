// Package zktest starts real ZooKeeper servers (Debian's zookeeper package,
// 3.8) for tests, over TLS only, as Nodepool's tools/zoo.cfg does: a
// throwaway CA, a server certificate and a client certificate, on a free
// port of 127.0.0.1, with a data directory of the test's own. A server can
// be killed and started again on its data and port, as a crashed and
// restarted ZooKeeper would be.
//
// Java's start-up costs a second or two and a few hundred MiB, so a test
// package shares one server (Shared) and each test works under a chroot of
// its own (Chroot), which is also how Zuul and Nodepool may share an
// ensemble with other users; tests that kill or restart the server start
// one of their own (Start).
package zktest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Install is what to run when ZooKeeper is missing.
const Install = "apt-get install -y zookeeper python3-kazoo"

// classpath is the server's classpath: the package's jar lacks Netty's
// codec, without which every TLS handshake fails (shared/notes/zookeeper.md).
var classpath = []string{
	"/usr/share/java/zookeeper.jar",
	"/usr/share/java/zookeeper-jute.jar",
	"/usr/share/java/netty-codec.jar",
	"/usr/share/java/netty-resolver.jar",
	"/usr/share/java/netty-transport-native-unix-common.jar",
	"/usr/share/java/slf4j-simple.jar",
}

// TickTime is the servers' tick: sessions may last from 2 to 20 ticks
// (0.5 s to 5 s), so tests can let one expire quickly.
const TickTime = 250 * time.Millisecond

// Server is a ZooKeeper server run by a test.
type Server struct {
	// Addr is host:port of the TLS client port.
	Addr string
	// CA, Cert and Key are the PEM files a client presents (Nodepool's
	// zookeeper-tls ca, cert and key).
	CA, Cert, Key string

	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logf *os.File
}

// Available reports why ZooKeeper cannot run here ("" if it can).
func Available() string {
	if _, err := exec.LookPath("java"); err != nil {
		return "java is not installed (" + Install + ")"
	}
	for _, jar := range classpath {
		if _, err := os.Stat(jar); err != nil {
			return jar + " is missing (" + Install + ")"
		}
	}
	return ""
}

// Start starts a server of the test's own; it is killed when the test
// ends. A missing ZooKeeper fails the test with the command to install it.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := NewServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	if err := s.Run(); err != nil {
		t.Fatal(err)
	}
	return s
}

// NewServer prepares a server in dir (certificates, zoo.cfg, a free
// port); Run starts it.
func NewServer(dir string) (*Server, error) {
	if why := Available(); why != "" {
		return nil, fmt.Errorf("ZooKeeper cannot run: %s", why)
	}
	s := &Server{dir: dir, CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")}
	if err := writeCerts(dir); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	cfg := fmt.Sprintf(`tickTime=%d
dataDir=%s
secureClientPort=%d
secureClientPortAddress=127.0.0.1
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=%s
ssl.keyStore.type=PEM
ssl.trustStore.location=%s
ssl.trustStore.type=PEM
ssl.clientAuth=need
admin.enableServer=false
standaloneEnabled=true
4lw.commands.whitelist=*
`, TickTime.Milliseconds(), filepath.Join(dir, "data"), s.port, filepath.Join(dir, "server-keystore.pem"), s.CA)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return s, nil
}

// Run starts the server (again, after Kill, on its data and port) and
// waits until it serves a TLS session.
func (s *Server) Run() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "zookeeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("java", "-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
		"-Dzookeeper.jmx.log4j.disable=true", "-cp", strings.Join(classpath, ":"),
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(s.dir, "zoo.cfg"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the test binary, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting ZooKeeper: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done, s.logf = cmd, done, logf
	deadline := time.Now().Add(60 * time.Second)
	for {
		if s.serves() {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("ZooKeeper exited at start; its log:\n%s", s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ZooKeeper did not serve on %s within 60 s; its log:\n%s", s.Addr, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serves reports whether the server answers a TLS "ruok" with "imok".
func (s *Server) serves() bool {
	cfg, err := s.TLSConfig()
	if err != nil {
		return false
	}
	d := &net.Dialer{Timeout: time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", s.Addr, cfg)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("ruok")); err != nil {
		return false
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(conn)
	return strings.Contains(buf.String(), "imok")
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	_ = s.logf.Close()
	s.cmd = nil
}

// Log is the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "zookeeper.log"))
	return string(b)
}

func (s *Server) logTail() string {
	l := s.Log()
	if len(l) > 4000 {
		l = "...\n" + l[len(l)-4000:]
	}
	return l
}

// TLSConfig is a client's TLS configuration for the server.
func (s *Server) TLSConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.Cert, s.Key)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(s.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// ConfigYAML is the zookeeper-servers and zookeeper-tls of a nodepool.yaml
// for this server, under chroot ("" for none).
func (s *Server) ConfigYAML(chroot string) string {
	out := fmt.Sprintf("zookeeper-servers:\n  - host: 127.0.0.1\n    port: %d\n", s.port)
	if chroot != "" {
		out += "    chroot: " + chroot + "\n"
	}
	return out + fmt.Sprintf("zookeeper-tls:\n  ca: %s\n  cert: %s\n  key: %s\n", s.CA, s.Cert, s.Key)
}

// Hosts is the kazoo host string for this server under chroot, as Zuul's
// zuul.conf [zookeeper] hosts would name it.
func (s *Server) Hosts(chroot string) string { return s.Addr + chroot }

var chrootSeq atomic.Int64

var unsafeRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Chroot is a chroot of the test's own (not created: clients create it).
func Chroot(t testing.TB) string {
	return fmt.Sprintf("/%s-%d-%d", strings.Trim(unsafeRE.ReplaceAllString(t.Name(), "-"), "-"), os.Getpid(), chrootSeq.Add(1))
}

// Shared is the package's ZooKeeper, started by the first test that asks
// for it; SharedMain stops it when the package's tests end.
type Shared struct {
	mu  sync.Mutex
	srv *Server
	dir string
	err error
}

// Get returns the shared server, starting it on first use.
func (sh *Shared) Get(t testing.TB) *Server {
	t.Helper()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.srv == nil && sh.err == nil {
		dir, err := os.MkdirTemp("", "zktest")
		if err == nil {
			sh.dir = dir
			var s *Server
			if s, err = NewServer(dir); err == nil {
				if err = s.Run(); err == nil {
					sh.srv = s
				}
			}
		}
		sh.err = err
	}
	if sh.err != nil {
		t.Fatal(sh.err)
	}
	return sh.srv
}

// Stop kills the shared server, if it was started, and removes its files.
func (sh *Shared) Stop() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.srv != nil {
		sh.srv.Kill()
	}
	if sh.dir != "" {
		_ = os.RemoveAll(sh.dir)
	}
}

// writeCerts makes a CA, a server certificate (with its key in one PEM
// file, as ZooKeeper's PEM keystore takes it) and a client certificate,
// RSA keys in PKCS #8, valid for 127.0.0.1 and localhost.
func writeCerts(dir string) error {
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "zktest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	issue := func(name string, serial int64) (certPEM, keyPEM []byte, err error) {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
	}
	srvCert, srvKey, err := issue("zookeeper", 2)
	if err != nil {
		return err
	}
	cliCert, cliKey, err := issue("client", 3)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.pem":              pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"server-keystore.pem": append(srvCert, srvKey...),
		"client.pem":          cliCert,
		"client-key.pem":      cliKey,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// LogLines returns the lines of the server's log that match re (for
// tests that look for what the server said).
func (s *Server) LogLines(re *regexp.Regexp) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s.Log()))
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// Proxy forwards a port to the server, so that a test can cut one client
// off (its connection closed and new ones refused), as a network that
// fails would, for longer than its session timeout.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

// Proxy starts a proxy to the server; it stops when the test ends.
func (s *Server) Proxy(t testing.TB) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: s.Addr, conns: map[net.Conn]bool{}}
	go p.accept()
	t.Cleanup(func() { _ = ln.Close(); p.Cut() })
	return p
}

// Port is the proxy's port on 127.0.0.1.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			_ = dst.Close()
			_ = src.Close()
			return
		}
	}
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// ConfigYAMLVia is ConfigYAML with the server reached through a proxy.
func (s *Server) ConfigYAMLVia(p *Proxy, chroot string) string {
	return strings.Replace(s.ConfigYAML(chroot), fmt.Sprintf("port: %d\n", s.port), fmt.Sprintf("port: %d\n", p.Port()), 1)
}
