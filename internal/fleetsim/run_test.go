package fleetsim

import (
	"strings"
	"testing"
)

// raceDetector is set when the race detector is on (race_test.go).
var raceDetector bool

// TestReplay: a seed replays its run, arrival for arrival and event for
// event, on the virtual clock. (Not under the race detector, which
// shuffles the goroutines of one instant: go test runs it.)
func TestReplay(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector shuffles the goroutines of one instant; go test ./internal/fleetsim runs this test")
	}
	for _, spec := range []string{
		"upstream=nginx rate=100 burst=10 retry_after=1 procs=8 workers=3 latency=5ms jitter=10ms duration=3s seed=15",
		"upstream=strict rate=150 burst=5 counters=openai procs=3 workers=5 latency=0s jitter=0s duration=3s faults=lostreply seed=2",
	} {
		c, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		first, again := Run(t, c), Run(t, c)
		if len(first.Trace) == 0 {
			t.Fatalf("%s: nothing happened", c)
		}
		for i := range max(len(first.Trace), len(again.Trace)) {
			if i >= len(first.Trace) || i >= len(again.Trace) || first.Trace[i] != again.Trace[i] {
				t.Errorf("%s: the runs part at line %d of %d and %d:\n%s", c, i, len(first.Trace), len(again.Trace), strings.Join(again.Trace[max(i-3, 0):min(i+3, len(again.Trace))], "\n"))
				break
			}
		}
	}
}
