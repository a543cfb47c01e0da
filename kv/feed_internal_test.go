package kv

import "testing"

func TestKeyMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"*", "debian", true},
		{"*", "debian.0000000001", false},
		{"*.*", "debian.0000000001", true},
		{"*.*", "debian", false},
		{"*.*.*.*", "debian.0000000002.cloud1.0000000001", true},
		{"*.*.*.*", "debian.0000000002.cloud1", false},
		{"debian.*", "debian.0000000001", true},
		{"debian.*", "ubuntu.0000000001", false},
		{">", "a.b.c", true},
		{"a.>", "a", false},
		{"a.>", "a.b.c", true},
		{"", "", true},
		{"*", "", false},
	} {
		if got := keyMatches(c.pattern, c.key); got != c.want {
			t.Errorf("keyMatches(%q, %q) = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}
