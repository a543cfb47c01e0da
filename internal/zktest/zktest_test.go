package zktest

import (
	"testing"
	"time"
)

func TestStartKillRun(t *testing.T) {
	start := time.Now()
	s := Start(t)
	t.Logf("started in %s on %s", time.Since(start), s.Addr)
	s.Kill()
	if s.serves() {
		t.Fatal("serves after Kill")
	}
	start = time.Now()
	if err := s.Run(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %s", time.Since(start))
}
