package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
)

// validLabelValue is a Kubernetes label value: at most 63 of A-Z a-z 0-9
// - _ ., alphanumeric at both ends (or empty).
var validLabelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)

// notLabel is what a label value may not hold.
var notLabel = regexp.MustCompile(`[^-A-Za-z0-9_.]+`)

// notDNS is what a DNS label (a namespace's or pod's name) may not hold.
var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// labelValue is a name as a label value: itself if it is one, else its
// characters that may be (at most 50, alphanumeric at both ends) and a
// hash of the whole, so that two names never share a value.
func labelValue(s string) string {
	if len(s) <= 63 && validLabelValue.MatchString(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	base := notLabel.ReplaceAllString(s, "_")
	if len(base) > 50 {
		base = base[:50]
	}
	base = strings.TrimRight(strings.TrimLeft(base, "-_."), "-_.")
	if base == "" {
		return "h" + hex.EncodeToString(sum[:6])
	}
	return base + "-" + hex.EncodeToString(sum[:6])
}

// dnsLabel is a name as a DNS label (lowercase alphanumerics and -, at
// most max, alphanumeric at both ends), "x" if nothing is left.
func dnsLabel(s string, max int) string {
	s = notDNS.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > max {
		s = s[:max]
	}
	s = strings.Trim(s, "-")
	if s == "" {
		return "x"
	}
	return s
}

// namespaceName is the namespace of a node's launch attempt, as Nodepool
// names it, "<pool>-<node id>", then "-<attempt>" after the first attempt
// (the namespace of a failed attempt may still be going away), made a
// DNS label: the pool's name is cut to fit.
func namespaceName(pool, nodeID string, attempt int) string {
	suffix := "-" + dnsLabel(nodeID, 40)
	if attempt > 1 {
		suffix += "-" + strconv.Itoa(attempt)
	}
	return dnsLabel(pool, 63-len(suffix)) + suffix
}

// podName is a pod label's pod, named after the label as in Nodepool,
// made a DNS label.
func podName(label string) string { return dnsLabel(label, 63) }
