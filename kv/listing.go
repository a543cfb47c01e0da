package kv

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// listingFresh is how old a listing of the streams may be for the
// staleness probes to read it: a few of the keeper's looks (one a second).
const listingFresh = 3 * staleCheck

// Listing is what the latest look at a process's streams found of each:
// its last sequence and when it was made. A process reads its streams'
// infos every second already, to make a deleted one again
// (internal/repair); the watches of its views take their staleness probes
// from that look instead of each asking its stream again: one info a
// second per stream for the process, however many caches watch it. A nil
// *Listing, or one not filled lately, or without the stream, has each
// watch ask its stream.
type Listing struct {
	mu     sync.RWMutex
	at     time.Time
	states map[string]listed
}

type listed struct {
	last    uint64
	created time.Time
}

// NewListing makes an empty listing.
func NewListing() *Listing { return &Listing{} }

// Listed records a listing of the streams, asked for at at.
func (l *Listing) Listed(infos []*jetstream.StreamInfo, at time.Time) {
	states := make(map[string]listed, len(infos))
	for _, info := range infos {
		states[info.Config.Name] = listed{last: info.State.LastSeq, created: info.Created}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.After(l.at) {
		l.at, l.states = at, states
	}
}

// state is a stream's last sequence and creation as the latest listing
// found them, if that listing is recent and has the stream. A listing
// asked for before a change may not show it, but never shows a sequence
// the stream does not have: read so, a watch is suspected of missing only
// what the stream holds.
func (l *Listing) state(stream string, now time.Time) (uint64, time.Time, bool) {
	if l == nil {
		return 0, time.Time{}, false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	s, ok := l.states[stream]
	if !ok || now.Sub(l.at) > listingFresh {
		return 0, time.Time{}, false
	}
	return s.last, s.created, true
}
