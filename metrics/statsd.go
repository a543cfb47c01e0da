package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
)

// Statsd sends Nodepool's statsd names, for operators whose dashboards
// read them (Graphite). It is off unless STATSD_HOST or STATSD_PORT is
// set, as Nodepool's: the host defaults to localhost and the port to
// 8125. Nodepool reads no prefix variable; neither does this. A nil
// *Statsd sends nothing.
type Statsd struct {
	c   statsd.Statter
	log *slog.Logger
}

// DefaultStatsdPort is statsd's port when STATSD_PORT is unset.
const DefaultStatsdPort = 8125

// StatsdFromEnv makes the statsd client from STATSD_HOST and STATSD_PORT
// (getenv reads them; os.Getenv when nil). It returns nil, nil when
// neither is set, and an error naming the variable when one is not valid.
func StatsdFromEnv(getenv func(string) string, log *slog.Logger) (*Statsd, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	host, portStr := strings.TrimSpace(getenv("STATSD_HOST")), strings.TrimSpace(getenv("STATSD_PORT"))
	if host == "" && portStr == "" {
		return nil, nil
	}
	if host == "" {
		host = "localhost"
	}
	port := DefaultStatsdPort
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("STATSD_PORT %q: expected a port number from 1 to 65535", portStr)
		}
		port = p
	}
	return NewStatsd(net.JoinHostPort(host, strconv.Itoa(port)), log)
}

// NewStatsd makes a client that sends to addr (host:port, UDP), buffered:
// what is sent within a tenth of a second goes in one packet, as
// Nodepool's pipelines do.
func NewStatsd(addr string, log *slog.Logger) (*Statsd, error) {
	if log == nil {
		log = slog.Default()
	}
	c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{
		Address:       addr,
		UseBuffered:   true,
		FlushInterval: 100 * time.Millisecond,
		ResInterval:   time.Minute, // a host name is looked up again now and then
	})
	if err != nil {
		return nil, fmt.Errorf("statsd at %s (STATSD_HOST, STATSD_PORT): %w", addr, err)
	}
	return &Statsd{c: c, log: log}, nil
}

// Close sends what is buffered and closes the socket.
func (s *Statsd) Close() {
	if s != nil {
		_ = s.c.Close()
	}
}

// Count adds n to the counter named by parts.
func (s *Statsd) Count(n int64, parts ...string) {
	if s != nil {
		s.sent(s.c.Inc(Name(parts...), n, 1))
	}
}

// Timing records a duration (in milliseconds, as statsd timers are).
func (s *Statsd) Timing(d time.Duration, parts ...string) {
	if s != nil {
		s.sent(s.c.Timing(Name(parts...), d.Milliseconds(), 1))
	}
}

// Gauge sets the gauge named by parts.
func (s *Statsd) Gauge(v int64, parts ...string) {
	if s != nil {
		s.sent(s.c.Gauge(Name(parts...), v, 1))
	}
}

func (s *Statsd) sent(err error) {
	if err != nil {
		s.log.Debug("statsd: could not send", "err", err)
	}
}

// Name joins the parts of a statsd name with dots. Parts keep their own
// dots, as Nodepool's provider and label names do (Graphite reads them as
// levels); the characters that would break the statsd line (: | @ # and
// white space) become underscores.
func Name(parts ...string) string {
	clean := func(r rune) rune {
		switch r {
		case ':', '|', '@', '#', ' ', '\t', '\n', '\r':
			return '_'
		}
		return r
	}
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = strings.Map(clean, p)
	}
	return strings.Join(out, ".")
}

// Normalize makes a name from outside one level of a statsd name, as
// Nodepool does for requestors and tenants: dots and colons become
// underscores.
func Normalize(s string) string {
	return strings.NewReplacer(".", "_", ":", "_").Replace(s)
}
