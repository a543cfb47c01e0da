package aws

import (
	"testing"

	"github.com/nodepool-nats/nodepool/drivers"
)

// EC2's instance states, as the listing reads them.
func TestRunState(t *testing.T) {
	t.Parallel()
	for state, want := range map[string]drivers.RunState{
		"running": drivers.Running, "pending": drivers.Changing,
		"stopping": drivers.Down, "stopped": drivers.Down, "shutting-down": drivers.Down, "terminated": drivers.Down,
		"": drivers.RunUnknown, "hibernating": drivers.RunUnknown,
	} {
		if got := runState(state); got != want {
			t.Errorf("%q: %v, want %v", state, got, want)
		}
	}
}
