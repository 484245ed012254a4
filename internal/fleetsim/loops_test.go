package fleetsim

import (
	"fmt"
	"testing"
)

// loopCase is a family of runs that a loop of pace's must keep within
// bars: at least served of what both the upstream and pace's limit
// allowed, and at most refused of the requests refused after the first
// second.
type loopCase struct {
	spec            string
	served, refused float64
}

// check runs each case of the family, on this machine's loopback as the
// simulator models it, and holds it to the family's bars.
func (lc loopCase) check(t *testing.T, cases ...string) {
	t.Helper()
	for _, spec := range cases {
		c, err := Parse(lc.spec + " " + spec + " latency=100µs jitter=1ms procs=4 workers=4 duration=3s")
		if err != nil {
			t.Fatal(err)
		}
		r := Run(t, c)
		refused := float64(r.RefusedAfter1s) / float64(max(r.Served+r.Refused, 1))
		t.Logf("%.3f served, %d refused (%d after 1 s): %s", r.Utilisation(), r.Refused, r.RefusedAfter1s, spec)
		if r.Utilisation() < lc.served || refused > lc.refused {
			t.Errorf("%s %s: served %.1f%%, refused %.2f%% after the first second; want %.0f%% at least, %.1f%% at most\n  replay: go test ./internal/fleetsim -run '^TestSweep$' -count=1 -v -args -case \"%s\"",
				lc.spec, spec, 100*r.Utilisation(), 100*refused, 100*lc.served, 100*lc.refused, c)
		}
	}
}

// grid is the cases of every rate and burst given, each a "rate=R burst=B"
// spec.
func grid(rates, bursts []int) []string {
	var cases []string
	for _, r := range rates {
		for _, b := range bursts {
			cases = append(cases, fmt.Sprintf("rate=%d burst=%d", r, b))
		}
	}
	return cases
}

// TestRetryAfterAtTheLimit: an upstream that sends Retry-After with every
// refusal, at exactly pace's limit (most real APIs; issue 43 measured 1% to
// 7% of the quota, a cycle of holds each ended by a burst that jitter made
// early): pace serves 95% of what both allow, and none is refused after the
// first second, at bursts 2 to 20, from 50/s to 400/s; whole seconds, or
// exactly until the upstream admits again.
func TestRetryAfterAtTheLimit(t *testing.T) {
	bars := func(up string) loopCase { return loopCase{spec: up, served: 0.95, refused: 0.005} }
	bars("upstream=strict retry_after=1").check(t, grid([]int{50, 400}, []int{2, 10})...)
	bars("upstream=strict retry_after=auto").check(t, grid([]int{150}, []int{5, 20})...)
	bars("upstream=nginx retry_after=1").check(t, grid([]int{150}, []int{5})...)
}
