package fleetsim

import (
	"fmt"
	"strings"
	"testing"
)

// loopCase is a family of runs that a loop of pace's must keep within
// bars: at least served of what both the upstream and pace's limit
// allowed, at least last of the upstream's rate in the run's last second,
// and at most refused of the requests refused after the first second
// (all: in the whole run).
type loopCase struct {
	spec                  string
	served, last, refused float64
	all                   bool
}

// check runs each case of the family, on this machine's loopback as the
// simulator models it, and holds it to the family's bars. Redis's link is
// the upstream's, as on this machine, unless a case says otherwise.
func (lc loopCase) check(t *testing.T, cases ...string) {
	t.Helper()
	for _, spec := range cases {
		full := "latency=100µs jitter=1ms procs=4 workers=4 duration=3s " + lc.spec + " " + spec
		c, err := Parse(full)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(full, "redis_latency=") {
			c.RedisLatency, c.RedisJitter = c.Latency, c.Jitter
		}
		r := Run(t, c)
		counted, when := r.RefusedAfter1s, "after the first second"
		if lc.all {
			counted, when = r.Refused, "in the run"
		}
		refused := float64(counted) / float64(max(r.Served+r.Refused, 1))
		last := float64(r.PerSecond[len(r.PerSecond)-1]) / c.upstreamRate()
		t.Logf("%.3f served, %.3f of the rate in the last second, %d refused (%d after 1 s): %s", r.Utilisation(), last, r.Refused, r.RefusedAfter1s, spec)
		if r.Utilisation() < lc.served || last < lc.last || refused > lc.refused {
			t.Errorf("%s %s: served %.1f%%, %.1f%% of the rate in the last second, refused %.2f%% %s; want %.0f%%, %.0f%% at least, %.1f%% at most\n  replay: go test ./internal/fleetsim -run '^TestSweep$' -count=1 -v -args -case \"%s\"",
				lc.spec, spec, 100*r.Utilisation(), 100*last, 100*refused, when, 100*lc.served, 100*lc.last, 100*lc.refused, c)
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
	t.Parallel()
	bars := func(up string) loopCase { return loopCase{spec: up, served: 0.95, refused: 0.005} }
	bars("upstream=strict retry_after=1").check(t, grid([]int{50, 400}, []int{2, 10})...)
	bars("upstream=strict retry_after=auto").check(t, grid([]int{150}, []int{5, 20})...)
	bars("upstream=nginx retry_after=1").check(t, grid([]int{150}, []int{5})...)
}

// TestRetryAfterAboveTheLimit: pace's limit 1.25 or 2 times an upstream
// that sends Retry-After: 1 with every refusal (issue 43: nginx at 50/s
// under pace at 100/s served 22%). Each refusal holds the fleet for a
// second, so a refusal after a hold weighs the burst the upstream refilled
// during it, and its edge is probed slowly: the first refusal opens the
// rate and the second sets it, two holds of 8 s (74% to 78% measured,
// where 8% to 60% was).
func TestRetryAfterAboveTheLimit(t *testing.T) {
	t.Parallel()
	bars := loopCase{spec: "retry_after=1 duration=8s", served: 0.65, refused: 0.03}
	bars.check(t, "upstream=nginx rate=50 burst=5 limit='100/s burst 5'", "upstream=nginx rate=150 burst=10 limit='187.5/s burst 10'",
		"upstream=strict rate=400 burst=5 limit='800/s burst 5'", "upstream=strict rate=50 burst=10 limit='62.5/s burst 10'")
}

// TestStormAboveHAProxy: pace's limit 1.25 or 2 times HAProxy's
// http_req_rate(1s), which counts the requests it denies: its count lags,
// so a rate above it is accepted for a while, then refused whole. The
// first refusal after a long run weighed little and cut little, and the
// requests asleep in their bookings were each refused in turn (issue 43:
// 91 refused after the first second at 50/s under 100/s, 108 at 200/s
// under 250/s; 66% to 94% served). A storm of them now cuts again: 4 to
// 26 refused after the first second (0.3% to 4.9%), 85% to 95% served.
func TestStormAboveHAProxy(t *testing.T) {
	t.Parallel()
	bars := loopCase{spec: "upstream=haproxy duration=8s", served: 0.84, refused: 0.06}
	bars.check(t, "rate=50 limit='100/s burst 5'", "rate=100 limit='200/s burst 10'", "rate=150 limit='187.5/s burst 5'",
		"rate=200 limit='250/s burst 10'", "rate=400 limit='800/s burst 10'")
}

// TestQueueAfterASmallerCut: pace's limit 1.25 or 2 times an upstream
// that refuses only the excess (nginx's limit_req, a strict bucket),
// saying nothing else. The first refusal after the rate opened weighed
// little and cut little (7.7% at nginx's 50/s under 100/s), and the queue
// booked before that cut, a second of it kept, went on at the old rate:
// every other request refused, 8 in 160 ms, none of them weighed, since
// they were booked before the cut, until one booked after it halved the
// rate. A smaller cut keeps a tenth of a second of the queue now, and the
// rest books anew at the new rate, counted: 15, 11, 16 and 15 refused in
// 8 s (of about 400, 800, 800 and 1,200 requests) before; 11, 9, 14 and
// 10 then, and 9, 9, 14 and 7 since the opening keeps no queue (issue 43:
// 3% at most).
func TestQueueAfterASmallerCut(t *testing.T) {
	t.Parallel()
	loopCase{spec: "duration=8s", served: 0.93, refused: 0.03, all: true}.check(t,
		"upstream=nginx rate=50 burst=5 limit='100/s burst 5'", "upstream=nginx rate=100 burst=5 limit='125/s burst 5'",
		"upstream=strict rate=100 burst=5 limit='200/s burst 5'", "upstream=nginx rate=150 burst=10 limit='187.5/s burst 10'")
}

// TestARefusalAmongFewWaits: pace's limit twice nginx's, which refuses only
// the excess, saying nothing else. The loop settles near the limit, where
// nginx refuses one request in many, in bunches that its burst and the
// jitter of arrivals make: a refusal 4 requests after the last one
// weighed a fifth, and cut below the limit (56% of pace's rate to 45%),
// whose slow probe then took seconds: nginx 50/s under 100/s, seeds 1 to
// 20, 91.1% to 99.0% (9 below 93%); 25/s under 50/s, seeds 1 to 10, 93.7%
// to 98.1%. Near the edge, a refusal among fewer than 8 requests gone
// since the last one weighed (alone, it would cut an eighth or more) is
// weighed with the next now: 97.0% to 99.3%, and 97.1% to 98.5%.
func TestARefusalAmongFewWaits(t *testing.T) {
	t.Parallel()
	var cases []string
	for seed := range 10 {
		cases = append(cases, fmt.Sprintf("upstream=nginx rate=50 burst=5 limit='100/s burst 5' seed=%d", seed+1),
			fmt.Sprintf("upstream=nginx rate=25 burst=5 limit='50/s burst 5' seed=%d", seed+1))
	}
	loopCase{spec: "duration=8s", served: 0.96, refused: 0.03}.check(t, cases...)
}

// TestSmallBucketInTheBody: a bucket stated in the body (Shopify's
// dialect) that restores more than its size a second, pace's limit twice
// its rate: the readings steer the fleet to it. usage.Shopify took such a
// bucket for garbage (a restore rate above the maximum), nothing steered,
// and half the requests were THROTTLED (600 of about 1,600 after the
// first second).
func TestSmallBucketInTheBody(t *testing.T) {
	t.Parallel()
	loopCase{spec: "upstream=strict body=shopify duration=4s", served: 0.9, refused: 0.01}.check(t,
		"rate=200 burst=10 limit='400/s burst 10'", "rate=400 burst=20 limit='800/s burst 20'")
}

// TestCountersOfABucket: a token bucket that states its counters in
// GitHub's or the IETF draft's fields, as API gateways do: its burst as the
// limit, the time until it is full as the reset, in whole seconds. pace
// read each as a window: units left spread over the second, and none left
// held the fleet until the reset, where the bucket refills in milliseconds
// (4% to 47% served in 4 s). A reset a second away or less (two against
// the Date) is read as a level alone now: 97.7% to 99.4%.
func TestCountersOfABucket(t *testing.T) {
	t.Parallel()
	loopCase{spec: "duration=4s", served: 0.95, refused: 0.005}.check(t,
		"upstream=strict counters=ietf rate=150 burst=10", "upstream=nginx counters=github rate=400 burst=10",
		"upstream=nginx counters=ietf rate=50 burst=5", "upstream=strict counters=github rate=50 burst=20")
}

// TestRefillsWhileTheResponseTravels: a quota that refills, stated in
// OpenAI's fields, in Shopify's body, or as API gateways state a bucket in
// GitHub's or the IETF draft's (its size as the limit, its time until full
// as the reset, in whole seconds), over links of 5 ms with 10 to 30 ms of
// jitter. A reading is as old as the response's way back: the upstream
// refilled meanwhile, and the units booked since are taken off what it
// said. Read as the level now, each reading held the fleet back by what a
// round trip refills (35.6% to 71.9% served in 3 s). The fleet's share of
// those refills counts now: 86.7% to 96.6%, 1 refused after the first
// second in the 10 runs.
func TestRefillsWhileTheResponseTravels(t *testing.T) {
	t.Parallel()
	loopCase{spec: "latency=5ms", served: 0.85, refused: 0.005}.check(t,
		"upstream=strict rate=200 burst=5 counters=openai jitter=10ms", "upstream=nginx rate=200 burst=5 counters=openai jitter=10ms",
		"upstream=strict rate=50 burst=5 counters=openai jitter=30ms", "upstream=nginx rate=50 burst=5 counters=openai jitter=30ms",
		"upstream=nginx rate=400 burst=10 counters=openai jitter=10ms", "upstream=strict rate=200 burst=10 body=shopify jitter=10ms",
		"upstream=strict rate=100 burst=10 body=shopify jitter=30ms", "upstream=strict rate=100 burst=10 counters=github jitter=30ms",
		"upstream=strict rate=400 burst=10 counters=ietf jitter=10ms", "upstream=strict rate=400 burst=20 counters=github jitter=10ms")
}

// TestRoundedWindows: windows and HAProxy's sliding window, stating their
// counters so, lose nothing to it. A window of a second says its reset is
// a second away in every reading: spread over that second, its units left
// went at half their pace (53% to 64% served in 4 s before; 92% to 100%
// now). Under pace at twice a window's rate, the window runs dry halfway,
// and its refusals, which hold nothing now, steer the rate: 3 to 6 of them
// in the last quarter of each window (4.0% after the first second, where
// it was 3.3% while the simulator's processes took every Unix time
// against the upstream's Date, a second coarse, as no client whose clock
// agrees does).
func TestRoundedWindows(t *testing.T) {
	t.Parallel()
	loopCase{spec: "duration=4s", served: 0.9, refused: 0.045}.check(t,
		"upstream=window counters=ietf rate=50", "upstream=window counters=github rate=100 limit='200/s burst 10'",
		"upstream=haproxy counters=ietf rate=100")
}

// TestWholeSecondResets: a window's reset said in whole seconds is rounded
// up, by a second at most (two against the Date, itself up to a second
// late): spread until the reset said, the units of that time were never
// sent (85.6% to 93.2% served of windows of 10 s in 6 s). They are spread
// until the earliest the reset may come now: 97.9% to 99.2%, no refusal.
func TestWholeSecondResets(t *testing.T) {
	t.Parallel()
	loopCase{spec: "window=10s duration=6s", served: 0.95, refused: 0.005}.check(t,
		"upstream=github counters=github rate=400 burst=10", "upstream=github counters=github rate=150 burst=5 procs=8 workers=2",
		"upstream=window counters=ietf rate=400 burst=10", "upstream=window counters=github rate=200 burst=10")
}

// TestWindowsInOpenAIFields: a window, or HAProxy's sliding one, stated in
// OpenAI's fields (as Azure's are), whose reset is the time until the
// quota is full: read as a quota that refills, it refilled nothing until
// its reset, others seemed to spend it all, and the fleet slowed to a
// tenth of the rate (22.3% to 40.0% served in 4 s). Two readings in a row
// whose moment of being full stays put while units are spent tell a
// window (a token bucket's moves later unless units come back): read as
// one (a level alone where no reading said more than a second), 95.8% to
// 99.9% served at the window's rate, 89.5% at twice it.
func TestWindowsInOpenAIFields(t *testing.T) {
	t.Parallel()
	loopCase{spec: "counters=openai duration=4s", served: 0.95, refused: 0.005}.check(t,
		"upstream=window rate=100 burst=10", "upstream=haproxy rate=100 burst=10", "upstream=window rate=400 burst=5 window=2s")
	loopCase{spec: "counters=openai duration=4s", served: 0.85, refused: 0.03}.check(t,
		"upstream=window rate=200 burst=4 limit='400/s burst 4'")
}

// TestThrottledAboveTheBucket: Shopify's bucket stated in the body, under
// pace at 1.5 to 2 times its restore rate (with counters in the headers
// too, or 64 workers). A THROTTLED answer was taken for a refusal its
// reading explains: the reading set the bucket's level, which pace's limit
// refilled too fast, and the fleet was THROTTLED again at each refill (58
// to 516 refused after the first second). It steers the rate now: none to
// 5 after the first second, 87% to 98% served.
func TestThrottledAboveTheBucket(t *testing.T) {
	t.Parallel()
	loopCase{spec: "upstream=strict body=shopify duration=4s", served: 0.85, refused: 0.015}.check(t,
		"counters=ietf rate=400 burst=20 limit='800/s burst 20'", "rate=200 burst=10 limit='400/s burst 10' procs=16 workers=4",
		"counters=github rate=100 burst=10 limit='150/s burst 10'", "rate=50 burst=20 limit='100/s burst 20'")
}

// TestWindowsInUnixTimes: a window whose reset is a Unix time in whole
// seconds (GitHub's fields), rounded up to the upstream's next second,
// resets up to a second before it says. Spread until the reset said, and
// held there once empty, windows of 2 s lost the rounding's second of each
// two (66.7% served, a refusal after the first second), and windows of a
// second 66.7% to 99.2% (66.7% 4 x 1 with no latency, the window turning
// just past the upstream's second). Every response of a window was counted
// in it: it resets no later than its length after the first of them
// arrived (steer.Phases): 98.2% to 100% served, none refused.
func TestWindowsInUnixTimes(t *testing.T) {
	t.Parallel()
	loopCase{spec: "upstream=github counters=github", served: 0.95, refused: 0.005}.check(t,
		"window=1s rate=100 burst=18 procs=4 workers=1 latency=0s jitter=0s", "window=1s rate=50 burst=10",
		"window=1s rate=200 burst=5 procs=8 workers=2", "window=1s rate=100 burst=10 limit='80/s burst 10'",
		"window=2s rate=100 burst=10 duration=6s", "window=2s rate=400 burst=10 procs=8 workers=2 duration=6s")
}

// TestBucketsInUnixTimes: a token bucket whose burst is more than a
// second of its rate, stating its size as the limit and the Unix time it
// is full as the reset (GitHub's fields, as API gateways state a bucket).
// Read as a window, its units were spread until it was full, and once
// none was left the fleet was held until then: 62.5% to 79.7% served in 4
// s. Its reset moves later while the units are spent and none come back,
// which no window's does: read as a level alone, 96.4% to 98.7%, none
// refused after the first second.
func TestBucketsInUnixTimes(t *testing.T) {
	t.Parallel()
	loopCase{spec: "counters=github duration=4s", served: 0.95, refused: 0.005}.check(t,
		"upstream=strict rate=10 burst=16", "upstream=strict rate=20 burst=30", "upstream=strict rate=50 burst=80",
		"upstream=strict rate=5 burst=12", "upstream=nginx rate=10 burst=20", "upstream=nginx rate=50 burst=100")
}

// TestDeepFleetAfterAWake: many workers at a slow limit, whose requests
// wait in a queue seconds deep when a refusal opens the key's rate or cuts
// it. The sleepers woke and booked anew, each behind its own old booking,
// which stayed in the key's bucket (kept as a gap, or by a steered
// bucket): the fleet sent nothing for as long as the queue was (issue 43's
// sweep: 26% to 33% served in these runs). A wake now keeps a second of
// the queue, or the burst's refill if longer, as its brake, and a smaller
// cut retimes the queue beyond it: 60% to 90%, one or two refusals after
// the first second of 50 to 100 requests.
func TestDeepFleetAfterAWake(t *testing.T) {
	t.Parallel()
	loopCase{spec: "procs=16 workers=3 rate=20", served: 0.55, refused: 0.05}.check(t,
		"upstream=haproxy burst=9 counters=ietf latency=1ms jitter=1ms",
		"upstream=window burst=13 window=2s retry_after=auto counters=github duration=5s latency=1ms jitter=30ms",
		"upstream=haproxy burst=16 limit='10/s burst 16' counters=github workers=4 duration=6s latency=200µs jitter=10ms")
}

// TestOpeningLeavesNoQueue: a fleet of 8 x 8 at a strict bucket, pace
// matched, its queue booked far beyond its burst, refused two or three
// times at its start (a client outside the fleet spends the upstream's
// burst in its first 5 ms). The first refusal opens the key's rate and
// cuts nothing, but its sleepers booked anew behind a second of their
// queue, which stayed booked: the fleet sent nothing for as long as the
// queue was beyond the burst (92.3%, 84.1%, 77.3% and 96.3% of the quota
// in 4 s at 200/s, 100/s, 50/s and 400/s; a real fleet of 8 processes
// lost 4 points of 10 s so, refused once 0.37 s into its run). The
// opening keeps twice the burst now (see steer.Kept): 97.0% to 98.6%.
func TestOpeningLeavesNoQueue(t *testing.T) {
	t.Parallel()
	loopCase{spec: "upstream=strict slack=1 procs=8 workers=8 duration=4s", served: 0.96, refused: 0.001}.check(t,
		"rate=200 burst=10 others=1000 others_for=5ms", "rate=100 burst=5 others=500 others_for=5ms",
		"rate=50 burst=5 others=500 others_for=5ms", "rate=400 burst=20 others=2000 others_for=5ms")
}

// TestSlowTurnsAfterABurst: pace's limit slower than 10/s (a window's
// share, or a slow bucket), its burst spent at once in a short run. The
// turns after a burst resume late, lest a burst that reached the upstream
// late make them early; an interval late, a second at most, cost a unit a
// burst (71%, 75% and 92% served in these runs). A tenth of a second
// covers the arrivals' spread: 86%, 88% and 97%.
func TestSlowTurnsAfterABurst(t *testing.T) {
	t.Parallel()
	loopCase{spec: "latency=200µs", served: 0.85, refused: 0.005}.check(t,
		"upstream=window rate=10 burst=2 window=10s retry_after=auto counters=ietf procs=3 workers=3 duration=5s jitter=10ms",
		"upstream=github rate=10 burst=4 window=10s retry_after=auto counters=github procs=1 workers=4 duration=4s jitter=100µs max_hold=1s")
	loopCase{spec: "latency=5ms jitter=0s", served: 0.95, refused: 0.005}.check(t,
		"upstream=window rate=10 burst=6 window=2s limit='5/2s burst 6' procs=2 workers=3 duration=5s")
}

// TestReadingsOfAFasterUpstream: pace's limit below a quota that refills,
// stated in OpenAI's fields or Shopify's body. Between two readings the
// upstream filled up and lost refills, which the estimate of others' rate
// took for their spending: it rose with each reading (to 92/s of the
// fleet's 100/s), the fleet slowed and lost more. And each reading held
// the fleet back by what the upstream refilled beyond pace's rate while
// the response travelled. 26.6%, 82.6%, 24.5% and 39.3% of pace's limit
// served before (none refused); 98.3%, 98.3%, 84.8% and 80.6% now. The last
// two keep a deep queue (4 and 6 requests in flight at a burst of 2): the
// upstream refills faster than pace's rate while it goes too, which is not
// counted (counted, HAProxy's windows stating OpenAI's fields lost up to
// 13 points in the sweep).
func TestReadingsOfAFasterUpstream(t *testing.T) {
	t.Parallel()
	loopCase{spec: "latency=5ms jitter=100µs duration=4s", served: 0.95, refused: 0.005}.check(t,
		"upstream=strict rate=200 burst=2 counters=openai limit='100/s burst 2' procs=4 workers=1",
		"upstream=strict rate=200 burst=3 counters=openai limit='100/s burst 3' procs=4 workers=1",
		"upstream=strict rate=200 burst=10 counters=openai limit='150/s burst 10' procs=2 workers=4",
		"upstream=nginx rate=100 burst=5 counters=openai limit='50/s burst 5' procs=4 workers=2",
		"upstream=strict rate=100 burst=10 body=shopify limit='60/s burst 10' procs=4 workers=4")
	loopCase{spec: "latency=5ms jitter=100µs duration=4s", served: 0.80, refused: 0.005}.check(t,
		"upstream=strict rate=100 burst=2 counters=openai limit='80/s burst 2' procs=2 workers=2",
		"upstream=strict rate=200 burst=2 counters=openai limit='100/s burst 2' procs=2 workers=3 latency=1ms")
}

// TestOthersShareTheQuota: a client outside the fleet spends a quarter or
// half of a strict bucket's rate, all along, and the bucket says what is
// left in OpenAI's fields or Shopify's body: the fleet books at the rate
// less the others' estimated from the readings, so it takes what they
// leave and is refused no more after the first second, nor are they.
// Measured: 98.2% to 99.6% of what the others left, the first second's
// learning included.
func TestOthersShareTheQuota(t *testing.T) {
	t.Parallel()
	bars := loopCase{spec: "upstream=strict burst=10 slack=1 duration=6s", served: 0.9, refused: 0.005}
	bars.check(t, "counters=openai rate=200 others=100", "counters=openai rate=400 others=100",
		"body=shopify rate=200 others=50", "body=shopify rate=400 others=200")
}

// TestOthersStop: a client outside the fleet spends half of a quota that
// refills, stated in OpenAI's fields, for the first 3 s of 6, and stops.
// At the fleet's rate less theirs, the quota reads full whether they spend
// or not, and the estimate of their rate stayed: 2 to 3 s after they
// stopped, the fleet went on at 71%, 62.5% and 59.8% of 100/s, 200/s and
// 400/s. It fades now, a fifth in half a second at most, while readings
// find the quota full: 102%, 101.5% and 83.8%, with at most 0.5% of the
// fleet's requests refused after the first second (see fade in
// lua/sync.lua). TestFleetAfterOthersStop's fleet of 4 x 8 climbs back
// by the fade's bound, the burst in half a second: 87.5% in the last
// second (its real processes: 84.5% to 98.5%); it is refused 0.6% after
// the first second, while others still spend and before their rate is
// learned (TestFleetLeavesTheForeignShare's family, see docs/counters.md).
func TestOthersStop(t *testing.T) {
	t.Parallel()
	const spec = "upstream=strict burst=10 slack=1 counters=openai duration=6s others_for=3s"
	loopCase{spec: spec, last: 0.8, refused: 0.005}.check(t, "rate=100 others=50", "rate=200 others=100", "rate=400 others=200")
	loopCase{spec: spec, last: 0.8, refused: 0.01}.check(t, "rate=200 others=100 workers=8")
}

// TestKillReturnsWithoutABurst: Redis killed for a sixth of an 8 s run
// (1.3 s), 4 x 8 at a strict bucket, pace matched. A returning process
// goes at its outage share's turns, which Redis books as arriving then,
// after a TAT that never saw the outage: with the burst free before them.
// Once a share lifted, its process's bookings took that burst beside the
// others' turns, the upstream refused one and the rate was cut: 97.3% to
// 98.8% of the quota. Its repayment now takes the bucket as spent through
// the fleet's last turns before the process books again (see
// spent_through in lua/repay.lua): 99.4% to 99.7%.
func TestKillReturnsWithoutABurst(t *testing.T) {
	t.Parallel()
	const wan = "latency=1ms jitter=500µs redis_latency=200µs redis_jitter=100µs"
	loopCase{spec: "upstream=strict rate=200 burst=10 workers=8 duration=8s faults=kill", served: 0.99, refused: 0.001}.check(t,
		"seed=5", wan+" seed=1", wan+" seed=3", "rate=400 burst=20 seed=1")
}
