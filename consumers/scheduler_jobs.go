package consumers

import (
	"context"
	"sync"

	"github.com/nodepool-nats/nodepool/kv"
)

// maxJobs bounds the writes one term runs at once.
const maxJobs = 256

// jobSet tracks the jobs (writes) a term has in flight. The loop marks
// what a job works on when it spawns it, and clears the marks when it
// collects the job, so that a pass neither plans twice for a request nor
// promises a node twice.
type jobSet struct {
	busy     map[string]bool     // requests and nodes with a job in flight
	reserved map[string]bool     // ready nodes promised to a request by a job in flight
	newNodes map[string]inflight // what jobs in flight create, by request

	wg     sync.WaitGroup
	sem    chan struct{}
	doneMu sync.Mutex
	done   []jobDone
	doneC  chan struct{}

	// panicked is called, in the job's goroutine, when a job panics.
	panicked func(ctx context.Context, d jobDone, p any)
}

// inflight is what a job in flight is creating for a request.
type inflight struct {
	tenant string
	size   kv.Resources
}

// jobDone is what a finished job hands back to the loop.
type jobDone struct {
	keys     []string // busy keys to clear
	reserved []string
	request  string // newNodes entry to clear
	// subject is the request the job works for: failed, with the reason,
	// if the job panics.
	subject string
}

func newJobSet(panicked func(ctx context.Context, d jobDone, p any)) *jobSet {
	return &jobSet{
		busy: map[string]bool{}, reserved: map[string]bool{}, newNodes: map[string]inflight{},
		sem: make(chan struct{}, maxJobs), doneC: make(chan struct{}, 1), panicked: panicked,
	}
}

// spawn runs a job; its busy keys stay set until the loop collects it.
func (js *jobSet) spawn(ctx context.Context, d jobDone, job func(ctx context.Context)) {
	for _, k := range d.keys {
		js.busy[k] = true
	}
	for _, k := range d.reserved {
		js.reserved[k] = true
	}
	js.wg.Go(func() {
		defer func() {
			js.doneMu.Lock()
			js.done = append(js.done, d)
			js.doneMu.Unlock()
			select {
			case js.doneC <- struct{}{}:
			default:
			}
		}()
		select {
		case js.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-js.sem }()
		defer func() {
			if p := recover(); p != nil && js.panicked != nil {
				js.panicked(ctx, d, p)
			}
		}()
		job(ctx)
	})
}

// collect clears the marks of the jobs that finished and returns the keys
// they worked on, for the loop to look at again.
func (js *jobSet) collect() []string {
	js.doneMu.Lock()
	done := js.done
	js.done = nil
	js.doneMu.Unlock()
	var keys []string
	for _, d := range done {
		for _, k := range d.keys {
			delete(js.busy, k)
			keys = append(keys, k)
		}
		for _, k := range d.reserved {
			delete(js.reserved, k)
		}
		if d.request != "" {
			delete(js.newNodes, d.request)
		}
	}
	return keys
}

// wait waits for every job in flight.
func (js *jobSet) wait() { js.wg.Wait() }
