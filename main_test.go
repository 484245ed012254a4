package pace

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestMain runs the tests, without go-redis's logs of the outages they
// cause, and then checks that no goroutine outlived them. A test binary
// started by a fleet test runs one fleet worker instead.
func TestMain(m *testing.M) {
	if os.Getenv(fleetWorkerEnv) != "" {
		os.Exit(runFleetWorker())
	}
	redistest.Quiet()
	goleak.VerifyTestMain(m)
}
