package hostkeys

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/sshtest"
)

func TestScanGathersEveryKey(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t, sshtest.Ed25519, sshtest.ECDSA, sshtest.RSA)
	keys, err := Scan(t.Context(), srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := srv.HostKeys()
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("scanned keys\n%s\nwant\n%s", strings.Join(keys, "\n"), strings.Join(want, "\n"))
	}
}

// BenchmarkScan measures one host check: a handshake per host key
// algorithm the host has (here ed25519 and ECDSA) on loopback.
func BenchmarkScan(b *testing.B) {
	srv := sshtest.Start(b, sshtest.Ed25519, sshtest.ECDSA)
	for b.Loop() {
		keys, err := Scan(b.Context(), srv.Addr(), 5*time.Second)
		if err != nil || len(keys) != 2 {
			b.Fatalf("keys %v, err %v", keys, err)
		}
	}
}
