package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// everything is a provider with every optional interface that makes cloud
// calls; its calls do nothing.
type everything struct{}

func (everything) Create(CreateRequest, json.RawMessage) (StateMachine, error) { return nil, nil }
func (everything) Delete(string, json.RawMessage) (StateMachine, error)        { return nil, nil }
func (everything) ListInstances(context.Context) ([]Instance, error)           { return nil, nil }
func (everything) QuotaLimits(context.Context) (Resources, error)              { return Resources{}, nil }
func (everything) QuotaForLabel(string, string) (Resources, error)             { return Resources{}, nil }
func (everything) Close()                                                      {}
func (everything) ImageFormat() string                                         { return "raw" }
func (everything) UploadImage(context.Context, ImageUpload) (Image, error)     { return Image{}, nil }
func (everything) DeleteImage(context.Context, string) error                   { return ErrNotFound }
func (everything) ListImages(context.Context) ([]Image, error)                 { return nil, nil }
func (everything) Sweep(context.Context, func(string) bool) error              { return nil }
func (everything) Interruptions(context.Context) ([]Interruption, error)       { return nil, nil }

type calls struct {
	mu  sync.Mutex
	got []string
}

func (c *calls) ObserveCall(provider, method string, _ time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, provider+"/"+method+"/"+ErrorKind(err))
}

type noLimit struct{}

func (noLimit) Wait(context.Context) error { return nil }

// TestMeasuredFindsEveryOptionalInterface checks that each optional
// interface found with As through the measuring (and rate-limiting)
// wrappers is measured, whichever other interfaces the driver has.
func TestMeasuredFindsEveryOptionalInterface(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tests := []struct {
		name string
		call func(p Provider) bool
		want string
	}{
		{"image delete", func(p Provider) bool {
			ip, ok := As[ImageProvider](p)
			return ok && errors.Is(ip.DeleteImage(ctx, "x"), ErrNotFound)
		}, "cloud/delete_image/not_found"},
		{"sweep", func(p Provider) bool {
			sw, ok := As[Sweeper](p)
			return ok && sw.Sweep(ctx, func(string) bool { return true }) == nil
		}, "cloud/sweep/"},
		{"interruptions", func(p Provider) bool {
			in, ok := As[Interrupter](p)
			if !ok {
				return false
			}
			_, err := in.Interruptions(ctx)
			return err == nil
		}, "cloud/interruptions/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obs := &calls{}
			p := Measured(RateLimited(everything{}, noLimit{}), "cloud", obs)
			if !tt.call(p) {
				t.Fatal("the interface was not found through the wrappers")
			}
			if !slices.Equal(obs.got, []string{tt.want}) {
				t.Errorf("calls observed %q, want [%q]", obs.got, tt.want)
			}
		})
	}
}
