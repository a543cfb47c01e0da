package metrics

import "sync"

// Other is the value a label takes for a name from outside the
// configuration: a provider, pool, label or state of a record that the
// configuration (or a live pool) does not have, a requestor past the
// first few. Every label is thus bounded by the configuration, so that no
// record and no client can make new series: Prometheus and Graphite keep
// every series they are ever sent.
const Other = "other"

// firstSeen bounds the values of a label that come from a few sources
// outside the configuration (the availability zones a cloud reports, the
// requestors of launches in statsd): the first max values seen keep
// their name for the life of the process, later ones are Other.
type firstSeen struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func newFirstSeen(max int) *firstSeen { return &firstSeen{max: max, seen: map[string]bool{}} }

// name is v if v is one of the first max values seen, else Other.
func (f *firstSeen) name(v string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.seen[v]:
		return v
	case len(f.seen) < f.max:
		f.seen[v] = true
		return v
	}
	return Other
}
