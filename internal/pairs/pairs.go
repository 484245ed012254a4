// Package pairs lets tests whose fleets each use about half of one of the
// machine's 2 cores (the fault fleets, the demo's runs) run two at a time
// rather than one. Their bounds count the stalls their
// processes measure, as they do beside a CPU hog.
package pairs

import (
	"sync"
	"testing"
)

var running = make(chan struct{}, 2)

// Run marks t as parallel, then waits until at most one other test that
// called Run is running, and lets t run beside it.
func Run(t *testing.T) {
	t.Helper()
	t.Parallel()
	running <- struct{}{}
	t.Cleanup(func() { <-running })
}

// alone serializes the tests that take both places, so that two of them
// never hold one each and wait for the other's.
var alone sync.Mutex

// Alone marks t as parallel, then waits until no other test that called
// Run or Alone is running, and runs t by itself: a test whose bounds
// measure the machine's jitter (a burst of 1 against a strict upstream),
// which a fleet beside it would decide.
func Alone(t *testing.T) {
	t.Helper()
	t.Parallel()
	alone.Lock()
	running <- struct{}{}
	running <- struct{}{}
	alone.Unlock()
	t.Cleanup(func() { <-running; <-running })
}
