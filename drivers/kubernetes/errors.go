package kubernetes

import (
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nodepool-nats/nodepool/drivers"
)

// apiError is an error of the API server, of the kind the launcher acts on.
type apiError struct {
	kind       error // a drivers failure kind, or nil
	msg        string
	retryAfter time.Duration
	err        error // what client-go returned
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}
func (e *apiError) RetryAfter() time.Duration { return e.retryAfter }

// classify turns what client-go returned into an error of the kind the
// launcher understands: 429 (the API server's priority and fairness, or
// an eviction a budget holds back) is rate limited, with the delay it
// suggests; a refusal of the ResourceQuota admission (a quota a cluster's
// policy put on the namespace is full, or not counted yet) is quota
// exceeded; 404 is not found. Errors of unknown outcome (no answer, a
// timeout, 5xx) are drivers.ErrUncertain where the step is safe to make
// again (every step of a create and a delete is: their names are fixed).
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return err
	}
	out := &apiError{msg: fmt.Sprintf("%s: %v", what, err), err: err}
	switch {
	case apierrors.IsTooManyRequests(err):
		out.kind = drivers.ErrRateLimited
		if s, ok := apierrors.SuggestsClientDelay(err); ok {
			out.retryAfter = time.Duration(s) * time.Second
		}
	case apierrors.IsNotFound(err):
		out.kind = drivers.ErrNotFound
	case apierrors.IsForbidden(err) && quotaRefusal(err.Error()):
		out.kind = drivers.ErrQuotaExceeded
	case uncertain(err):
		out.kind = drivers.ErrUncertain
	}
	return out
}

// quotaRefusal: a message of the ResourceQuota admission's refusals (the
// quota is full, or not counted yet).
func quotaRefusal(msg string) bool {
	for _, m := range []string{"exceeded quota:", "status unknown for quota:", "failed quota:"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// uncertain: the call may or may not have taken effect (no answer, a
// timeout, the server failing).
func uncertain(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true // no answer from the server: a connection error
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsInternalError(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) || st.Status().Code >= 500
}
