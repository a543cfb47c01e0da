package drivers

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"
)

// Limiter paces calls: Wait returns when the next call may go.
// golang.org/x/time/rate's Limiter is one.
type Limiter interface {
	Wait(ctx context.Context) error
}

// Paced is implemented by drivers that pace every API call themselves
// (one state machine step may make several calls): the process's Pacer
// hands them its limiter instead of wrapping them with RateLimited.
type Paced interface {
	Pace(lim Limiter)
}

// RateLimited wraps a provider so that every call to the cloud (each step
// of a state machine, each listing, each quota read, and for a driver that
// takes images each upload, image delete and image listing) first waits
// for the limiter. Drivers stay free of rate limiting; the process decides
// the rate (Pacer).
func RateLimited(p Provider, lim Limiter) Provider {
	l := &limited{Provider: p, lim: lim}
	if ip, ok := p.(ImageProvider); ok {
		return &limitedImages{limited: l, images: ip}
	}
	return l
}

// limitedImages paces the image calls of a driver that takes images too.
type limitedImages struct {
	*limited
	images ImageProvider
}

func (l *limitedImages) ImageFormat() string { return l.images.ImageFormat() }

func (l *limitedImages) UploadImage(ctx context.Context, req ImageUpload) (Image, error) {
	if err := l.lim.Wait(ctx); err != nil {
		return Image{}, err
	}
	return l.images.UploadImage(ctx, req)
}

func (l *limitedImages) DeleteImage(ctx context.Context, externalID string) error {
	if err := l.lim.Wait(ctx); err != nil {
		return err
	}
	return l.images.DeleteImage(ctx, externalID)
}

func (l *limitedImages) ListImages(ctx context.Context) ([]Image, error) {
	if err := l.lim.Wait(ctx); err != nil {
		return nil, err
	}
	return l.images.ListImages(ctx)
}

type limited struct {
	Provider
	lim Limiter
}

func (l *limited) Create(req CreateRequest, state json.RawMessage) (StateMachine, error) {
	sm, err := l.Provider.Create(req, state)
	if err != nil {
		return nil, err
	}
	return &limitedMachine{StateMachine: sm, lim: l.lim}, nil
}

func (l *limited) Delete(externalID string, state json.RawMessage) (StateMachine, error) {
	sm, err := l.Provider.Delete(externalID, state)
	if err != nil {
		return nil, err
	}
	return &limitedMachine{StateMachine: sm, lim: l.lim}, nil
}

func (l *limited) ListInstances(ctx context.Context) ([]Instance, error) {
	if err := l.lim.Wait(ctx); err != nil {
		return nil, err
	}
	return l.Provider.ListInstances(ctx)
}

func (l *limited) QuotaLimits(ctx context.Context) (Resources, error) {
	if err := l.lim.Wait(ctx); err != nil {
		return Resources{}, err
	}
	return l.Provider.QuotaLimits(ctx)
}

// Unwrap returns the provider underneath.
func (l *limited) Unwrap() Provider { return l.Provider }

type limitedMachine struct {
	StateMachine
	lim Limiter
}

func (m *limitedMachine) Advance(ctx context.Context) (Step, error) {
	if err := m.lim.Wait(ctx); err != nil {
		return Step{}, err
	}
	return m.StateMachine.Advance(ctx)
}

// As finds an optional interface T on a provider or on the providers it
// wraps (RateLimited, Measured). A wrapper that adds something to the
// calls of an optional interface (Measured measures ImageProvider's)
// hands back T wrapped in its turn, so that what As returns is measured as
// the provider itself is.
func As[T any](p Provider) (T, bool) {
	var outer []Provider
	for p != nil {
		if t, ok := p.(T); ok {
			for i := len(outer) - 1; i >= 0; i-- {
				if d, ok := outer[i].(decorator); ok {
					if dt, ok := d.decorate(t, func(x any) bool { _, ok := x.(T); return ok }).(T); ok {
						t = dt
					}
				}
			}
			return t, true
		}
		u, ok := p.(interface{ Unwrap() Provider })
		if !ok {
			break
		}
		outer = append(outer, p)
		p = u.Unwrap()
	}
	var zero T
	return zero, false
}

// decorator is a wrapper that wraps what As finds underneath it; fits
// tells whether a wrapping still is what As looks for (x may implement
// several optional interfaces).
type decorator interface {
	decorate(x any, fits func(any) bool) any
}

type pacedWaitKey struct{}

// WithPacedWaitMeter returns a context under which the time a driver's
// calls spend waiting for their turn at the provider's rate (reported
// with MeterPacedWait) adds up, and a func that reads the total. A poll
// that spaces itself by how long it took uses it to leave out the rate's
// own spacing.
func WithPacedWaitMeter(ctx context.Context) (context.Context, func() time.Duration) {
	var total atomic.Int64
	return context.WithValue(ctx, pacedWaitKey{}, &total), func() time.Duration { return time.Duration(total.Load()) }
}

// MeterPacedWait adds the time since start to the context's meter, if it
// has one: defer MeterPacedWait(ctx, time.Now()) around a limiter's Wait.
func MeterPacedWait(ctx context.Context, start time.Time) {
	if m, ok := ctx.Value(pacedWaitKey{}).(*atomic.Int64); ok {
		m.Add(int64(time.Since(start)))
	}
}
