package kv

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A listing answers for the streams it has while it is recent; an older
// listing never replaces a newer one; a nil or stale one answers nothing
// (the watch then asks its stream).
func TestListingState(t *testing.T) {
	now := time.Now()
	created := now.Add(-time.Hour)
	info := func(name string, last uint64) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: name}, Created: created, State: jetstream.StreamState{LastSeq: last}}
	}
	var none *Listing
	if _, _, ok := none.state("KV_a", now); ok {
		t.Error("a nil listing answered")
	}
	l := NewListing()
	if _, _, ok := l.state("KV_a", now); ok {
		t.Error("an empty listing answered")
	}
	l.Listed([]*jetstream.StreamInfo{info("KV_a", 7)}, now)
	l.Listed([]*jetstream.StreamInfo{info("KV_a", 3)}, now.Add(-time.Second))
	for _, tc := range []struct {
		stream string
		at     time.Time
		want   uint64
		ok     bool
	}{
		{"KV_a", now, 7, true},
		{"KV_a", now.Add(listingFresh), 7, true},
		{"KV_a", now.Add(listingFresh + time.Millisecond), 0, false},
		{"KV_b", now, 0, false},
	} {
		seq, cr, ok := l.state(tc.stream, tc.at)
		if seq != tc.want || ok != tc.ok || (ok && !cr.Equal(created)) {
			t.Errorf("state(%s, +%s) = %d %s %v, want %d %v", tc.stream, tc.at.Sub(now), seq, cr, ok, tc.want, tc.ok)
		}
	}
}
