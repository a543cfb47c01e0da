package consumers

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodepool-nats/nodepool/drivers"
	"github.com/nodepool-nats/nodepool/internal/wait"
	"github.com/nodepool-nats/nodepool/kv"
	"github.com/nodepool-nats/nodepool/metrics"
)

func createRequest(n *kv.Node) drivers.CreateRequest {
	label := ""
	if len(n.Labels) > 0 {
		label = n.Labels[0]
	}
	return drivers.CreateRequest{
		NodeID: n.ID, Hostname: "np" + n.ID, Provider: n.Provider, Pool: n.Pool, Label: label, Attempt: max(n.Attempt, 1), AZ: n.AZ,
		Tags: map[string]string{drivers.TagProvider: n.Provider, drivers.TagPool: n.Pool, drivers.TagNode: n.ID, drivers.TagLabel: label},
	}
}

// runCreate advances a node's create machine to ready, retrying failed
// attempts (each failed instance deleted first) up to launch-retries.
// Stopped (its context ended, or the node no longer its own), it returns
// the instance its machine made, which the node may not record yet.
func (lc *lifecycle) runCreate(ctx context.Context, e kv.Entry[kv.Node], u providerUse) (orphan string) {
	l := lc.l
	id := e.Key
	n := e.Value
	prov, drv := u.cfg, u.drv
	log := l.log.With("node", id, "provider", n.Provider, "pool", n.Pool)
	if !l.launchable(&n) {
		// A reload removed its pool or label since it was claimed: a
		// launcher that has them launches it, else the drain deletes it
		// (drain.go).
		lc.handOverNode(ctx, id, "launch not started: its pool or label is no longer in this launcher's configuration; handing the node over")
		return ""
	}
	if n.Attempt == 0 {
		n.Attempt = 1
	}
	what := "launch started"
	if (len(n.DriverData) > 0 && string(n.DriverData) != "null") || n.ExternalID != "" || n.Attempt > 1 {
		what = "launch resumed"
	}
	log.Info(what, "label", createRequest(&n).Label, "request", n.AllocatedTo, "attempt", n.Attempt)
	sm, err := drv.Create(l.createRequest(&n), n.DriverData)
	if err != nil {
		lc.failLaunch(ctx, &n, fmt.Errorf("cannot start the create machine: %w", err))
		return ""
	}
	defer func() {
		if ctx.Err() != nil {
			orphan = sm.ExternalID() // stopped: the instance may be unrecorded
		}
	}()
	// A driver whose creates are idempotent resumes from scratch: its
	// progress need not be recorded step by step.
	_, idempotent := drivers.As[drivers.Idempotent](drv)
	attemptStart := time.Now()
	saved := n.DriverData
	savedAttempt := e.Value.Attempt
	waits := 0
	for ctx.Err() == nil {
		var attemptErr error
		if !lc.mayDrive(id, kv.NodeBuilding) {
			return sm.ExternalID() // fenced, or the node was taken: no cloud call
		}
		step, err := sm.Advance(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && (errors.Is(err, drivers.ErrQuotaExceeded) || errors.Is(err, drivers.ErrRateLimited) || errors.Is(err, drivers.ErrCapacity)):
			// Not a failed attempt: wait for room and try the step again,
			// saying why on the node (once per wait).
			log.Info("cloud asks to wait", "err", err)
			l.metrics.CloudWait(n.Provider, drivers.ErrorKind(err))
			if waits == 0 {
				why := "waiting: " + err.Error()
				if _, uerr := lc.update(ctx, id, kv.NodeBuilding, func(x *kv.Node) { x.Reason = why }); uerr != nil {
					lc.lostDuringCreate(ctx, id, drv, sm, n.Attempt, uerr)
					return ""
				}
			}
			if !wait.Sleep(ctx, max(wait.Backoff(waits), drivers.RetryAfter(err))) {
				return
			}
			waits++
			continue
		case err != nil && errors.Is(err, drivers.ErrUncertain) && time.Since(attemptStart) <= prov.BootTimeout.D():
			// The step may have taken effect: make it again, as it is
			// safe to, rather than start another attempt.
			log.Warn("cloud call of unknown outcome; making the step again", "err", err)
			if !wait.Sleep(ctx, min(wait.Backoff(waits), 2*time.Second)) {
				return
			}
			waits++
			continue
		case err != nil:
			attemptErr = err
		case !step.Done && time.Since(attemptStart) > prov.BootTimeout.D():
			attemptErr = bootTimeout{prov.BootTimeout.D()}
		}
		waits = 0
		if attemptErr != nil {
			l.metrics.AttemptFailed(n.Provider, createRequest(&n).Label, failureKind(attemptErr))
			if d, ok := drivers.As[drivers.Diagnoser](drv); ok && sm.ExternalID() != "" {
				if more := d.Diagnose(ctx, l.createRequest(&n), sm.ExternalID()); more != "" {
					attemptErr = fmt.Errorf("%w\n%s", attemptErr, more)
				}
			}
			log.Warn("launch attempt failed", "attempt", n.Attempt, "err", attemptErr)
			if !lc.mayDrive(id, kv.NodeBuilding) {
				return sm.ExternalID()
			}
			if !lc.deleteInstance(ctx, drv, sm.ExternalID(), nil) {
				return
			}
			if n.Attempt >= prov.LaunchRetries || time.Since(n.Created) > prov.LaunchTimeout.D() || errors.Is(attemptErr, drivers.ErrFatal) {
				lc.failLaunch(ctx, &n, fmt.Errorf("launch failed after %d attempt(s): %w", n.Attempt, attemptErr))
				return
			}
			if !l.launchable(&n) {
				// A reload removed its pool or label meanwhile: no other
				// attempt here (as above).
				lc.handOverNode(ctx, id, "launch not tried again: its pool or label is no longer in this launcher's configuration; handing the node over")
				return ""
			}
			next := n.Attempt + 1
			ne, err := lc.update(ctx, id, kv.NodeBuilding, func(x *kv.Node) {
				x.Attempt, x.DriverData, x.ExternalID, x.Reason = next, nil, "", attemptErr.Error()
			})
			if err != nil {
				return ""
			}
			n = ne.Value
			if sm, err = drv.Create(l.createRequest(&n), nil); err != nil {
				lc.failLaunch(ctx, &n, fmt.Errorf("cannot start the create machine: %w", err))
				return
			}
			saved, savedAttempt, attemptStart = nil, n.Attempt, time.Now()
			continue
		}
		if step.Done {
			inst := step.Instance
			ne, err := lc.update(ctx, id, kv.NodeBuilding, func(x *kv.Node) {
				l.fillFromInstance(x, inst, prov)
				x.DriverData = sm.State()
				x.Attempt = n.Attempt
				x.Reason = ""
				x.SetState(kv.NodeReady, time.Now().UTC())
			})
			if err != nil {
				lc.lostDuringCreate(ctx, id, drv, sm, n.Attempt, err)
				return ""
			}
			l.launchEnded(&ne.Value, metrics.LaunchReady)
			log.Info("node ready", "label", createRequest(&ne.Value).Label, "request", ne.Value.AllocatedTo,
				"external_id", ne.Value.ExternalID, "az", ne.Value.AZ, "took", time.Since(ne.Value.Created).Round(time.Millisecond))
			return
		}
		if st := sm.State(); n.Attempt != savedAttempt || (!idempotent && !bytes.Equal(st, saved)) {
			ext := sm.ExternalID()
			ne, err := lc.update(ctx, id, kv.NodeBuilding, func(x *kv.Node) {
				x.DriverData, x.ExternalID, x.Attempt = st, ext, n.Attempt
			})
			if err != nil {
				lc.lostDuringCreate(ctx, id, drv, sm, n.Attempt, err)
				return ""
			}
			n = ne.Value
			saved, savedAttempt = st, n.Attempt
		}
		// Wait as the machine asks, but wake for the boot-timeout.
		untilTimeout := prov.BootTimeout.D() - time.Since(attemptStart) + time.Millisecond
		if !wait.Sleep(ctx, max(0, min(step.Wait, 2*time.Second, untilTimeout))) {
			return
		}
	}
	return sm.ExternalID()
}

