package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// CallObserver is told of every call a measured provider made: which
// provider, which method, how long it took and how it ended (nil: it
// succeeded). The metrics package implements it; drivers hold no metrics
// code.
type CallObserver interface {
	ObserveCall(provider, method string, took time.Duration, err error)
}

// Measured wraps a provider so that every call to it (each step of a state
// machine, each listing, quota read, image upload...) is reported to obs.
// Optional interfaces found with As through it (ImageProvider, and those
// listed in decorate) are measured too; the others (Registrar, Manager,
// Idempotent) are the driver's own, found underneath.
func Measured(p Provider, name string, obs CallObserver) Provider {
	if obs == nil {
		return p
	}
	return &measured{Provider: p, name: name, obs: obs}
}

type measured struct {
	Provider
	name string
	obs  CallObserver
}

func (m *measured) observe(method string, start time.Time, err error) {
	m.obs.ObserveCall(m.name, method, time.Since(start), err)
}

func (m *measured) Create(req CreateRequest, state json.RawMessage) (StateMachine, error) {
	sm, err := m.Provider.Create(req, state)
	if err != nil {
		return nil, err
	}
	return &measuredMachine{StateMachine: sm, m: m, method: "create"}, nil
}

func (m *measured) Delete(externalID string, state json.RawMessage) (StateMachine, error) {
	sm, err := m.Provider.Delete(externalID, state)
	if err != nil {
		return nil, err
	}
	return &measuredMachine{StateMachine: sm, m: m, method: "delete"}, nil
}

func (m *measured) ListInstances(ctx context.Context) ([]Instance, error) {
	start := time.Now()
	out, err := m.Provider.ListInstances(ctx)
	m.observe("list_instances", start, err)
	return out, err
}

func (m *measured) QuotaLimits(ctx context.Context) (Resources, error) {
	start := time.Now()
	out, err := m.Provider.QuotaLimits(ctx)
	m.observe("quota_limits", start, err)
	return out, err
}

// Unwrap returns the provider underneath.
func (m *measured) Unwrap() Provider { return m.Provider }

// decorate measures the optional interfaces that make calls to the cloud,
// when As found one underneath: x is wrapped as the interface As looks for.
func (m *measured) decorate(x any, fits func(any) bool) any {
	var wrapped []any
	if v, ok := x.(ImageProvider); ok {
		wrapped = append(wrapped, &measuredImages{ImageProvider: v, m: m})
	}
	if v, ok := x.(Sweeper); ok {
		wrapped = append(wrapped, &measuredSweeper{Sweeper: v, m: m})
	}
	if v, ok := x.(Interrupter); ok {
		wrapped = append(wrapped, &measuredInterrupter{Interrupter: v, m: m})
	}
	for _, w := range wrapped {
		if fits(w) {
			return w
		}
	}
	return x
}

// measuredSweeper measures a Sweeper's sweeps.
type measuredSweeper struct {
	Sweeper
	m *measured
}

func (ms *measuredSweeper) Sweep(ctx context.Context, known func(nodeID string) bool) error {
	start := time.Now()
	err := ms.Sweeper.Sweep(ctx, known)
	ms.m.observe("sweep", start, err)
	return err
}

// measuredInterrupter measures an Interrupter's listings.
type measuredInterrupter struct {
	Interrupter
	m *measured
}

func (mi *measuredInterrupter) Interruptions(ctx context.Context) ([]Interruption, error) {
	start := time.Now()
	out, err := mi.Interrupter.Interruptions(ctx)
	mi.m.observe("interruptions", start, err)
	return out, err
}

// measuredMachine measures each step of a state machine.
type measuredMachine struct {
	StateMachine
	m      *measured
	method string
}

func (sm *measuredMachine) Advance(ctx context.Context) (Step, error) {
	start := time.Now()
	step, err := sm.StateMachine.Advance(ctx)
	sm.m.observe(sm.method, start, err)
	return step, err
}

// measuredImages measures an ImageProvider's calls.
type measuredImages struct {
	ImageProvider
	m *measured
}

func (mi *measuredImages) UploadImage(ctx context.Context, req ImageUpload) (Image, error) {
	start := time.Now()
	img, err := mi.ImageProvider.UploadImage(ctx, req)
	mi.m.observe("upload_image", start, err)
	return img, err
}

func (mi *measuredImages) DeleteImage(ctx context.Context, externalID string) error {
	start := time.Now()
	err := mi.ImageProvider.DeleteImage(ctx, externalID)
	mi.m.observe("delete_image", start, err)
	return err
}

func (mi *measuredImages) ListImages(ctx context.Context) ([]Image, error) {
	start := time.Now()
	out, err := mi.ImageProvider.ListImages(ctx)
	mi.m.observe("list_images", start, err)
	return out, err
}

// ErrorKind names the kind of a driver's error for metrics and logs:
// "" for nil, then quota, capacity, not_found, rate_limited, fatal,
// uncertain, canceled (the caller's context ended), timeout, or other.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrQuotaExceeded):
		return "quota"
	case errors.Is(err, ErrCapacity):
		return "capacity"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrRateLimited):
		return "rate_limited"
	case errors.Is(err, ErrFatal):
		return "fatal"
	case errors.Is(err, ErrUncertain):
		return "uncertain"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}
