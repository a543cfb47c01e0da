package builder

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nodepool-nats/nodepool/internal/natstest"
)

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A file is handed to the object store no faster than the store's stream
// stores it: past pacingWindow ahead of what is stored, the reader waits;
// once chunks are stored it goes on.
func TestPacedReaderFollowsTheStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := EnsureFiles(t.Context(), js, 1, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	b := &Builder{js: js}
	r, err := b.paced(t.Context(), zeros{})
	if err != nil {
		t.Fatal(err)
	}
	p := r.(*pacedReader)
	// The window and one check's worth more go out with nothing stored
	// (the reader looks at the stream every pacingEvery bytes).
	if n, err := io.CopyN(io.Discard, r, pacingWindow+pacingEvery); err != nil || n != pacingWindow+pacingEvery {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	if ahead, err := p.ahead(); err != nil || ahead <= pacingWindow {
		t.Fatalf("ahead %d (%v), want more than the window: the next read must wait", ahead, err)
	}
	// A stored file's worth of chunks brings it back within the window.
	for range pacingEvery / chunkSize {
		if _, err := js.Publish(t.Context(), "$O."+FilesBucket+".C.TESTNUID", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if ahead, err := p.ahead(); err != nil || ahead > pacingWindow {
		t.Fatalf("ahead %d (%v) after the chunks were stored", ahead, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, r, pacingEvery)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader waits although the stream caught up")
	}
}
