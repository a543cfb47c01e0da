package openstack

import (
	"testing"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Nova's statuses, as the listing reads them: which run, which are on
// their way, which are down, and which nothing is judged by.
func TestRunState(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status, task string
		run          drivers.RunState
		quoted       string
	}{
		{"ACTIVE", "", drivers.Running, "ACTIVE"},
		{"ACTIVE", "powering-off", drivers.Running, "ACTIVE"},
		{"ACTIVE", "deleting", drivers.Down, "ACTIVE (task deleting)"},
		{"BUILD", "spawning", drivers.Changing, "BUILD"},
		{"REBOOT", "", drivers.Changing, "REBOOT"},
		{"HARD_REBOOT", "", drivers.Changing, "HARD_REBOOT"},
		{"MIGRATING", "", drivers.Changing, "MIGRATING"},
		{"VERIFY_RESIZE", "", drivers.Changing, "VERIFY_RESIZE"},
		{"SHUTOFF", "", drivers.Down, "SHUTOFF"},
		{"ERROR", "", drivers.Down, "ERROR"},
		{"SOFT_DELETED", "", drivers.Down, "SOFT_DELETED"},
		{"DELETED", "", drivers.Down, "DELETED"},
		{"PAUSED", "", drivers.Down, "PAUSED"},
		{"SUSPENDED", "", drivers.Down, "SUSPENDED"},
		{"SHELVED_OFFLOADED", "", drivers.Down, "SHELVED_OFFLOADED"},
		{"UNKNOWN", "", drivers.Down, "UNKNOWN"},
		{"SOMETHING_NEW", "", drivers.RunUnknown, "SOMETHING_NEW"},
		{"", "", drivers.RunUnknown, ""},
	} {
		run, quoted := runState(&server{Status: c.status, TaskState: c.task})
		if run != c.run || quoted != c.quoted {
			t.Errorf("%s/%s: %v %q, want %v %q", c.status, c.task, run, quoted, c.run, c.quoted)
		}
	}
}
