package main

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetpace/pace/internal/fleetsim"
	"github.com/fleetpace/pace/internal/limitertest"
	"github.com/fleetpace/pace/internal/pairs"
	"github.com/fleetpace/pace/internal/redistest"
)

// A fidelityCase is one run of the fleet demo on real processes, through
// a real redis-server, before a real limiter (nginx, HAProxy) or the
// demo's built-in strict bucket, beside the same case in the fleet
// simulator.
type fidelityCase struct {
	sim      string                                     // the case, as fleetsim.Parse reads it, without its network
	upstream func(t *testing.T, c fleetsim.Case) string // the real limiter's URL; nil: the built-in upstream
	// agrees says that the simulator's utilisation is held within 5
	// points of the real one's; the others are chaotic (a Retry-After's
	// cycle), or steered by the start's jitter (a burst of 1), and each
	// run of them, real or simulated, lands elsewhere: they are logged.
	agrees bool
	// served is the least share of what the upstream allowed served: of
	// the simulated run where the case agrees (the loop's bar, in virtual
	// time, which the real run meets within the 5 points of fidelity), else
	// of the real run. refused bounds the real run: the most share of the
	// requests refused (after the first second, when early bounds the
	// first apart).
	served, refused float64
	early           int
	// realLimit, when set, is pace's limit on the real run alone, one the
	// simulator does not pace (a sliding window): the case is not
	// simulated, and what the upstream allows is its model's.
	realLimit string
}

// simNetwork is this machine's loopback as the simulator models it: about
// 100 µs a trip, and the millisecond by which Go's timers and the
// processes' scheduling on 2 cores bunch and spread arrivals.
const simNetwork = "latency=100µs jitter=1ms redis_latency=100µs redis_jitter=1ms"

// simSeeds are the seeds the simulator averages over where a case agrees:
// a loop that turns on the order of a few arrivals (HAProxy's lagging
// count) lands a few points apart from seed to seed (91.9% to 96.4% in
// seeds 1 to 20 of HAProxy at half pace's rate), and the real run is held
// to the mean, not to one corner of that spread.
const simSeeds = 10

// fidelityCases are the cases of docs/testing.md's fidelity table.
var fidelityCases = []fidelityCase{
	{sim: "upstream=strict rate=150 burst=5 procs=4 workers=4 duration=8s", agrees: true, served: 0.98, refused: 0.003},
	{sim: "upstream=strict rate=150 burst=10 procs=4 workers=4 duration=8s", agrees: true, served: 0.98, refused: 0.003},
	// Where nothing steered, 37% refused; measured 52.9% to 78.0%.
	{sim: "upstream=strict rate=150 burst=1 procs=4 workers=4 duration=8s", served: 0.40, refused: 0.02},
	{sim: "upstream=nginx rate=200 burst=10 procs=4 workers=4 duration=8s", upstream: nginx, agrees: true, served: 0.97, refused: 0.002},
	// A burst of 1: what is served is what the machine's jitter leaves
	// (98.6% to 99.9% idle, 87.7% once; 75.1% to 97.7% beside a CPU hog,
	// 84.3% once): the refusals alone are bounded here.
	{sim: "upstream=nginx rate=200 burst=1 procs=4 workers=4 duration=8s", upstream: nginx, refused: 0.005},
	{sim: "upstream=nginx rate=200 burst=10 limit='400/s burst 10' procs=4 workers=4 duration=8s", upstream: nginx, agrees: true, served: 0.93, refused: 0.03},
	// 5 refused in the first second, 0.7% to 1.5% after it (2.0% to 2.7%
	// in all); 10 or 11 in the first second while a smaller cut kept a
	// second of the queue at the old rate. While a refusal soon after
	// another near the edge weighed the few requests between them alone,
	// and could cut below the limit, real runs served 86.0% to 99.3%; 95.3%
	// to 99.0% in 7 since it waits for the next (3 beside a CPU hog).
	{sim: "upstream=nginx rate=50 burst=5 limit='100/s burst 5' procs=4 workers=4 duration=8s", upstream: nginx, agrees: true, served: 0.93, refused: 0.03, early: 8},
	{sim: "upstream=haproxy rate=200 procs=4 workers=4 duration=8s", upstream: haproxy, served: 0.93, refused: 0.02, realLimit: "200/s sliding"},
	// HAProxy's count lags: a rate above it is accepted for a while, then
	// refused whole, until a storm of refusals cuts again (1.2% to 2.7%
	// refused in five runs, one beside a CPU hog; 3.3% to 9.3% before).
	{sim: "upstream=haproxy rate=200 limit='400/s burst 10' procs=4 workers=4 duration=8s", upstream: haproxy, agrees: true, served: 0.90, refused: 0.03},
	// Retry-After on every 429, at exactly the limit: a refusal's hold
	// ends at the rate, evenly, and the turns after a burst resume an
	// interval late (issue 43 measured 3.4% and 6.9% of the quota at
	// bursts 5 and 10: a cycle of holds, each ended by a burst that jitter
	// made early). What is left is the start: the upstream's bucket
	// refills from the first request that reaches it, pace's from the
	// grant, and where the first connections take longer than the interval
	// the turns resume late by (beside CPU hogs, about one run in four), a
	// refusal's hold takes the first second (87.3%; 99.8% in the others,
	// and in the simulator, whose cases here open no connections). At a
	// burst of 1 the loop still cuts too deep (logged).
	{sim: "upstream=strict rate=150 burst=1 retry_after=1 procs=3 workers=5 duration=6s", refused: 1},
	{sim: "upstream=strict rate=150 burst=5 retry_after=1 procs=4 workers=4 duration=8s", served: 0.85, refused: 0.002, early: 5},
	{sim: "upstream=strict rate=150 burst=10 retry_after=1 procs=4 workers=4 duration=8s", served: 0.85, refused: 0.002, early: 5},
	// Twice the upstream's limit: the first refusal opens the rate, the
	// second, after its hold, weighs the burst nginx refilled during it and
	// sets the rate; two holds of the eight seconds (76.4% real, 76.6%
	// simulated, 2 refused; 21.7% before).
	{sim: "upstream=nginx rate=50 burst=5 limit='100/s burst 5' retry_after=1 procs=4 workers=4 duration=8s", upstream: nginx, agrees: true, served: 0.70, refused: 0.02},
	{sim: "upstream=haproxy rate=50 limit='50/s burst 10' retry_after=1 procs=4 workers=4 duration=8s", upstream: haproxy, refused: 1},
}

