package fleetsim

import (
	"slices"
	"testing"
)

// hotKey is a key whose demand in each process takes token leases (see
// pace.WithTokenLeases): 2 processes of 6 workers at a strict 2,000/s.
const hotKey = "upstream=strict rate=2000 burst=200 procs=2 workers=6 duration=2s"

// TestTokenLeasesKeepTheBound holds a fleet that leases its tokens to
// every invariant across the faults (Redis killed and restarted empty, its
// replies lost, a process paused while it holds leases) and a hold
// mid-lease: the bound b + r*t, each request sent once, no arrival inside
// a hold. (The sweep's other faults and limiters, run by hand on this key,
// keep them too.) Without faults, the leases take a fifth of the calls or
// fewer, and serve 95%.
func TestTokenLeasesKeepTheBound(t *testing.T) {
	t.Parallel() // beside the sweep: each run is a bubble of its own
	for _, spec := range []string{"faults=none", "faults=kill", "faults=lostreply", "faults=pause",
		"retry_after=1 limit='3000/s burst 200'"} {
		c, err := Parse(hotKey + " " + spec)
		if err != nil {
			t.Fatal(err)
		}
		r := Run(t, c)
		for _, v := range r.Violations {
			t.Errorf("%s: %s\n  replay: go test ./internal/fleetsim -run '^TestSweep$' -count=1 -v -args -case \"%s\"", spec, v, c)
		}
		if spec != "faults=none" {
			continue
		}
		c.Leases = "off"
		booked := Run(t, c)
		t.Logf("leased: %.3f served, %d Redis calls; one call a request: %.3f served, %d calls", r.Utilisation(), r.RedisCalls, booked.Utilisation(), booked.RedisCalls)
		if r.Utilisation() < 0.95 || r.RedisCalls*5 > booked.RedisCalls {
			t.Errorf("leased: %.3f served with %d Redis calls; want 0.95 at least, with a fifth of the %d calls of one call a request", r.Utilisation(), r.RedisCalls, booked.RedisCalls)
		}
	}
}

// TestTokenLeasesLeaveSlowKeysAlone: a fleet at the demo's 200/s leases
// nothing; its run is the same, arrival for arrival, with leases on or off.
func TestTokenLeasesLeaveSlowKeysAlone(t *testing.T) {
	t.Parallel()
	c, err := Parse("upstream=strict rate=200 burst=10 procs=3 workers=3 duration=3s")
	if err != nil {
		t.Fatal(err)
	}
	on := Run(t, c)
	c.Leases = "off"
	off := Run(t, c)
	if !slices.Equal(on.Trace, off.Trace) || on.RedisCalls != off.RedisCalls {
		t.Errorf("leases on: %d Redis calls, %d lines of trace; off: %d calls, %d lines: want the same run", on.RedisCalls, len(on.Trace), off.RedisCalls, len(off.Trace))
	}
}
