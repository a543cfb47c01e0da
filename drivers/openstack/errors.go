package openstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/nodepool-nats/nodepool/drivers"
)

// classify turns what gophercloud returned into a cloudError of the kind
// the launcher understands: quota exceeded (Nova's 403 or 413 "Quota
// exceeded", Cinder's 413, Neutron's OverQuota), rate limited (429, with
// its Retry-After), not found (404). Other errors keep their message.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ce *cloudError
	if errors.As(err, &ce) {
		return err
	}
	var ue gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &ue) {
		var reauth *gophercloud.ErrErrorAfterReauthentication
		if errors.As(err, &reauth) {
			return classify(reauth.ErrOriginal)
		}
		return err
	}
	msg := bodyMessage(ue.Body)
	out := &cloudError{status: ue.Actual, msg: fmt.Sprintf("%s %s: %d %s", ue.Method, pathOf(ue.URL), ue.Actual, msg)}
	switch {
	case ue.Actual == http.StatusTooManyRequests:
		out.kind = drivers.ErrRateLimited
		out.retryAfter = retryAfter(ue.ResponseHeader.Get("Retry-After"))
	case ue.Actual == http.StatusNotFound:
		out.kind = drivers.ErrNotFound
	case isQuotaMessage(msg) && (ue.Actual == http.StatusForbidden || ue.Actual == http.StatusRequestEntityTooLarge || ue.Actual == http.StatusConflict):
		out.kind = drivers.ErrQuotaExceeded
	case ue.Actual == http.StatusRequestEntityTooLarge:
		// Nova's old overLimit without a quota message is rate limiting.
		out.kind = drivers.ErrRateLimited
		out.retryAfter = retryAfter(ue.ResponseHeader.Get("Retry-After"))
	}
	return out
}

var quotaRE = regexp.MustCompile(`(?i)quota exceeded|exceeds allowed .*quota|VolumeLimitExceeded|VolumeSizeExceedsAvailableQuota|OverQuota|quota is`)

func isQuotaMessage(msg string) bool { return quotaRE.MatchString(msg) }

// capacityRE matches the faults of servers the scheduler found no room
// for.
var capacityRE = regexp.MustCompile(`(?i)no valid host|not enough hosts available|insufficient (compute )?resources`)

// faultError is the error of a server that went to ERROR, by its fault:
// no valid host is a lack of capacity, a quota fault is quota exceeded.
func faultError(id, fault string) error {
	msg := fmt.Sprintf("server %s went to ERROR: %s", id, fault)
	switch {
	case fault == "":
		return &cloudError{msg: fmt.Sprintf("server %s went to ERROR (no fault given)", id)}
	case capacityRE.MatchString(fault):
		return &cloudError{kind: drivers.ErrCapacity, msg: msg}
	case isQuotaMessage(fault):
		return &cloudError{kind: drivers.ErrQuotaExceeded, msg: msg}
	}
	return &cloudError{msg: msg}
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil && n >= 0 {
		return time.Duration(n * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

var tagRE = regexp.MustCompile(`<[^>]*>`)

// bodyMessage finds the message in an error body, whichever service wrote
// it: Nova and Cinder ({"itemNotFound": {"message": ...}}), Neutron
// ({"NeutronError": {"message": ...}}), Keystone ({"error": {"message":
// ...}}) or Glance (an HTML page).
func bodyMessage(body []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) == nil {
		for _, v := range m {
			var inner struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			}
			if json.Unmarshal(v, &inner) == nil && inner.Message != "" {
				return inner.Message
			}
			var s string
			if json.Unmarshal(v, &s) == nil && s != "" {
				return s
			}
		}
	}
	text := strings.Join(strings.Fields(tagRE.ReplaceAllString(string(body), " ")), " ")
	if len(text) > 300 {
		text = text[:300] + "..."
	}
	return text
}

// pathOf shortens a URL to its path for messages.
func pathOf(url string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		if j := strings.IndexByte(url[i+3:], '/'); j >= 0 {
			return url[i+3+j:]
		}
	}
	return url
}

// describe words a login error.
func describe(err error) error { return classify(err) }