// nginx starts nginx's limit_req at c's rate and burst (nodelay), saying
// c's Retry-After.
func nginx(t *testing.T, c fleetsim.Case) string {
	return limitertest.NginxWithRetryAfter(t, int(c.Rate), c.Burst, retryAfter(t, c))
}

// haproxy starts HAProxy's stick table at c's rate, saying c's
// Retry-After.
func haproxy(t *testing.T, c fleetsim.Case) string {
	return limitertest.HAProxyWithRetryAfter(t, int(c.Rate), retryAfter(t, c))
}

func retryAfter(t *testing.T, c fleetsim.Case) int {
	if c.RetryAfter == "" {
		return 0
	}
	n, err := strconv.Atoi(c.RetryAfter)
	if err != nil {
		t.Fatalf("retry_after=%s: the real limiters say whole seconds", c.RetryAfter)
	}
	return n
}

// TestFidelity: each case on real processes, and in the simulator (the
// mean of simSeeds seeds where the case agrees, one seed for the others,
// whose simulated figures are logged): where the case agrees, the
// simulated run keeps the loop's bar and the real one is within 5 points
// of it; the others' real runs keep their bars (a run that fails is run
// again: see checkFidelity). The
// simulations run first, all at once: beside a real run, one would be the
// load it measures. The table it logs is docs/testing.md's.
func TestFidelity(t *testing.T) {
	cases := make([]fleetsim.Case, len(fidelityCases))
	for i, fc := range fidelityCases {
		c, err := fleetsim.Parse(fc.sim + " " + simNetwork)
		if err != nil {
			t.Fatal(err)
		}
		cases[i] = c
	}
	sims := make([]simulated, len(fidelityCases))
	t.Run("simulated", func(t *testing.T) {
		for i, fc := range fidelityCases {
			if fc.realLimit != "" {
				continue
			}
			t.Run(fc.sim, func(t *testing.T) {
				t.Parallel()
				sims[i] = simulate(t, cases[i], fc.agrees)
			})
		}
	})
	rows := make([]string, len(fidelityCases))
	t.Run("cases", func(t *testing.T) {
		for i, fc := range fidelityCases {
			t.Run(fc.sim, func(t *testing.T) { rows[i] = checkFidelity(t, fc, cases[i], sims[i]) })
		}
	})
	t.Log("\n| case | real: served, refused of requests | simulated: served, refused |\n|---|---|---|\n" + strings.Join(rows, ""))
}

