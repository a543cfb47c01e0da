package kv

import (
	"encoding/json"
	"time"

	"github.com/nodepool-nats/nodepool/internal/token"
)

// ProviderRecord is a record of the nodepool-providers bucket (key: the
// provider's name, a dot written "="): a provider's configuration section
// as a launcher last loaded it. When the provider is gone from every live
// launcher's configuration while nodes, instances or uploads of it
// remain, the cleanup leader makes its driver from this section and
// drains it (deletes what is left, launches nothing); once nothing of it
// remains, the record is deleted. The section holds no secrets (cloud
// credentials live in clouds.yaml, a kubeconfig, the environment or the
// instance's role; labels' userdata and kubernetes pods' env and spec
// are left out).
type ProviderRecord struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	// Section is the provider's section (config.Provider as JSON, see
	// config.ProviderSection); empty when no launcher ever recorded it
	// (the drain then cannot call its cloud).
	Section json.RawMessage `json:"section,omitempty"`
	// Recorded is when a launcher (Launcher, its NODEPOOL_ID) wrote the
	// section.
	Recorded time.Time `json:"recorded"`
	Launcher string    `json:"launcher,omitempty"`
	// DrainingSince is when the cleanup leader found the provider in no
	// live process's configuration and began draining it.
	DrainingSince *time.Time `json:"draining_since,omitempty"`
	// Problem says why the drain cannot go on (the driver cannot be made,
	// the cloud's calls fail), since ProblemSince; empty while it goes on.
	Problem      string     `json:"problem,omitempty"`
	ProblemSince *time.Time `json:"problem_since,omitempty"`
}

// ProviderKey is the key of a provider's record.
func ProviderKey(provider string) string { return token.Encode(provider) }
