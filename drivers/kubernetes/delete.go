package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodepool-nats/nodepool/drivers"
)

// Steps of a delete.
const (
	delNamespace = ""         // delete the namespace
	delWait      = "wait"     // until it is gone
	delDone      = "finished" // gone
)

// deleteState is a delete's progress, as stored in driver_data.
type deleteState struct {
	Step      string `json:"step,omitempty"`
	Namespace string `json:"namespace"`
}

type deleteMachine struct {
	p  *Provider
	st deleteState
}

// Delete returns a machine that deletes a node's namespace (and so its
// pod, account and everything made in it) and waits until Kubernetes has
// finished it, as Nodepool does.
func (p *Provider) Delete(externalID string, state json.RawMessage) (drivers.StateMachine, error) {
	m := &deleteMachine{p: p, st: deleteState{Namespace: externalID}}
	if len(state) > 0 && string(state) != "null" {
		var st deleteState
		if err := json.Unmarshal(state, &st); err != nil {
			return nil, fmt.Errorf("kubernetes: resuming the delete of %s: %w", externalID, err)
		}
		// Only a delete's own state resumes it (driver_data may still
		// hold the create's).
		if st.Namespace == externalID {
			m.st = st
		}
	}
	return m, nil
}

func (m *deleteMachine) State() json.RawMessage {
	data, _ := json.Marshal(m.st)
	return data
}

func (m *deleteMachine) ExternalID() string { return m.st.Namespace }

func (m *deleteMachine) Advance(ctx context.Context) (drivers.Step, error) {
	nss := m.p.client.CoreV1().Namespaces()
	switch m.st.Step {
	case delNamespace:
		if m.st.Namespace == "" {
			m.st.Step = delDone
			return drivers.Step{Done: true}, nil
		}
		bg := metav1.DeletePropagationBackground
		err := nss.Delete(ctx, m.st.Namespace, metav1.DeleteOptions{PropagationPolicy: &bg})
		if apierrors.IsNotFound(err) {
			m.st.Step = delDone
			return drivers.Step{Done: true}, nil
		}
		if err != nil {
			return drivers.Step{}, classify(err, "deleting namespace "+m.st.Namespace)
		}
		m.st.Step = delWait
		return drivers.Step{Wait: m.p.poll}, nil
	case delWait:
		ns, err := nss.Get(ctx, m.st.Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			m.st.Step = delDone
			return drivers.Step{Done: true}, nil
		}
		if err != nil {
			return drivers.Step{}, classify(err, "reading namespace "+m.st.Namespace)
		}
		if ns.DeletionTimestamp == nil {
			// Made again under the same name since (a resumed create):
			// delete it again.
			m.st.Step = delNamespace
		}
		return drivers.Step{Wait: m.p.poll}, nil
	case delDone:
		return drivers.Step{Done: true}, nil
	}
	return drivers.Step{}, fmt.Errorf("kubernetes: unknown delete step %q", m.st.Step)
}

// Owns reports whether a namespace is the one this provider made for the
// node (by its labels): the launcher deletes no other.
func (p *Provider) Owns(ctx context.Context, externalID, nodeID string) (bool, error) {
	if externalID == "" {
		return false, fmt.Errorf("%w: no namespace", drivers.ErrNotFound)
	}
	ns, err := p.client.CoreV1().Namespaces().Get(ctx, externalID, metav1.GetOptions{})
	if err != nil {
		return false, classify(err, "reading namespace "+externalID)
	}
	return p.owned(ns.Labels, nodeID), nil
}