// bootTimeout: an attempt's instance was not ready within boot-timeout.
type bootTimeout struct{ d time.Duration }

func (e bootTimeout) Error() string { return fmt.Sprintf("not ready within boot-timeout %s", e.d) }

// failureKind is the kind of a launch attempt's error in the metrics:
// drivers.ErrorKind, or boot_timeout.
func failureKind(err error) string {
	if errors.As(err, new(bootTimeout)) {
		return "boot_timeout"
	}
	return drivers.ErrorKind(err)
}

// launchEnded counts a launch that ended, with Nodepool's breakdowns.
func (l *Launcher) launchEnded(n *kv.Node, result string) {
	label := createRequest(n).Label
	image := ""
	if prov, ok := l.config().Provider(n.Provider); ok {
		if pool, ok := prov.Pool(n.Pool); ok {
			if pl, ok := pool.Label(label); ok {
				image = cmp.Or(pl.Diskimage, pl.CloudImage)
			}
		}
	}
	l.metrics.Launch(result, n.Provider, n.AZ, label, image, n.Requestor, time.Since(n.Created))
}

// lostDuringCreate runs when a write of a running create found the node
// changed (deleted by an operator, handed to another launcher): the
// instance this process made is deleted here only if nobody else can find
// it. Whoever has the node now knows it if the record names it, or, for a
// driver whose creates are idempotent, if the node is still being created
// in the same attempt (its create finds the instance by the attempt's
// token). Otherwise nobody knows it and this process deletes it.
func (lc *lifecycle) lostDuringCreate(ctx context.Context, id string, drv drivers.Provider, sm drivers.StateMachine, attempt int, err error) {
	if !errors.Is(err, errLost) {
		return // ctx ended; the node stays ours and is resumed or handed over
	}
	ext := sm.ExternalID()
	if ext == "" || lc.l.fenced() {
		return
	}
	cur, gerr := lc.l.b.Nodes.Get(ctx, id)
	switch {
	case gerr != nil && !errors.Is(gerr, kv.ErrNotFound):
		return // cannot tell; cleanup deletes it if it leaked
	case gerr == nil && cur.Value.ExternalID == ext:
		return // whoever has the node now knows the instance
	case gerr == nil && cur.Value.State == kv.NodeBuilding && cur.Value.Attempt == attempt:
		if _, idempotent := drivers.As[drivers.Idempotent](drv); idempotent {
			return // the new owner's create finds it by the attempt's token
		}
	}
	lc.deleteInstance(ctx, drv, ext, nil)
}

