package consumers

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	c, ok := lc.startCreate(ctx, e, u)
	if !ok {
		return ""
	}
	defer func() {
		if ctx.Err() != nil {
			orphan = c.sm.ExternalID() // stopped: the instance may be unrecorded
		}
	}()
	for ctx.Err() == nil {
		if stop, orphan := c.step(ctx); stop {
			return orphan
		}
	}
	return c.sm.ExternalID()
}

// createRun is one run of a node's create machine in this process: what
// the loop of runCreate carries from one step to the next.
type createRun struct {
	lc  *lifecycle
	id  string
	n   kv.Node // the record as this run last wrote or read it
	u   providerUse
	log *slog.Logger
	sm  drivers.StateMachine

	// idempotent: a driver whose creates are idempotent resumes from
	// scratch, so its progress need not be recorded step by step.
	idempotent   bool
	attemptStart time.Time
	saved        []byte // the driver data last recorded
	savedAttempt int    // the attempt last recorded
	waits        int    // steps waited for in a row (backoff)
}

// startCreate sets up the run of a claimed node's create machine, or
// hands the node over or fails it when it cannot start here.
func (lc *lifecycle) startCreate(ctx context.Context, e kv.Entry[kv.Node], u providerUse) (*createRun, bool) {
	l := lc.l
	n := e.Value
	if !l.launchable(&n) {
		// A reload removed its pool or label since it was claimed: a
		// launcher that has them launches it, else the drain deletes it
		// (drain.go).
		lc.handOverNode(ctx, e.Key, "launch not started: its pool or label is no longer in this launcher's configuration; handing the node over")
		return nil, false
	}
	n.Attempt = max(n.Attempt, 1)
	c := &createRun{
		lc: lc, id: e.Key, n: n, u: u,
		log:          l.log.With("node", e.Key, "provider", n.Provider, "pool", n.Pool),
		attemptStart: l.clock.Now(), saved: n.DriverData, savedAttempt: e.Value.Attempt,
	}
	_, c.idempotent = drivers.As[drivers.Idempotent](u.drv)
	what := "launch started"
	if (len(n.DriverData) > 0 && string(n.DriverData) != "null") || n.ExternalID != "" || n.Attempt > 1 {
		what = "launch resumed"
	}
	c.log.Info(what, "label", createRequest(&n).Label, "request", n.AllocatedTo, "attempt", n.Attempt)
	sm, err := u.drv.Create(l.createRequest(&n), n.DriverData)
	if err != nil {
		lc.failLaunch(ctx, &n, fmt.Errorf("cannot start the create machine: %w", err))
		return nil, false
	}
	c.sm = sm
	return c, true
}

// step advances the machine once and does what its answer calls for. It
// tells whether the run is over and, if so, the instance the run made
// that the node may not record.
func (c *createRun) step(ctx context.Context) (stop bool, orphan string) {
	if !c.lc.mayDrive(c.id, kv.NodeBuilding) {
		return true, c.sm.ExternalID() // fenced, or the node was taken: no cloud call
	}
	st, err := c.sm.Advance(ctx)
	switch {
	case ctx.Err() != nil:
		return true, ""
	case err != nil && isCloudWait(err):
		return c.cloudWait(ctx, err)
	case err != nil && errors.Is(err, drivers.ErrUncertain) && c.withinBootTimeout():
		// The step may have taken effect: make it again, as it is safe
		// to, rather than start another attempt.
		c.log.Warn("cloud call of unknown outcome; making the step again", "err", err)
		return c.pause(ctx, min(wait.Backoff(c.waits), 2*time.Second))
	case err == nil && !st.Done && !c.withinBootTimeout():
		err = bootTimeout{c.u.cfg.BootTimeout.D()}
	}
	c.waits = 0
	switch {
	case err != nil:
		return c.attemptFailed(ctx, err)
	case st.Done:
		c.ready(ctx, st.Instance)
		return true, ""
	}
	return c.progress(ctx, st)
}

// isCloudWait: the cloud asks to wait (quota, rate, capacity), which is
// not a failed attempt.
func isCloudWait(err error) bool {
	return errors.Is(err, drivers.ErrQuotaExceeded) || errors.Is(err, drivers.ErrRateLimited) || errors.Is(err, drivers.ErrCapacity)
}

