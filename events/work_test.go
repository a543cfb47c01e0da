package events

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A publish of work refused because the same work waits already, or is
// being stored by another process, counts as queued; other errors do not.
func TestQueued(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"waits already", fmt.Errorf("publishing: %w", &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages per subject exceeded"}), true},
		{"being stored", &jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}, true},
		{"no stream", &jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound, Description: "stream not found"}, false},
		{"timeout", context.DeadlineExceeded, false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		if got := Queued(c.err); got != c.want {
			t.Errorf("%s: Queued(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
