package pace

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newTestRedis starts a redis-server for the test and returns a client of it.
func newTestRedis(t testing.TB) *redis.Client {
	t.Helper()
	return redistest.Start(t).Client(t)
}

func mustRedis(t testing.TB, c redis.Scripter, l Quota, opts ...RedisOption) *Redis {
	t.Helper()
	r, err := NewRedis(c, l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestRedisMatchesModel drives the scripts on a real Redis and the Go model
// with the same random sequence of keys, costs, budgets, refunds and pauses.
// The model, fed the TIME each script used, must give the same answer to the
// microsecond every time.
func TestRedisMatchesModel(t *testing.T) { checkMatchesModel(t, newTestRedis(t)) }

func checkMatchesModel(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	limiters := []*Redis{
		mustRedis(t, c, PerSecond(1000).WithBurst(5)), // 1000 µs a token
		mustRedis(t, c, PerSecond(5000).WithBurst(3)), // 200 µs: refills between calls
		mustRedis(t, c, PerSecond(3).WithBurst(2)),    // 333334 µs: rounded up
	}
	keys := []string{"a", "b", "c", "d", "e"}
	limiterOf := func(key string) *Redis { return limiters[int(key[0]-'a')%len(limiters)] }

	type booked struct {
		key string
		b   booking
	}
	var bookings []booked
	model := newBucketModel()
	rng := rand.New(rand.NewPCG(7, 11))
	counts := map[string]int{}
	var lastNow int64
	const steps = 2500
	for step := range steps {
		switch op := rng.IntN(20); {
		case op < 13:
			key := keys[rng.IntN(len(keys))]
			r := limiterOf(key)
			cost := rng.IntN(r.limits[0].burst) + 1
			budget := []time.Duration{MaxDelay, 0, time.Duration(rng.Int64N(5*r.limits[0].intervalMicros())) * time.Microsecond}[rng.IntN(3)]
			notBefore := []time.Duration{0, 0, time.Duration(rng.Int64N(3*r.limits[0].intervalMicros())) * time.Microsecond}[rng.IntN(3)]
			b, err := storeOf(r).reserve(ctx, key, uniform(cost), budget, notBefore, true)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			granted, delay, finish := model.reserve(key, r.limits[0].intervalMicros(), int64(r.limits[0].burst), int64(cost), budget.Microseconds(), notBefore.Microseconds(), b.now)
			if b.granted != granted || b.delay != time.Duration(delay)*time.Microsecond || b.finishes[0] != finish {
				t.Fatalf("step %d: reserve(%s, cost %d, budget %v, not before %v) at %d: script granted=%v delay=%v finish=%d, model granted=%v delay=%dµs finish=%d",
					step, key, cost, budget, notBefore, b.now, b.granted, b.delay, b.finishes[0], granted, delay, finish)
			}
			if b.now < lastNow {
				t.Fatalf("step %d: Redis TIME went back from %d to %d", step, lastNow, b.now)
			}
			lastNow = b.now
			if granted {
				counts["granted"]++
				bookings = append(bookings, booked{key, b})
			} else {
				counts["refused"]++
			}
		case op < 15 && len(bookings) > 0:
			i := len(bookings) - 1 - rng.IntN(min(len(bookings), 6))
			bk := bookings[i]
			bookings = slices.Delete(bookings, i, i+1)
			results, now, err := storeOf(limiterOf(bk.key)).refund(ctx, bk.key, bk.b)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			got, finish := results[0], bk.b.finishes[0]
			if want := model.refund(bk.key, finish, int64(bk.b.costs[0])*limiterOf(bk.key).limits[0].intervalMicros(), now); got != want {
				t.Fatalf("step %d: refund(%s, finish %d) at %d: script %d, model %d", step, bk.key, finish, now, got, want)
			}
			counts[[]string{"refund-nothing", "refund-tail", "refund-gap"}[got]]++
		case op < 17 && len(bookings) > 0:
			i := len(bookings) - 1 - rng.IntN(min(len(bookings), 6))
			bk := bookings[i]
			bookings = slices.Delete(bookings, i, i+1)
			r := limiterOf(bk.key)
			actual := rng.IntN(2*r.limits[0].burst + 2)
			settled, now, err := storeOf(r).settle(ctx, bk.key, bk.b, uniform(actual))
			if err != nil || !settled {
				t.Fatalf("step %d: settle: %v, %v", step, settled, err)
			}
			model.settle(bk.key, r.limits[0].intervalMicros(), int64(actual-bk.b.costs[0]), now)
			counts[map[bool]string{true: "settle-up", false: "settle-down"}[actual > bk.b.costs[0]]]++
		default:
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		}
	}
	t.Logf("%d steps: %v", steps, counts)
	for _, kind := range []string{"granted", "refused", "refund-nothing", "refund-tail", "refund-gap", "settle-up", "settle-down"} {
		if counts[kind] < 20 {
			t.Errorf("only %d %s decisions: the sequence did not exercise the scripts", counts[kind], kind)
		}
	}
}

// TestRedisDeadlineBooksNothing: a wait that would need 500 ms under a 50 ms
// deadline fails at once, says how long it would have been, and books nothing.
func TestRedisDeadlineBooksNothing(t *testing.T) { checkDeadlineBooksNothing(t, newTestRedis(t)) }

func checkDeadlineBooksNothing(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	// 50 ms a token: after 10 bookings, the 11th caller would wait 500 ms.
	r := mustRedis(t, c, PerSecond(20).WithBurst(1))
	for range 10 {
		if _, err := storeOf(r).reserve(ctx, "k", uniform(1), MaxDelay, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	// A limiter's first Wait starts its listener and heartbeat: the measure
	// is of one already running.
	if err := r.Wait(ctx, "warm-up", 1); err != nil {
		t.Fatal(err)
	}
	before, err := storeOf(r).reserve(ctx, "k", uniform(1), 0, 0, false) // a probe: refused, books nothing
	if err != nil || before.granted {
		t.Fatalf("probe: %+v, %v", before, err)
	}

	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = r.Wait(dctx, "k", 1)
	elapsed := time.Since(start)

	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	var de *DeadlineError
	if !errors.As(err, &de) {
		t.Fatalf("Wait: %T %v, want a *DeadlineError", err, err)
	}
	if elapsed >= 5*time.Millisecond {
		t.Errorf("Wait took %v to refuse, want under 5ms", elapsed)
	}
	after, err := storeOf(r).reserve(ctx, "k", uniform(1), 0, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if after.finishes[0] != before.finishes[0] {
		t.Errorf("the next caller would finish at %d, before the refused wait at %d: the refused wait booked %d µs",
			after.finishes[0], before.finishes[0], after.finishes[0]-before.finishes[0])
	}
	if de.Delay > before.delay || de.Delay < after.delay || de.Delay < 490*time.Millisecond {
		t.Errorf("DeadlineError.Delay = %v, want between %v and %v, about 500ms", de.Delay, after.delay, before.delay)
	}
	if de.Budget > 50*time.Millisecond {
		t.Errorf("DeadlineError.Budget = %v, want at most the 50ms deadline", de.Budget)
	}
	t.Logf("refused in %v: %v", elapsed, de)
}

// TestRedisMaxWait: WithMaxWait refuses a longer wait at once, as a deadline
// would, and lets a shorter one through.
func TestRedisMaxWait(t *testing.T) {
	ctx := context.Background()
	// 100 ms a token: the first wait goes at once, the second after 100 ms.
	r := mustRedis(t, newTestRedis(t), PerSecond(10).WithBurst(1), WithMaxWait(150*time.Millisecond))
	for i := range 2 {
		if err := r.Wait(ctx, "k", 1); err != nil {
			t.Fatalf("wait %d: %v", i, err)
		}
	}
	storeOf(r).reserve(ctx, "k", uniform(1), MaxDelay, 0, false) // the next caller would wait about 200 ms
	err := r.Wait(ctx, "k", 1)
	var de *DeadlineError
	if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || de.Budget != 150*time.Millisecond || de.Delay < 150*time.Millisecond {
		t.Fatalf("Wait past the maximum wait: %v, want a *DeadlineError with a budget of 150ms", err)
	}
}

// TestRedisCancelGivesBack: of 10 booked callers, cancelling the last 5 (all
// at once, so their refunds reach Redis in any order) moves the next new
// caller up by exactly 5 tokens.
func TestRedisCancelGivesBack(t *testing.T) { checkCancelGivesBack(t, newTestRedis(t)) }

func checkCancelGivesBack(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	booked := make(chan Event, 16)
	r := mustRedis(t, c, PerSecond(2).WithBurst(1), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait {
			booked <- e
		}
	}))
	if _, err := storeOf(r).reserve(ctx, "k", uniform(1), MaxDelay, 0, false); err != nil { // empty the bucket
		t.Fatal(err)
	}
	var cancels []context.CancelFunc
	errs := make([]error, 10)
	var firstFive, lastFive sync.WaitGroup
	for i := range 10 { // caller i waits (i+1) * 500 ms
		cctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		group := &firstFive
		if i >= 5 {
			group = &lastFive
		}
		group.Go(func() { errs[i] = r.Wait(cctx, "k", 1) })
		select {
		case e := <-booked:
			if want := time.Duration(i+1) * 500 * time.Millisecond; e.Delay > want || e.Delay < want-100*time.Millisecond {
				t.Fatalf("caller %d booked a wait of %v, want about %v", i, e.Delay, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("caller %d was not booked within 5s", i)
		}
	}
	defer func() { // whatever happens, no caller outlives the test
		for _, cancel := range cancels {
			cancel()
		}
		firstFive.Wait()
		lastFive.Wait()
	}()
	before, err := storeOf(r).reserve(ctx, "k", uniform(1), 0, 0, false)
	if err != nil {
		t.Fatal(err)
	}

	for _, cancel := range cancels[5:] {
		go cancel()
	}
	lastFive.Wait() // each Wait returns once its refund is done

	after, err := storeOf(r).reserve(ctx, "k", uniform(1), 0, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if moved, want := before.finishes[0]-after.finishes[0], 5*r.limits[0].intervalMicros(); moved != want {
		t.Errorf("cancelling 5 callers moved the next caller up by %d µs, want %d (5 tokens)", moved, want)
	}
	for i, err := range errs[5:] {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled caller %d: %v, want an error wrapping context.Canceled", i+5, err)
		}
	}
	if n, err := c.Exists(ctx, storeOf(r).bucketKey("k")+":gaps").Result(); err != nil || n != 0 {
		t.Errorf("gaps key left behind after every gap joined the tail: exists=%d, %v", n, err)
	}
	t.Logf("next caller's delay: %v before the cancels, %v after", before.delay, after.delay)
}

// TestRedisSurvivesScriptFlush: SCRIPT FLUSH between two waits changes
// nothing for the caller: go-redis answers NOSCRIPT with EVAL, and the bucket
// carries on from where it was.
func TestRedisSurvivesScriptFlush(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	r := mustRedis(t, c, PerSecond(10).WithBurst(1)) // 100 ms a token
	first, err := storeOf(r).reserve(ctx, "k", uniform(1), MaxDelay, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	second, err := storeOf(r).reserve(ctx, "k", uniform(1), MaxDelay, 0, false)
	if err != nil {
		t.Fatalf("reserve after SCRIPT FLUSH: %v", err)
	}
	if want := first.finishes[0] + r.limits[0].intervalMicros(); second.finishes[0] != want {
		t.Errorf("after SCRIPT FLUSH the booking finished at %d, want %d: the bucket lost its state", second.finishes[0], want)
	}
	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if calls["eval"].Calls != 1 {
		t.Errorf("commandstats %v: want exactly one EVAL, the fallback from NOSCRIPT", calls)
	}
	if err := r.Wait(ctx, "k2", 1); err != nil {
		t.Fatalf("Wait after SCRIPT FLUSH: %v", err)
	}
}

// TestRedisKeyLayout: the bucket lives at prefix{key} as integer
// microseconds, and expires when the bucket is full again.
func TestRedisKeyLayout(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	r := mustRedis(t, c, PerMinute(60).WithBurst(3), WithPrefix("quota:")) // 1 s a token
	b, err := storeOf(r).reserve(ctx, "api.example.com:443", uniform(2), MaxDelay, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	const key = "quota:{api.example.com:443}"
	stored, err := c.Get(ctx, key).Int64()
	if err != nil || stored != b.finishes[0] {
		t.Fatalf("GET %s = %d, %v; want the schedule time %d", key, stored, err, b.finishes[0])
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	full := time.Duration(b.finishes[0]-b.now) * time.Microsecond // 2 s: the bucket is full again then
	if ttl < full-50*time.Millisecond || ttl > full+time.Second {
		t.Errorf("PTTL %s = %v, want from %v, when the bucket is full again, to a second later", key, ttl, full)
	}
}

// storeOf is r's store, for tests that call the scripts directly.
func storeOf(r *Redis) *store { return r.store.(*store) }