func (c *createRun) withinBootTimeout() bool {
	return c.lc.l.clock.Since(c.attemptStart) <= c.u.cfg.BootTimeout.D()
}

// pause waits d before the step is made again.
func (c *createRun) pause(ctx context.Context, d time.Duration) (stop bool, orphan string) {
	if !wait.Sleep(ctx, d) {
		return true, ""
	}
	c.waits++
	return false, ""
}

// cloudWait waits for room and has the step made again, saying why on the
// node (once per wait).
func (c *createRun) cloudWait(ctx context.Context, err error) (stop bool, orphan string) {
	c.log.Info("cloud asks to wait", "err", err)
	c.lc.l.metrics.CloudWait(c.n.Provider, drivers.ErrorKind(err))
	if c.waits == 0 {
		why := "waiting: " + err.Error()
		if _, uerr := c.lc.update(ctx, c.id, kv.NodeBuilding, func(x *kv.Node) { x.Reason = why }); uerr != nil {
			c.lc.lostDuringCreate(ctx, c.id, c.u.drv, c.sm, c.n.Attempt, uerr)
			return true, ""
		}
	}
	return c.pause(ctx, max(wait.Backoff(c.waits), drivers.RetryAfter(err)))
}

// attemptFailed deletes a failed attempt's instance and starts the next
// attempt, or fails the launch after the last one.
func (c *createRun) attemptFailed(ctx context.Context, attemptErr error) (stop bool, orphan string) {
	lc, l, prov := c.lc, c.lc.l, c.u.cfg
	l.metrics.AttemptFailed(c.n.Provider, createRequest(&c.n).Label, failureKind(attemptErr))
	if d, ok := drivers.As[drivers.Diagnoser](c.u.drv); ok && c.sm.ExternalID() != "" {
		if more := d.Diagnose(ctx, l.createRequest(&c.n), c.sm.ExternalID()); more != "" {
			attemptErr = fmt.Errorf("%w\n%s", attemptErr, more)
		}
	}
	c.log.Warn("launch attempt failed", "attempt", c.n.Attempt, "err", attemptErr)
	if !lc.mayDrive(c.id, kv.NodeBuilding) {
		return true, c.sm.ExternalID()
	}
	if !lc.deleteInstance(ctx, c.u.drv, c.sm.ExternalID(), nil) {
		return true, ""
	}
	if c.n.Attempt >= prov.LaunchRetries || c.lc.l.clock.Since(c.n.Created) > prov.LaunchTimeout.D() || errors.Is(attemptErr, drivers.ErrFatal) {
		lc.failLaunch(ctx, &c.n, fmt.Errorf("launch failed after %d attempt(s): %w", c.n.Attempt, attemptErr))
		return true, ""
	}
	if !l.launchable(&c.n) {
		// A reload removed its pool or label meanwhile: no other attempt
		// here (as in startCreate).
		lc.handOverNode(ctx, c.id, "launch not tried again: its pool or label is no longer in this launcher's configuration; handing the node over")
		return true, ""
	}
	next := c.n.Attempt + 1
	ne, err := lc.update(ctx, c.id, kv.NodeBuilding, func(x *kv.Node) {
		x.Attempt, x.DriverData, x.ExternalID, x.Reason = next, nil, "", attemptErr.Error()
	})
	if err != nil {
		return true, ""
	}
	c.n = ne.Value
	if c.sm, err = c.u.drv.Create(l.createRequest(&c.n), nil); err != nil {
		lc.failLaunch(ctx, &c.n, fmt.Errorf("cannot start the create machine: %w", err))
		return true, ""
	}
	c.saved, c.savedAttempt, c.attemptStart = nil, c.n.Attempt, c.lc.l.clock.Now()
	return false, ""
}

