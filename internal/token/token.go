// Package token writes names from nodepool.yaml (images, providers) as
// single tokens of NATS subjects and KV keys, where a dot separates
// tokens: a dot in a name is written "=", which a name cannot hold.
package token

import "strings"

// Encode writes a name as one subject or key token.
func Encode(name string) string { return strings.ReplaceAll(name, ".", "=") }

// Decode reads a name back from its token.
func Decode(tok string) string { return strings.ReplaceAll(tok, "=", ".") }
