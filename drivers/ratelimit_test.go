package drivers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/nodepool-nats/nodepool/drivers"
)

type countingLimiter struct{ waits atomic.Int64 }

func (c *countingLimiter) Wait(context.Context) error { c.waits.Add(1); return nil }

// imageCloud is a provider that takes images (only the image calls are
// used here).
type imageCloud struct {
	drivers.Provider
	calls int
}

func (c *imageCloud) ImageFormat() string { return "qcow2" }
func (c *imageCloud) UploadImage(context.Context, drivers.ImageUpload) (drivers.Image, error) {
	c.calls++
	return drivers.Image{ExternalID: "img"}, nil
}
func (c *imageCloud) DeleteImage(context.Context, string) error { c.calls++; return nil }
func (c *imageCloud) ListImages(context.Context) ([]drivers.Image, error) {
	c.calls++
	return nil, nil
}

type plainCloud struct{ drivers.Provider }

// The image calls of a paced provider wait for its limiter, as its
// machines and listings do; a provider without images gains none.
func TestImageCallsArePaced(t *testing.T) {
	lim := &countingLimiter{}
	cloud := &imageCloud{}
	p := drivers.RateLimited(cloud, lim)
	ip, ok := drivers.As[drivers.ImageProvider](p)
	if !ok {
		t.Fatal("the paced provider does not take images")
	}
	ctx := t.Context()
	if _, err := ip.UploadImage(ctx, drivers.ImageUpload{}); err != nil {
		t.Fatal(err)
	}
	_ = ip.DeleteImage(ctx, "img")
	_, _ = ip.ListImages(ctx)
	if ip.ImageFormat() != "qcow2" {
		t.Error("image format lost")
	}
	if lim.waits.Load() != 3 || cloud.calls != 3 {
		t.Errorf("%d waits for %d image calls, want 3 and 3", lim.waits.Load(), cloud.calls)
	}
	if _, ok := drivers.As[drivers.ImageProvider](drivers.RateLimited(&plainCloud{}, lim)); ok {
		t.Error("a provider without images takes images once paced")
	}
}

func TestPacedWaitMeter(t *testing.T) {
	lim := rate.NewLimiter(rate.Limit(50), 1)
	ctx, paced := drivers.WithPacedWaitMeter(t.Context())
	start := time.Now()
	for range 3 {
		func() {
			defer drivers.MeterPacedWait(ctx, time.Now())
			if err := lim.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}()
	}
	// The second and third calls waited for their turn (20 ms each).
	if got, all := paced(), time.Since(start); got <= 0 || got > all {
		t.Fatalf("metered %s of waiting in %s", got, all)
	}
	drivers.MeterPacedWait(t.Context(), start) // no meter: nothing to add to
}
