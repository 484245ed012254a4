package pace

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the tests and then checks that no goroutine outlived them.
// A test binary started by a fleet test runs one fleet worker instead.
func TestMain(m *testing.M) {
	if os.Getenv(fleetWorkerEnv) != "" {
		os.Exit(runFleetWorker())
	}
	goleak.VerifyTestMain(m)
}
