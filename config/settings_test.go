package config

import "testing"

func TestRedactURLs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://nodepool:s3cret@nats:4222", "nats://nodepool:xxxxx@nats:4222"},
		{"nats://a:p1@n1:4222,nats://a:p2@n2:4222", "nats://a:xxxxx@n1:4222,nats://a:xxxxx@n2:4222"},
		{"nats://s3cret-token@nats:4222", "nats://xxxxx@nats:4222"},
		{"nats://u:p%zz@h", "(a URL that does not parse)"},
	} {
		if got := RedactURLs(tc.in); got != tc.want {
			t.Errorf("RedactURLs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
