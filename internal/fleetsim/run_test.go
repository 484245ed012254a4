package fleetsim

import (
	"runtime"
	"strings"
	"testing"
)

// raceDetector is set when the race detector is on (race_test.go).
var raceDetector bool

// TestReplay: a seed replays its run, arrival for arrival and event for
// event, on the virtual clock, on one CPU. Goroutines runnable at one
// instant (a link of no latency and no jitter makes many) otherwise run in
// parallel, in the scheduler's order: the lost-reply case below parted
// once in about 40 pairs of runs on 2 CPUs, never in 120 on one. So it
// runs alone (not in parallel: the parallel tests wait for it) with
// GOMAXPROCS at 1. (Not under the race detector, which shuffles the
// goroutines of one instant: go test runs it.)
func TestReplay(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector shuffles the goroutines of one instant; go test ./internal/fleetsim runs this test, and make test after its race run")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, spec := range []string{
		"upstream=nginx rate=100 burst=10 retry_after=1 procs=8 workers=3 latency=5ms jitter=10ms redis_latency=5ms redis_jitter=10ms duration=3s seed=15",
		"upstream=strict rate=150 burst=5 counters=openai procs=3 workers=5 latency=0s jitter=0s redis_latency=0s redis_jitter=0s duration=3s faults=lostreply seed=2",
		"upstream=window rate=200 burst=12 window=10s counters=ietf procs=4 workers=3 duration=6s limit='400/10s burst 12' latency=200µs jitter=100µs redis_latency=200µs redis_jitter=100µs faults=kill seed=139",
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

// TestDemand: one worker whose every request takes 10 ms to the upstream
// and back could send about 100 a second, whatever the limits; sixteen at
// 0.2 ms could send far more than a limit of 100/s allows.
func TestDemand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec        string
		least, most float64 // of the units the run allowed
	}{
		{"upstream=strict rate=400 burst=5 procs=1 workers=1 latency=5ms jitter=0s duration=2s", 0.2, 0.3},
		{"upstream=strict rate=100 burst=5 procs=4 workers=4 latency=100µs jitter=0s duration=2s", 500, 1000},
	} {
		c, err := Parse(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		r := Run(t, c)
		if share := r.Demand / r.Allowed; share < tc.least || share > tc.most {
			t.Errorf("%s: demand %.0f of %.0f allowed (%.2f); want %.2f to %.2f", tc.spec, r.Demand, r.Allowed, share, tc.least, tc.most)
		}
	}
}
