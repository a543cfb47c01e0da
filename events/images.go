package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nodepool-nats/nodepool/internal/token"
	"io"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reasons carried by build and upload triggers.
const (
	ReasonManual    = "manual"
	ReasonScheduled = "scheduled"
)

// BuildMessage is the optional body of a build trigger, published on
// nodepool.builds.<image> (public contract). An empty body is a manual
// trigger.
type BuildMessage struct {
	// Reason is "manual" or "scheduled"; Detail says why (for the log).
	Reason      string `json:"reason,omitempty"`
	Detail      string `json:"detail,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
}

// UploadMessage is the optional body of an upload trigger, published on
// nodepool.uploads.<image>.<provider> (public contract). The upload worker
// uploads the newest ready build of the image that the provider lacks.
type UploadMessage struct {
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

var imageNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// ValidImageName reports whether a name can be an image or provider name
// (as nodepool.yaml allows them): 1 to 64 of A-Z a-z 0-9 _ - and inner
// dots.
func ValidImageName(name string) bool { return len(name) <= 64 && imageNameRE.MatchString(name) }

// ParseBuildSubject returns the image of a build trigger subject.
func ParseBuildSubject(subject string) (string, error) {
	tok, ok := strings.CutPrefix(subject, "nodepool.builds.")
	image := token.Decode(tok)
	if !ok || strings.Contains(tok, ".") || !ValidImageName(image) {
		return "", fmt.Errorf("subject %q is not a build trigger; expected nodepool.builds.<image>", subject)
	}
	return image, nil
}

// ParseUploadSubject returns the image and provider of an upload trigger
// subject.
func ParseUploadSubject(subject string) (image, provider string, err error) {
	rest, ok := strings.CutPrefix(subject, "nodepool.uploads.")
	itok, ptok, two := strings.Cut(rest, ".")
	image, provider = token.Decode(itok), token.Decode(ptok)
	if !ok || !two || strings.Contains(ptok, ".") || !ValidImageName(image) || !ValidImageName(provider) {
		return "", "", fmt.Errorf("subject %q is not an upload trigger; expected nodepool.uploads.<image>.<provider>", subject)
	}
	return image, provider, nil
}

// decodeStrict decodes an optional JSON object body: empty is the zero
// value; anything else must be one object with known fields only.
func decodeStrict(data []byte, v any, fields string) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := describeJSONError(err)
		if strings.HasPrefix(err.Error(), "json: unknown field") {
			msg = strings.TrimPrefix(err.Error(), "json: ") + "; expected only " + fields
		}
		return errors.New(msg)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("extra data after the JSON object")
	}
	return nil
}

// ParseBuildMessage decodes a build trigger's body.
func ParseBuildMessage(data []byte) (BuildMessage, error) {
	var m BuildMessage
	if err := decodeStrict(data, &m, "reason, detail, requested_by"); err != nil {
		return BuildMessage{}, fmt.Errorf("not a valid build trigger body (expected empty or a JSON object): %w", err)
	}
	if m.Reason == "" {
		m.Reason = ReasonManual
	}
	if m.Reason != ReasonManual && m.Reason != ReasonScheduled {
		return m, fmt.Errorf("not a valid build trigger body: reason %q; expected manual or scheduled", m.Reason)
	}
	return m, nil
}

// ParseUploadMessage decodes an upload trigger's body.
func ParseUploadMessage(data []byte) (UploadMessage, error) {
	var m UploadMessage
	if err := decodeStrict(data, &m, "reason, detail"); err != nil {
		return UploadMessage{}, fmt.Errorf("not a valid upload trigger body (expected empty or a JSON object): %w", err)
	}
	return m, nil
}

// PublishBuild publishes a build trigger. A non-empty msgID makes a repeat
// within the stream's duplicate window a no-op.
func PublishBuild(ctx context.Context, js jetstream.JetStream, image string, m BuildMessage, msgID string) error {
	if !ValidImageName(image) {
		return fmt.Errorf("image name %q is not valid; expected 1 to 64 of A-Z a-z 0-9 _ -", image)
	}
	return publishJSON(ctx, js, BuildSubject(image), m, msgID)
}

// PublishUpload publishes an upload trigger.
func PublishUpload(ctx context.Context, js jetstream.JetStream, image, provider string, m UploadMessage, msgID string) error {
	if !ValidImageName(image) || !ValidImageName(provider) {
		return fmt.Errorf("image %q or provider %q is not a valid name; expected 1 to 64 of A-Z a-z 0-9 _ -", image, provider)
	}
	return publishJSON(ctx, js, UploadSubject(image, provider), m, msgID)
}

func publishJSON(ctx context.Context, js jetstream.JetStream, subject string, v any, msgID string) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", subject, err)
	}
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...); err != nil {
		return fmt.Errorf("publishing %s: %w", subject, err)
	}
	return nil
}
