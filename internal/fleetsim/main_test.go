package fleetsim

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/pace/internal/redistest"
)

// TestMain runs the tests without go-redis's logs of the faults the
// simulator injects, and checks that no goroutine outlived them.
func TestMain(m *testing.M) {
	redistest.Quiet()
	goleak.VerifyTestMain(m)
}
