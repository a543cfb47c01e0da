package config

import (
	"testing"
	"time"
)

// FuzzTemplates feeds any text to the dynamic-instance-properties and
// image-name-format expanders: an error or a string, never a panic.
func FuzzTemplates(f *testing.F) {
	for _, s := range []string{"{request.id}", "{{x}} {request.requestor_data[job]}", "{", "}", "{request.labels", "{image_name}-{timestamp}", "{request.requestor_data[}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ExpandRequestTemplate(s, func(string, string) (string, bool) { return "v", true })
		_, _ = FormatImageName(s, "image", time.Unix(0, 0))
	})
}
