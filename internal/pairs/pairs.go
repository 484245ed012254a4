// Package pairs lets tests whose fleets each use about half of one of the
// machine's 2 cores (the fault fleets, the demo's runs) run two at a time
// rather than one. Their bounds count the stalls their
// processes measure, as they do beside a CPU hog.
package pairs

import "testing"

var running = make(chan struct{}, 2)

// Run marks t as parallel, then waits until at most one other test that
// called Run is running, and lets t run beside it.
func Run(t *testing.T) {
	t.Helper()
	t.Parallel()
	running <- struct{}{}
	t.Cleanup(func() { <-running })
}
