package bench

import (
	"testing"
	"time"
)

func TestSummarise(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	s := Summarise(ds)
	want := Stats{Min: time.Millisecond, P50: 50 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if s != want {
		t.Errorf("Summarise = %+v, want %+v", s, want)
	}
	if (Summarise(nil) != Stats{}) {
		t.Error("empty sample")
	}
}

func TestSummarize(t *testing.T) {
	cases := []struct {
		in   []float64
		want Median
	}{
		{[]float64{3, 1, 2}, Median{2, 1, 3}},
		{[]float64{4, 1, 3, 2}, Median{2.5, 1, 4}},
		{[]float64{7}, Median{7, 7, 7}},
	}
	for _, c := range cases {
		if got := Summarize(c.in); got != c.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// The line of exports nodepool-devcloud prints is read as a shell would.
func TestParseExports(t *testing.T) {
	got := parseExports(`export AWS_ENDPOINT_URL=http://127.0.0.1:4566 OS_CLIENT_CONFIG_FILE='/tmp/my clouds/it'\''s.yaml' OS_CLOUD=devcloud`)
	want := map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:4566", "OS_CLIENT_CONFIG_FILE": "/tmp/my clouds/it's.yaml", "OS_CLOUD": "devcloud"}
	if len(got) != len(want) {
		t.Fatalf("parseExports = %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}
