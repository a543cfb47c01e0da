package token

import "testing"

func TestRoundTrip(t *testing.T) {
	for _, name := range []string{"ubuntu-noble", "ubuntu.24.04", "a_b-c", ""} {
		tok := Encode(name)
		for _, c := range tok {
			if c == '.' {
				t.Errorf("Encode(%q) = %q holds a dot", name, tok)
			}
		}
		if got := Decode(tok); got != name {
			t.Errorf("Decode(Encode(%q)) = %q", name, got)
		}
	}
}
