package pace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// modelLimits are a limiter's limits as quota.lua receives them.
func modelLimits(r *Redis) [][3]int64 {
	var limits [][3]int64
	for _, l := range storeLimits(r.limits, time.Now) {
		limits = append(limits, [3]int64{int64(l.Kind), l.Span, int64(l.Count)})
	}
	return limits
}

// modelBuckets are the buckets among limits, whose Redis keys are keys.
func modelBuckets(keys []string, limits [][3]int64) []modelBucket {
	var buckets []modelBucket
	for i, l := range limits {
		if store.Kind(l[0]) == store.Bucket {
			buckets = append(buckets, modelBucket{keys[i], l[1], l[2]})
		}
	}
	return buckets
}

func TestQuotaMatchesModel(t *testing.T) { checkQuotaMatchesModel(t, scriptRedis(t)) }

// int64s converts costs for the model.
func int64s(costs []int) []int64 {
	out := make([]int64, len(costs))
	for i, c := range costs {
		out[i] = int64(c)
	}
	return out
}

// checkQuotaMatchesModel drives quota.lua, refund.lua and settle.lua on a
// real Redis, over quotas of buckets, sliding and fixed windows at once, and
// the Go model with the same random sequence of keys, costs under each limit,
// budgets, refunds, settlements up and down (and again) and pauses: the
// model, fed the TIME each script used, must give the same answer to the
// microsecond every time.
func checkQuotaMatchesModel(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	quotas := []Quota{
		AllOf(PerSecond(2000).WithBurst(3), Window(4, 20*time.Millisecond)),
		AllOf(FixedWindow(5, 30*time.Millisecond), PerSecond(500).WithBurst(2)),
		Window(3, 10*time.Millisecond),
		AllOf(PerSecond(1000).WithBurst(5), Window(6, 15*time.Millisecond), FixedWindow(4, 25*time.Millisecond)),
	}
	var limiters []*Redis
	for _, q := range quotas {
		limiters = append(limiters, mustRedis(t, c, q, WithFleetSize(1), sharedOnly))
	}
	keys := []string{"q0", "q1", "q2", "q3"}
	type booked struct {
		limiter int
		key     string
		b       store.Booking
	}
	var bookings []booked
	model := newQuotaModel()
	rng := rand.New(rand.NewPCG(3, 5))
	counts := map[string]int{}
	var lastNow int64 // the latest Redis TIME seen
	// The sequence runs 3,500 steps, and on until it has exercised every
	// kind of decision as often as least says, up to 20,000: how many
	// syncs apply depends on the timing of the steps (17 in 3,500 steps of
	// a cold make test; 48 to 66 on an idle machine).
	least := map[string]int{"granted": 100, "refused": 100, "refund-tail": 50, "refund-gap": 20, "refund-nothing": 5, "settle-up": 50, "settle-down": 50,
		"sync-applied": 20, "sync-stale": 5, "rate-cut": 20, "rate-unchanged": 10}
	step := 0
	for ; step < 3500 || step < 20000 && !exercised(counts, least); step++ {
		switch op := rng.IntN(26); {
		case op < 11:
			i := rng.IntN(len(keys))
			r, key := limiters[i], keys[i]
			costs := make([]int64, len(r.limits))
			var lc store.LimitCosts
			for j, l := range r.limits {
				costs[j] = int64(rng.IntN(l.burst + 1))
				lc[j] = int(costs[j])
			}
			budget := []time.Duration{MaxDelay, 0, time.Duration(rng.IntN(20_000)) * time.Microsecond}[rng.IntN(3)]
			notBefore := []time.Duration{0, 0, time.Duration(rng.IntN(5_000)) * time.Microsecond}[rng.IntN(3)]
			estimated := store.LimitSet(rng.IntN(1 << len(r.limits)))
			again := rng.IntN(4) == 0
			b, err := storeOf(r).Reserve(ctx, store.Request{Key: key, Costs: lc, Settled: true, Estimated: estimated, Again: again}, budget, notBefore)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			want := model.reserve(key, storeOf(r).Keys(key, false), modelLimits(r), costs, estimated, again, budget.Microseconds(), notBefore.Microseconds(), b.ID, b.Now)
			n := len(r.limits)
			if b.Granted != want.granted || b.Delay.Microseconds() != want.delay || !slices.Equal(b.Finishes[:n], want.finishes) || !slices.Equal(b.Booked[:n], want.booked) ||
				b.Listening != want.listening || b.Recovered != want.recovered {
				t.Fatalf("step %d: reserve(%s, costs %v, budget %v, not before %v) at %d: script granted=%v delay=%v finishes=%v booked=%v listening=%v recovered=%v, model %+v",
					step, key, costs, budget, notBefore, b.Now, b.Granted, b.Delay, b.Finishes[:n], b.Booked[:n], b.Listening, b.Recovered, want)
			}
			lastNow = b.Now
			if b.Recovered {
				counts["rate-recovered"]++
			}
			if b.Granted {
				counts["granted"]++
				bookings = append(bookings, booked{i, key, b})
			} else {
				counts["refused"]++
			}
		case op < 14 && len(bookings) > 0:
			j := len(bookings) - 1 - rng.IntN(min(len(bookings), 6))
			bk := bookings[j]
			bookings = slices.Delete(bookings, j, j+1)
			if bk.b.Due() < lastNow+2000 {
				continue // only a caller still asleep gives back; this one has gone
			}
			r := limiters[bk.limiter]
			results, now, err := storeOf(r).Refund(ctx, bk.key, bk.b)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			n := len(r.limits)
			want := model.refund(storeOf(r).Keys(bk.key, false), modelLimits(r), int64s(bk.b.Costs[:n]), bk.b.ID, bk.b.Due(), bk.b.Finishes[:n], now)
			lastNow = max(lastNow, now)
			if now >= bk.b.Due() {
				// Its caller's time came before the call ran (a loaded
				// cluster): a sliding window's key may have expired since,
				// with its grants, which the model keeps until it trims
				// them (step 419 of a CI run: script [0 0], model [0 1]).
				continue
			}
			if !slices.Equal(results[:n], want) {
				t.Fatalf("step %d: refund(%s) at %d: script %v, model %v", step, bk.key, now, results[:n], want)
			}
			for _, res := range results[:n] {
				counts[[]string{"refund-nothing", "refund-tail", "refund-gap"}[res]]++
			}
		case op < 17 && len(bookings) > 0:
			j := len(bookings) - 1 - rng.IntN(min(len(bookings), 6))
			bk := bookings[j]
			bookings = slices.Delete(bookings, j, j+1)
			r := limiters[bk.limiter]
			n := len(r.limits)
			var actual store.LimitCosts
			for i, l := range r.limits { // below, at or above the estimate, sometimes beyond the burst
				actual[i] = rng.IntN(2*l.burst + 2)
			}
			var now int64
			for again := range 2 { // settling twice changes nothing the second time
				settled, at, err := storeOf(r).Settle(ctx, bk.key, bk.b, actual)
				if err != nil || settled != (again == 0) {
					t.Fatalf("step %d: settle %d of %s: %v, %v", step, again, bk.key, settled, err)
				}
				now = cmp.Or(now, at)
			}
			model.settle(storeOf(r).Keys(bk.key, false), modelLimits(r), int64s(bk.b.Costs[:n]), int64s(actual[:n]), bk.b.Estimated, bk.b.ID, bk.b.Due(), now)
			counts[map[bool]string{true: "settle-up", false: "settle-down"}[actual[0] > bk.b.Costs[0]]]++
		case op < 21 && len(bookings) > 0:
			// Steered buckets give nothing back: only q3's are steered,
			// by the response to one of its latest bookings.
			var q3 []booked
			for _, bk := range bookings {
				if bk.limiter == 3 {
					q3 = append(q3, bk)
				}
			}
			if len(q3) > 0 {
				bk := q3[len(q3)-1-rng.IntN(min(len(q3), 2))]
				counts[strings.TrimSuffix(syncQuota(t, step, limiters[bk.limiter], bk.key, bk.b, model.buckets, rng), "-learned")]++
			}
		case op < 23 && len(bookings) > 0:
			// The upstream refused a recent request without saying why,
			// or, a third of the time, served it: its key's rate takes it.
			bk := bookings[len(bookings)-1-rng.IntN(min(len(bookings), 4))]
			served := rng.IntN(3) == 0
			// A refusal that brought a hold looks back at the hold before.
			before := []int64{0, model.buckets.holds[bk.key], bk.b.Now - rng.Int64N(1_000_000)}[rng.IntN(3)]
			share, now, err := storeOf(limiters[bk.limiter]).Refused(ctx, bk.key, bk.b, served, before, "pace-model-holds")
			if err != nil {
				t.Fatalf("step %d: refused: %v", step, err)
			}
			if want := model.buckets.refused(bk.key, modelBuckets(storeOf(limiters[bk.limiter]).Keys(bk.key, false), modelLimits(limiters[bk.limiter])), bk.b, served, before, now, int64(store.BucketBurst(storeLimits(limiters[bk.limiter].limits, time.Now)))); share != want {
				t.Fatalf("step %d: refused(%s, booked at %d, served %v) at %d: script %d, model %d", step, bk.key, bk.b.Now, served, now, share, want)
			}
			counts[map[bool]string{true: "rate-cut", false: "rate-unchanged"}[share > 0]]++
		default:
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
	}
	t.Logf("%d steps: %v", step, counts)
	for kind, n := range least {
		if counts[kind] < n {
			t.Errorf("only %d %s decisions in %d steps: the sequence did not exercise the scripts", counts[kind], kind, step)
		}
	}
}

// exercised reports whether counts holds each kind of least at least as
// often as least says.
func exercised(counts, least map[string]int) bool {
	for kind, n := range least {
		if counts[kind] < n {
			return false
		}
	}
	return true
}

// syncQuota steers a random bucket of r's quota for key with a random
// reading for the request booked as b, and the model's too, and fails the
// test unless they agree. It returns what became of the reading.
func syncQuota(t *testing.T, step int, r *Redis, key string, b store.Booking, model *bucketModel, rng *rand.Rand) string {
	var buckets []int
	for i, l := range r.limits {
		if l.kind == bucket {
			buckets = append(buckets, i)
		}
	}
	if len(buckets) == 0 {
		return "sync-none"
	}
	i := buckets[rng.IntN(len(buckets))]
	a, burst := r.limits[i].intervalMicros(), int64(r.limits[i].burst)
	st := randomSteering(rng, i, a, burst)
	refused := rng.IntN(4) == 0
	reply, err := storeOf(r).Sync(context.Background(), key, b, []store.Steer{st}, refused, "pace-model-holds")
	if err != nil {
		t.Fatalf("step %d: sync: %v", step, err)
	}
	want := model.sync(key, storeOf(r).Keys(key, false)[i], a, burst, b, i, st, refused, reply.Now)
	if reply.Results[0] != want {
		t.Fatalf("step %d: sync(%s, limit %d, %+v) at %d: script %d, model %d", step, key, i, st, reply.Now, reply.Results[0], want)
	}
	return []string{"sync-stale", "sync-applied", "sync-applied-learned"}[want]
}

func TestQuotaAllOrNothing(t *testing.T) { checkAllOrNothing(t, scriptRedis(t)) }

// checkAllOrNothing: under 20/s and 40 per 10 s (a sliding window) on one
// key, a saturated run gets, over each span t, the tighter of the two:
// 20 + 20t until the window's 40 are spent (after 1 s), then none; and a
// request refused for its deadline leaves both limits as they were (TestFleetAllOf
// runs the same with a fleet).
func checkAllOrNothing(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	r := mustRedis(t, c, AllOf(PerSecond(20), Window(40, 10*time.Second)), WithFleetSize(1))
	from := time.Now()
	end := from.Add(2 * time.Second)
	grants, err := runWorkers(4, end, func(ctx context.Context) error {
		ctx, cancel := context.WithDeadline(ctx, end)
		defer cancel()
		var de *DeadlineError
		err := r.Wait(ctx, "k", 1)
		if errors.As(err, &de) {
			return errRunOver // the window is spent until after the run
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkTighterOf(t, from, grants, 20, 20, 40)

	// A slower bucket for the refusal, so that the 20 grants before it do
	// not leave time to refill a token.
	r = mustRedis(t, c, AllOf(PerMinute(20), Window(40, 10*time.Second)), WithFleetSize(1))
	keys := storeOf(r).Keys("j", false)
	read := func() [2]string {
		t.Helper()
		tat, err := c.Get(ctx, keys[0]).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		window, err := c.ZRangeWithScores(ctx, keys[1], 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return [2]string{tat, fmt.Sprint(window)}
	}
	for range 20 { // the 21st would wait 3 s
		if err := r.Wait(ctx, "j", 1); err != nil {
			t.Fatal(err)
		}
	}
	before := read()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	var de *DeadlineError
	if err := r.Wait(dctx, "j", 1); !errors.As(err, &de) {
		t.Fatalf("Wait under a 20ms deadline: %v, want a refusal", err)
	}
	if after := read(); before != after {
		t.Errorf("a refused request changed the limits:\n before %q\n after  %q", before, after)
	}
}

func TestQuotaKeysExpire(t *testing.T) { checkKeysExpire(t, newTestRedis(t)) }

// checkKeysExpire: an idle key costs no Redis memory: the keys of every kind
// of limit, and of the gaps of a cancelled booking, are gone once their
// limits could not tell the key from a new one.
func checkKeysExpire(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	// Windows of a second: a process stalled for 200 ms beside other work
	// found a window of 200 ms gone before it counted the keys.
	r := mustRedis(t, c, AllOf(PerSecond(20).WithBurst(2), Window(3, time.Second), FixedWindow(3, time.Second)), WithFleetSize(1))
	for range 3 {
		if err := r.Wait(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	keys := storeOf(r).Keys("k", true)
	count := func() int64 {
		n, err := c.Exists(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("%d of the limits' keys exist after three grants, want 3", n)
	}
	start := time.Now()
	for count() > 0 { // a bucket key lives to the end of the second in which it is full
		if time.Since(start) > 5*time.Second {
			t.Fatalf("keys %q still there %v after the last grant", keys, time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("every key gone %v after the last grant", time.Since(start))
}

// TestFleetWindow: 4 processes of 8 goroutines share one key under a
// sliding window of 100 per 2 s, for 6 s, through one real Redis. No window
// of 2 s, wherever it starts, holds more than 100 grants, counted on the
// times Redis booked them for (each between the request's start and the
// process's hearing of its booking, plus the delay booked: a grant counts
// in a window that holds all of that span), not on when they returned,
// which a stalled process bunches (107 in one window so, beside other
// tests); and the fleet uses at least 95% of 100 per 2 s.
func TestFleetWindow(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	const n, per, run = 100, 2 * time.Second, 6 * time.Second
	start := time.Now().Add(time.Second)
	reports, _ := runFleet(t, 4, fleetWorker{
		Addr: c.Options().Addr, Limit: "100/2s sliding", Key: "api.x.com:443", Goroutines: 8,
		Start: start, End: start.Add(run), StopAtEnd: true,
	})
	var dues []span // of each grant: its earliest and latest time booked
	for _, r := range reports {
		for _, q := range r.Requests {
			if q.Err == "" && q.Limiter == "redis" {
				dues = append(dues, span{q.Start.Add(q.Delay), q.Booked.Add(q.Delay)})
			}
		}
	}
	most := 0
	for _, w := range dues {
		in := 0
		for _, d := range dues {
			if !d.from.Before(w.from) && d.to.Before(w.from.Add(per)) {
				in++
			}
		}
		most = max(most, in)
	}
	utilisation := float64(len(dues)) / (n * run.Seconds() / per.Seconds())
	t.Logf("%d grants in %v; the busiest 2 s window held %d; utilisation %.1f%% of %d per %v", len(dues), run, most, 100*utilisation, n, per)
	if most > n {
		t.Errorf("a window of %v held %d grants, more than %d", per, most, n)
	}
	if utilisation < 0.95 {
		t.Errorf("utilisation %.1f%%, want at least 95%%", 100*utilisation)
	}
}

// A span is a time known to lie between from and to.
type span struct{ from, to time.Time }

// TestFleetAllOf: 4 processes of 8 goroutines share one key under 10/s and
// 50 per 10 s (a sliding window) for 6 s: over each span t from the first
// grant they get the tighter of the two, 10 + 10t until the window's 50 are
// spent, 4 s in (4.1 s: the turns after a burst resume an interval late),
// then nothing more.
func TestFleetAllOf(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	start := time.Now().Add(time.Second)
	reports, _ := runFleet(t, 4, fleetWorker{
		Addr: c.Options().Addr, Limit: "10/s", AlsoLimits: []string{"50/10s sliding"}, Key: "api.stripe.com:443",
		Goroutines: 8, Start: start, End: start.Add(6 * time.Second), StopAtEnd: true,
	})
	var grants []time.Time
	for _, r := range reports {
		grants = append(grants, r.grants("redis")...)
	}
	slices.SortFunc(grants, time.Time.Compare)
	checkTighterOf(t, start, grants, 10, 10, 50)
}

// checkTighterOf holds sorted grants, made under a bucket of rate and burst
// and a longer window of n, to the tighter of the two over each span t from
// from, an instant before any was decided (see checkGrants): at most
// min(burst + rate*t, n) + 1, n in all, the last when the bucket reaches n
// (an interval later: the turns after its burst resume late), counted from
// the first grant.
func checkTighterOf(t *testing.T, from time.Time, grants []time.Time, rate float64, burst, n int) {
	t.Helper()
	for i, g := range grants {
		span := g.Sub(from).Seconds()
		if bound := min(float64(burst)+rate*span, float64(n)) + 1; float64(i+1) > bound {
			t.Fatalf("grant %d came %.3fs in, more than min(%d + %v*t, %d) + 1 = %.1f", i+1, span, burst, rate, n, bound)
		}
	}
	last, first := grants[len(grants)-1], grants[0]
	want := time.Duration(float64(n-burst) / rate * float64(time.Second))
	late := time.Duration(float64(time.Second) / rate) // the turns after a burst resume an interval late (lua/common.lua's emptied)
	t.Logf("%d grants, the first %v after the start, the last %v after it", len(grants), first.Sub(from), last.Sub(first))
	if len(grants) != n || last.Sub(from) < want || last.Sub(first) > want+late+200*time.Millisecond {
		t.Errorf("%d grants, the last %v after the first: want exactly the window's %d, the last %v to %v after the first, where the bucket reaches it",
			len(grants), last.Sub(first), n, want, want+late+200*time.Millisecond)
	}
}

// TestFixedWindowWaitsForTheNext: a fixed window that is full books into
// the next one: the wait ends on the window's boundary, by Redis's clock.
func TestFixedWindowWaitsForTheNext(t *testing.T) {
	ctx := context.Background()
	// Hour-long windows, aligned to the hour: the four calls fall in one.
	r := mustRedis(t, newTestRedis(t), FixedWindow(3, time.Hour), WithFleetSize(1))
	var b store.Booking
	for i := range 4 {
		var err error
		if b, err = storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0); err != nil {
			t.Fatal(err)
		}
		if i < 3 && b.Delay != 0 {
			t.Fatalf("grant %d of a fresh window waited %v", i, b.Delay)
		}
	}
	hour := time.Hour.Microseconds()
	if b.Due()%hour != 0 || b.Delay <= 0 || b.Delay > time.Hour || b.Due()/hour != b.Now/hour+1 {
		t.Errorf("the 4th request goes at %d µs after waiting %v: want the start of the next hour", b.Due(), b.Delay)
	}
}

// TestFixedWindowBeyondReach: a fixed window whose windows within reach
// are full (quota.lua searches 64 ahead; a calendar's days or months as
// far as the process listed them, 6 at least) refuses a request as one
// beyond any wait, a *DeadlineError, not an error of the key's data.
func TestFixedWindowBeyondReach(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for _, tc := range []struct {
		q     Quota
		reach int
	}{{FixedWindow(1, time.Hour), 64}, {Daily(1, time.UTC), 6}} {
		r := mustRedis(t, c, tc.q, WithFleetSize(1))
		booked := 0
		for ; booked <= 64; booked++ {
			b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
			if err != nil {
				t.Fatalf("%v: booking %d: %v; want it granted or refused", tc.q, booked+1, err)
			}
			if !b.Granted {
				if b.Delay <= MaxDelay {
					t.Errorf("%v: booking %d refused after %v, want beyond any wait (MaxDelay)", tc.q, booked+1, b.Delay)
				}
				break
			}
		}
		if booked < tc.reach || booked > 64 {
			t.Errorf("%v: %d windows booked ahead before a refusal, want %d to 64", tc.q, booked, tc.reach)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := r.Wait(wctx, "k", 1)
		cancel()
		var late *DeadlineError
		if !errors.As(err, &late) {
			t.Errorf("%v: a Wait with the windows within reach full: %v, want a *DeadlineError", tc.q, err)
		}
	}
}

// TestQuotaHoldAndFallback: a hold stops a key under every kind of limit of
// its quota; and while Redis is away, the quota falls back to one bucket no
// looser than any of its limits.
func TestQuotaHoldAndFallback(t *testing.T) {
	ctx := context.Background()
	r := mustRedis(t, newTestRedis(t), AllOf(PerSecond(1000), Window(100, time.Second), FixedWindow(100, time.Second)), WithFleetSize(1))
	if err := r.Hold(ctx, "k", headers.Hold{For: 200 * time.Millisecond, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Delay < 150*time.Millisecond || b.Delay > 200*time.Millisecond {
		t.Errorf("a request during a 200ms hold waits %v, want the rest of the hold", b.Delay)
	}

	quota := mustRedis(t, newTestRedis(t), AllOf(PerSecond(10), Window(100, time.Minute), PerHour(10000).WithBurst(5),
		FixedWindow(101, time.Minute), Daily(1500, time.UTC), Monthly(1, time.UTC)), WithFleetSize(2))
	fallback := quota.fallbackLimiter(time.Now(), nil)
	want := []Limit{PerSecond(5).WithBurst(5), Per(25, time.Minute).WithBurst(25), Per(5000, time.Hour).WithBurst(2),
		FixedWindow(50, time.Minute), Daily(750, time.UTC), Monthly(1, time.UTC)}
	if !slices.Equal(fallback.limits, want) || !slices.Equal(fallback.names, quota.names) {
		t.Errorf("fallback %v named %q: want half of each limit (a sliding window as n/2 at once and n/2 a window; a fixed or calendar window half its count, 1 at least) %v, named as the quota's %q",
			fallback.limits, fallback.names, want, quota.names)
	}
}

// TestDailyOutageShare: while Redis is away, a process of a fleet of 2
// under Daily(1500) spends its share of the day, 750, at once from the
// outage on (before: a bucket of half the day's rate, shared, and empty at
// the outage's start, let one request go every 4 minutes); the 751st waits
// for tomorrow, in the zone's midnight.
func TestDailyOutageShare(t *testing.T) {
	r := mustRedis(t, newTestRedis(t), Daily(1500, time.UTC), WithFleetSize(2))
	fallback := r.fallbackLimiter(time.Now(), nil)
	book := func() (time.Duration, bool) { // as the outage books (Redis.decideLocally)
		var res bucketsBooked
		_, delay, ok := fallback.reserveOn(target{key: "k"}, &store.LimitCosts{1}, time.Now(), time.Hour, &res, nil)
		return delay, ok
	}
	for i := range 750 {
		if delay, ok := book(); !ok || delay > 0 {
			t.Fatalf("request %d of the share of 750 during an outage: a wait of %v (granted %v), want it at once", i+1, delay, ok)
		}
	}
	_, midnight := Daily(1, time.UTC).Window(time.Now())
	if delay, _ := book(); delay < time.Until(midnight)-time.Second {
		t.Errorf("the 751st during an outage: a wait of %v, want one to midnight (%v)", delay, time.Until(midnight))
	}
}