// failLaunch marks a node failed after its last attempt, and fails the
// request it was launched for, with the reason.
func (lc *lifecycle) failLaunch(ctx context.Context, n *kv.Node, cause error) {
	l := lc.l
	l.metrics.LaunchFailed(n.Provider, failureKind(cause))
	reason := fmt.Sprintf("node %s (%s in %s): %v", n.ID, strings.Join(n.Labels, ","), kv.PoolRef(n.Provider, n.Pool), cause)
	if n.AllocatedTo != "" {
		_, err := l.requests.Modify(ctx, n.AllocatedTo, func(r *kv.Request) error {
			if r.State != kv.RequestPending || !containsID(r.Nodes, n.ID) {
				return kv.ErrSkip
			}
			r.SetState(kv.RequestFailed, time.Now().UTC())
			r.Reason = reason
			return nil
		})
		if err == nil {
			l.metrics.Request(n.Provider, n.Pool, metrics.RequestFailed, 0)
		}
	}
	_, err := lc.update(ctx, n.ID, kv.NodeBuilding, func(x *kv.Node) {
		x.SetState(kv.NodeFailed, time.Now().UTC())
		x.Reason = reason
		x.ExternalID = ""
		x.DriverData = nil
	})
	if err != nil {
		l.log.Debug("could not mark node failed", "node", n.ID, "err", err)
	}
	result := metrics.LaunchError
	if errors.Is(cause, drivers.ErrQuotaExceeded) {
		result = metrics.LaunchQuota
	}
	l.launchEnded(n, result)
	l.log.Warn("launch failed", "node", n.ID, "provider", n.Provider, "pool", n.Pool, "label", createRequest(n).Label,
		"request", n.AllocatedTo, "reason", reason)
}

func containsID(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