// checkFidelity runs fc, read as c, on real processes, checks it beside
// its simulated run sim (none for a case not simulated), and returns its
// row of the table. A first real run that fails a check is run again, and
// the checks judge the sum of the two, never the second instead of the
// first: like the simulator's seeds, real runs of a loop that cuts on a
// few refusals land apart (nginx at half pace's rate served 93.6% to
// 99.0% in 22 runs, its second second 40 to 53 as deep as the first cuts
// went; HAProxy matched by a sliding window 93.7% or 96.2%, as its second
// second's refusals cut once or twice), and one run is held to the
// spread's corner.
func checkFidelity(t *testing.T, fc fidelityCase, c fleetsim.Case, sim simulated) string {
	takePlace(t, fc, c)
	if fc.realLimit != "" {
		sim = simulated{util: math.NaN(), refused: math.NaN(), allowed: c.UpstreamAllows()}
	}
	if fc.agrees && sim.util < fc.served {
		t.Errorf("simulated: served %.1f%%, want at least %.0f%%", 100*sim.util, 100*fc.served)
	}
	real, runs := realRun(t, fc, c), 1
	failures := judge(fc, real, runs, sim)
	if len(failures) > 0 {
		t.Logf("the first run: %s; a second run", strings.Join(failures, "; "))
		again := realRun(t, fc, c)
		real.OK, real.TooMany, real.TooManyLate, real.Requests = real.OK+again.OK, real.TooMany+again.TooMany,
			real.TooManyLate+again.TooManyLate, real.Requests+again.Requests
		runs++
		failures = judge(fc, real, runs, sim)
	}
	for _, f := range failures {
		t.Error(f)
	}
	name := fc.sim
	if fc.realLimit != "" {
		name += fmt.Sprintf(" (pace %s: not simulated)", fc.realLimit)
	}
	if runs > 1 {
		name += fmt.Sprintf(" (real: the sum of %d runs)", runs)
	}
	realUtil := float64(real.OK) / (sim.allowed * float64(runs))
	t.Logf("real %.1f%% served, %d refused of %d requests (runs: %d); simulated %.1f%%, %.1f refused", 100*realUtil, real.TooMany, real.Requests, runs, 100*sim.util, sim.refused)
	return fmt.Sprintf("| %s | %.1f%%, %d of %d | %.1f%%, %.1f |\n", name, 100*realUtil, real.TooMany, real.Requests, 100*sim.util, sim.refused)
}

// takePlace waits for the machine to run fc's real fleet: alone where
// what it serves is the machine's jitter (a burst of 1), and where it is
// held within 5 points to a simulator whose network is the idle
// machine's, as the table was measured (beside another fleet, HAProxy at
// half pace's rate served 89.1% where the simulator served 94.4%; 91.7% to
// 95.1% alone); beside one other fleet else.
func takePlace(t *testing.T, fc fidelityCase, c fleetsim.Case) {
	if c.Burst == 1 || fc.agrees {
		pairs.Alone(t)
	} else {
		pairs.Run(t)
	}
}

// judge returns the checks of fc that real, the sum of runs real runs,
// fails beside its simulated runs sim.
func judge(fc fidelityCase, real summary, runs int, sim simulated) []string {
	var failures []string
	realUtil, refusedShare := float64(real.OK)/(sim.allowed*float64(runs)), float64(real.TooMany)/float64(max(real.Requests, 1))
	if early := real.TooMany - real.TooManyLate; fc.early > 0 {
		refusedShare = float64(real.TooManyLate) / float64(max(real.Requests, 1))
		if early > fc.early*runs {
			failures = append(failures, fmt.Sprintf("%d refused in the first second of %d runs, want at most %d a run", early, runs, fc.early))
		}
	}
	if refusedShare > fc.refused {
		failures = append(failures, fmt.Sprintf("real: refused %.1f%%, want at most %.1f%%", 100*refusedShare, 100*fc.refused))
	}
	switch {
	case fc.agrees && math.Abs(realUtil-sim.util) > 0.05:
		failures = append(failures, fmt.Sprintf("the simulator served %.1f%%, the real fleet %.1f%%: more than 5 points apart", 100*sim.util, 100*realUtil))
	case !fc.agrees && realUtil < fc.served:
		failures = append(failures, fmt.Sprintf("real: served %.1f%%, want at least %.0f%%", 100*realUtil, 100*fc.served))
	}
	return failures
}

// simulated is what a case's simulated runs served and refused, on
// average, and what the upstream allowed in each.
type simulated struct{ util, refused, allowed float64 }

// simulate runs c in the simulator with seeds 1 to simSeeds, or seed 1
// alone unless it agrees, and returns the mean of the runs.
func simulate(t *testing.T, c fleetsim.Case, agrees bool) simulated {
	seeds := 1
	if agrees {
		seeds = simSeeds
	}
	var s simulated
	for seed := range seeds {
		c.Seed = uint64(seed + 1)
		r := fleetsim.Run(t, c)
		s.util += r.Utilisation() / float64(seeds)
		s.refused += float64(r.Refused) / float64(seeds)
		s.allowed = r.Allowed
	}
	return s
}

// realRun runs the demo for c on real processes and a real redis-server.
func realRun(t *testing.T, fc fidelityCase, c fleetsim.Case) summary {
	srv := redistest.Start(t)
	limit := cmp.Or(fc.realLimit, c.Limit, fmt.Sprintf("%g/s burst %d", c.Rate, c.Burst))
	args := []string{"-redis", "redis://" + srv.Addr + "/0", "-procs", strconv.Itoa(c.Procs), "-workers", strconv.Itoa(c.Workers),
		"-duration", c.Duration.String(), "-limit", limit}
	if fc.upstream != nil {
		return demo(t, append(args, "-target", fc.upstream(t, c))...)
	}
	args = append(args, "-headers", "", "-slack", strconv.Itoa(c.Slack))
	if c.RetryAfter != "" {
		args = append(args, "-retry-after-each", c.RetryAfter)
	}
	return demo(t, args...)
}