// ready records the instance the machine made and the node ready.
func (c *createRun) ready(ctx context.Context, inst *drivers.Instance) {
	l := c.lc.l
	attempt := c.n.Attempt
	ne, err := c.lc.update(ctx, c.id, kv.NodeBuilding, func(x *kv.Node) {
		l.fillFromInstance(x, inst, c.u.cfg)
		x.DriverData = c.sm.State()
		x.Attempt = attempt
		x.Reason = ""
		x.SetState(kv.NodeReady, c.lc.l.clock.Now().UTC())
	})
	if err != nil {
		c.lc.lostDuringCreate(ctx, c.id, c.u.drv, c.sm, attempt, err)
		return
	}
	l.launchEnded(&ne.Value, metrics.LaunchReady)
	c.log.Info("node ready", "label", createRequest(&ne.Value).Label, "request", ne.Value.AllocatedTo,
		"external_id", ne.Value.ExternalID, "az", ne.Value.AZ, "took", c.lc.l.clock.Since(ne.Value.Created).Round(time.Millisecond))
}

// progress records the machine's step (unless its driver's creates are
// idempotent) and waits as the machine asks, waking for the boot-timeout.
func (c *createRun) progress(ctx context.Context, st drivers.Step) (stop bool, orphan string) {
	if state := c.sm.State(); c.n.Attempt != c.savedAttempt || (!c.idempotent && !bytes.Equal(state, c.saved)) {
		ext, attempt := c.sm.ExternalID(), c.n.Attempt
		ne, err := c.lc.update(ctx, c.id, kv.NodeBuilding, func(x *kv.Node) {
			x.DriverData, x.ExternalID, x.Attempt = state, ext, attempt
		})
		if err != nil {
			c.lc.lostDuringCreate(ctx, c.id, c.u.drv, c.sm, attempt, err)
			return true, ""
		}
		c.n = ne.Value
		c.saved, c.savedAttempt = state, c.n.Attempt
	}
	untilTimeout := c.u.cfg.BootTimeout.D() - c.lc.l.clock.Since(c.attemptStart) + time.Millisecond
	if !wait.Sleep(ctx, max(0, min(st.Wait, 2*time.Second, untilTimeout))) {
		return true, ""
	}
	return false, ""
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
	l.metrics.Launch(result, n.Provider, n.AZ, label, image, n.Requestor, l.clock.Since(n.Created))
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
		lc.failRequest(ctx, n, reason)
	}
	_, err := lc.update(ctx, n.ID, kv.NodeBuilding, func(x *kv.Node) {
		x.SetState(kv.NodeFailed, lc.l.clock.Now().UTC())
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

// failRequestWait bounds how long a failed launch tries to record the
// failure on its request before it marks the node failed all the same.
const failRequestWait = 30 * time.Second

// failRequest records on a failed node's request that it failed, trying
// again while the server does not answer (a loaded cluster) or other
// writers win, for up to failRequestWait: the node is marked failed, and
// then deleted, only after. A request left pending with its failed node
// gone is planned again by its pool's scheduler, a second launch where
// launch-retries allowed one (the scheduler also fails a request whose
// failed node it sees, the fallback past the bound).
func (lc *lifecycle) failRequest(ctx context.Context, n *kv.Node, reason string) {
	l := lc.l
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, failRequestWait)
	defer cancel()
	for failures := 0; ; failures++ {
		_, err := l.requests.Modify(ctx, n.AllocatedTo, func(r *kv.Request) error {
			if r.State != kv.RequestPending || !containsID(r.Nodes, n.ID) {
				return kv.ErrSkip
			}
			r.SetState(kv.RequestFailed, l.clock.Now().UTC())
			r.Reason = reason
			return nil
		})
		switch {
		case err == nil:
			l.metrics.Request(n.Provider, n.Pool, metrics.RequestFailed, 0)
			return
		case errors.Is(err, kv.ErrSkip), errors.Is(err, kv.ErrNotFound):
			return
		}
		if ctx.Err() == nil {
			l.log.Debug("could not record the failed launch on its request yet; trying again", "node", n.ID, "request", n.AllocatedTo, "err", err)
		}
		if ctx.Err() != nil || !wait.Sleep(ctx, wait.Backoff(failures)) {
			if parent.Err() != nil {
				return // stopping
			}
			l.log.Warn("could not record the failed launch on its request; its pool's scheduler fails it when it sees the failed node", "node", n.ID, "request", n.AllocatedTo, "err", err)
			return
		}
	}
}

func containsID(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
