package natsretry

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("record changed since it was read"), false},
		{fmt.Errorf("updating: %w", context.DeadlineExceeded), true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{nats.ErrReconnectBufExceeded, true},
		{fmt.Errorf("reading: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{fmt.Errorf("watching: %w", &nats.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence"}, false},
		{jetstream.ErrKeyNotFound, false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// Do tries a transient failure again and stops at a refusal or when its
// context ends.
func TestDo(t *testing.T) {
	calls := 0
	v, err := Do(t.Context(), func(ctx context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, nats.ErrNoResponders
		}
		return 7, nil
	})
	if v != 7 || err != nil || calls != 3 {
		t.Errorf("got %d, %v after %d calls", v, err, calls)
	}
	calls = 0
	refused := errors.New("refused")
	if _, err := Do(t.Context(), func(ctx context.Context) (int, error) { calls++; return 0, refused }); !errors.Is(err, refused) || calls != 1 {
		t.Errorf("a refusal was tried %d times (%v)", calls, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Do(ctx, func(ctx context.Context) (int, error) { return 0, nats.ErrTimeout }); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("ended context: %v", err)
	}
}
