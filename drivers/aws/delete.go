package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Steps of the delete machine.
const (
	stepTerminate = "terminate" // TerminateInstances
	stepGone      = "gone"      // until the instance is terminated
	stepRelease   = "release"   // release its dedicated host
)

// deleteState is the delete machine's progress, kept in driver_data.
type deleteState struct {
	Step   string `json:"step"`
	HostID string `json:"host_id,omitempty"`
}

type deleteMachine struct {
	p    *Provider
	id   string
	st   deleteState
	lost lostPolls
}

// Delete returns the machine that terminates an instance, waits for it to
// be gone and releases its dedicated host (its volumes go with it; what a
// crash leaves behind, the sweeps find).
func (p *Provider) Delete(externalID string, state json.RawMessage) (drivers.StateMachine, error) {
	if !strings.HasPrefix(externalID, "i-") {
		return nil, fmt.Errorf("%q is not an EC2 instance id", externalID)
	}
	m := &deleteMachine{p: p, id: externalID, st: deleteState{Step: stepTerminate}}
	if len(state) > 0 {
		var st deleteState
		if err := json.Unmarshal(state, &st); err == nil && (st.Step == stepTerminate || st.Step == stepGone || st.Step == stepRelease) {
			m.st = st
		}
	}
	return m, nil
}

func (m *deleteMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *deleteMachine) ExternalID() string { return m.id }

// Advance makes the machine's next step.
func (m *deleteMachine) Advance(ctx context.Context) (drivers.Step, error) {
	switch m.st.Step {
	case stepTerminate:
		return m.terminate(ctx)
	case stepGone:
		return m.waitGone(ctx)
	case stepRelease:
		return m.releaseHost(ctx)
	}
	return drivers.Step{}, fmt.Errorf("unknown step %q", m.st.Step)
}

// terminate asks EC2 to terminate the instance; one EC2 does not know is
// gone already.
func (m *deleteMachine) terminate(ctx context.Context) (drivers.Step, error) {
	_, err := m.p.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{m.id}})
	if err != nil {
		if code(err) == "InvalidInstanceID.NotFound" {
			return drivers.Step{Done: true}, nil
		}
		return drivers.Step{}, fmt.Errorf("terminating %s: %w", m.id, classify(err))
	}
	m.st.Step = stepGone
	return drivers.Step{}, nil
}

// waitGone waits until the instance is terminated, noting its dedicated
// host, and asks again when it stopped instead.
func (m *deleteMachine) waitGone(ctx context.Context) (drivers.Step, error) {
	in, ok, err := m.p.watch.get(ctx, m.id)
	if m.lost.again(err) {
		m.p.log.Warn("the answer to a poll was lost; polling again", "instance", m.id, "err", err)
		return drivers.Step{Wait: time.Second}, nil
	}
	if err != nil {
		return drivers.Step{}, fmt.Errorf("describing %s: %w", m.id, err)
	}
	if !ok {
		return m.released()
	}
	if in.Placement != nil && in.Placement.HostId != nil {
		m.st.HostID = *in.Placement.HostId
	}
	if in.State != nil && in.State.Name != ec2types.InstanceStateNameTerminated {
		if in.State.Name != ec2types.InstanceStateNameShuttingDown {
			m.st.Step = stepTerminate // stopped, or terminated elsewhere and back: ask again
		}
		return drivers.Step{}, nil // the watch spaces the polls
	}
	return m.released()
}

// releaseHost releases the instance's dedicated host; one that is gone
// already is no error.
func (m *deleteMachine) releaseHost(ctx context.Context) (drivers.Step, error) {
	out, err := m.p.ec2.ReleaseHosts(ctx, &ec2.ReleaseHostsInput{HostIds: []string{m.st.HostID}})
	if err != nil {
		return drivers.Step{}, fmt.Errorf("releasing dedicated host %s: %w", m.st.HostID, classify(err))
	}
	for _, u := range out.Unsuccessful {
		if u.Error != nil && !strings.Contains(sdkaws.ToString(u.Error.Code), "NotFound") {
			return drivers.Step{}, fmt.Errorf("releasing dedicated host %s: %s: %s", m.st.HostID, sdkaws.ToString(u.Error.Code), sdkaws.ToString(u.Error.Message))
		}
	}
	return drivers.Step{Done: true}, nil
}

// released ends the machine, or goes on to release the instance's host.
func (m *deleteMachine) released() (drivers.Step, error) {
	if m.st.HostID == "" {
		return drivers.Step{Done: true}, nil
	}
	m.st.Step = stepRelease
	return drivers.Step{}, nil
}
