package aws

import (
	"errors"
	"fmt"
	"strings"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/nodepool-nats/nodepool/drivers"
)

func asAPIError(err error, ae *smithy.APIError) bool { return errors.As(err, ae) }

// kindOf maps an AWS error code to the driver error kind the launcher
// acts on (nil: none of them).
func kindOf(code string) error {
	switch code {
	case "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
		"RequestThrottledException", "RequestThrottled", "SlowDown", "EC2ThrottledException":
		return drivers.ErrRateLimited
	case "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
		"InsufficientReservedInstanceCapacity", "InsufficientAddressCapacity", "InsufficientCapacityOnHost",
		"SpotMaxPriceTooLow", "UnfulfillableCapacity":
		return drivers.ErrCapacity
	case "MaxSpotInstanceCountExceeded", "ServiceQuotaExceededException", "ConcurrentLimitExceededException":
		return drivers.ErrQuotaExceeded
	case "NoSuchResourceException", "ResourceNotFoundException", "NoSuchKey", "NoSuchBucket", "NotFound":
		return drivers.ErrNotFound
	}
	switch {
	case strings.HasSuffix(code, "LimitExceeded"):
		// VcpuLimitExceeded, InstanceLimitExceeded, HostLimitExceeded,
		// VolumeLimitExceeded, ResourceCountLimitExceeded...
		return drivers.ErrQuotaExceeded
	case strings.HasSuffix(code, ".NotFound") || strings.HasSuffix(code, ".NotFoundException"):
		return drivers.ErrNotFound
	}
	return nil
}

// classify wraps an SDK error with the driver error kind its code means,
// keeping the SDK's error (and AWS's message) in the chain.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ae smithy.APIError
	if asAPIError(err, &ae) {
		if kind := kindOf(ae.ErrorCode()); kind != nil {
			return fmt.Errorf("%w: %w", kind, err)
		}
	}
	return err
}

// code is the AWS error code of an error ("" if it has none).
func code(err error) string {
	var ae smithy.APIError
	if asAPIError(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// unanswered reports whether a call failed without an answer from AWS:
// it was not sent in full, or its answer did not arrive or could not be
// read. Such a call may have taken effect.
func unanswered(err error) bool {
	var ae smithy.APIError
	if asAPIError(err, &ae) {
		return false
	}
	var send *smithyhttp.RequestSendError
	var deser *smithy.DeserializationError
	return errors.As(err, &send) || errors.As(err, &deser)
}
