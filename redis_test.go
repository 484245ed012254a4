package pace

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace/internal/redistest"
	"github.com/fleetpace/pace/internal/store"
	"github.com/fleetpace/pace/internal/tiers"
)

// newTestRedis starts a redis-server for the test and returns a client of it.
func newTestRedis(t testing.TB) *redis.Client {
	t.Helper()
	return redistest.Start(t).Client(t)
}

// scriptRedis returns a client of a real redis-server started for the
// test, as newTestRedis does, under make test; under go test alone, of the
// embedded Redis-protocol store the demo runs on (miniredis, whose Lua runs
// the scripts), so that tier 1 checks the scripts' logic against the
// models. Tests of timing, faults and fleets need the real one.
func scriptRedis(t testing.TB) *redis.Client {
	t.Helper()
	if tiers.All() {
		return newTestRedis(t)
	}
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

// sharedOnly is the option of the tests that count what the shared path
// lets go, and of the model checks, which stop at the first error: a call
// timeout that a loaded machine does not reach, so that no slow call is
// taken for an outage (whose fallback's share would come on top of what a
// test counts) or fails a step.
var sharedOnly = WithCallTimeout(time.Second)

func mustRedis(t testing.TB, c redis.Scripter, l Quota, opts ...Option) *Redis {
	t.Helper()
	r, err := NewRedis(c, l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestRedisMatchesModel drives the scripts on a real Redis and the Go model
// with the same random sequence of keys, costs, budgets, refunds,
// settlements and pauses. The model, fed the TIME each script used, must
// give the same answer to the microsecond every time.
func TestRedisMatchesModel(t *testing.T) { checkMatchesModel(t, scriptRedis(t)) }

// checkMatchesModel runs 3,600 steps, and on until each kind of step has come
// 20 times, up to 20,000: how many refunds leave a gap depends on the
// steps' timing (19 in 3,600 steps on a loaded cluster).
func checkMatchesModel(t *testing.T, c redis.UniversalClient) {
	m := newModelCheck(t, c, 7)
	kinds := []string{"granted", "refused", "refund-nothing", "refund-tail", "refund-gap", "settle-up", "settle-down", "line-first", "line-behind"}
	for step := 0; step < 3600 || step < 20000 && !m.exercised(kinds); step++ {
		switch op := m.rng.IntN(21); {
		case op == 20:
			m.line(step)
		case op < 13:
			m.reserve(step)
		case op < 15:
			m.refund(step)
		case op < 17:
			m.settle(step)
		default:
			time.Sleep(time.Duration(m.rng.IntN(2000)) * time.Microsecond)
		}
	}
	m.requireEach(kinds...)
}

// modelCheck drives the scripts of single buckets on a real Redis, and the
// Go model, step by step, and fails at the first answer they differ on.
type modelCheck struct {
	t        *testing.T
	client   redis.UniversalClient
	limiters []*Redis // by key: "a" the first, "b" the second...
	keys     []string
	model    *bucketModel
	rng      *rand.Rand
	bookings []modelBooking // granted, and neither given back nor settled
	holdEnds map[string]int64
	counts   map[string]int
	lastNow  int64            // the latest Redis TIME seen
	lines    map[string]int64 // key → when its line of deferred requests ends (lua/line.lua)
}

type modelBooking struct {
	key string
	b   store.Booking
}

func newModelCheck(t *testing.T, c redis.UniversalClient, seed uint64) *modelCheck {
	return &modelCheck{t: t, client: c, keys: []string{"a", "b", "c", "d", "e", "f"}, model: newBucketModel(),
		rng: rand.New(rand.NewPCG(seed, 11)), counts: map[string]int{}, holdEnds: map[string]int64{}, lines: map[string]int64{},
		limiters: []*Redis{
			mustRedis(t, c, PerSecond(1000).WithBurst(5), sharedOnly), // 1000 µs a token
			mustRedis(t, c, PerSecond(5000).WithBurst(3), sharedOnly), // 200 µs: refills between calls
			mustRedis(t, c, PerSecond(3).WithBurst(2), sharedOnly),    // 333334 µs: rounded up
		}}
}

// limiterOf returns the limiter of key, and its limit's interval and burst.
func (m *modelCheck) limiterOf(key string) (*Redis, int64, int64) {
	r := m.limiters[int(key[0]-'a')%len(m.limiters)]
	return r, r.limits[0].intervalMicros(), int64(r.limits[0].burst)
}

// now notes a Redis TIME, which never goes back.
func (m *modelCheck) now(step int, now int64) int64 {
	if now < m.lastNow {
		m.t.Fatalf("step %d: Redis TIME went back from %d to %d", step, m.lastNow, now)
	}
	m.lastNow = now
	return now
}

// sameState fails the test unless each steered key's bucket in Redis is the
// model's, field by field: a divergence that no reply shows yet. A CEILING
// at or before the latest TIME seen holds nothing back, wherever it is.
func (m *modelCheck) sameState(step int) {
	for _, key := range m.keys {
		s := m.model.steers[key]
		if s == nil {
			continue
		}
		stored, err := m.client.Get(context.Background(), DefaultPrefix+"{"+key+"}").Result()
		if err != nil {
			m.t.Fatalf("step %d: reading %s: %v", step, key, err)
		}
		fields := strings.Fields(stored)
		if len(fields) == store.SteeredFields {
			ceiling, _ := strconv.ParseInt(fields[11], 10, 64)
			fields[11] = strconv.FormatInt(max(ceiling, m.lastNow), 10)
		}
		want := fmt.Sprint(m.model.tat[key], s.seen, s.till, s.spread, s.learned, s.left, s.base, s.synced, s.booked, s.foreign, s.order, max(s.ceiling, m.lastNow))
		if got := strings.Join(fields, " "); got != want {
			m.t.Fatalf("step %d: key %s's bucket in Redis is %q, in the model %q", step, key, got, want)
		}
	}
}

// recent takes one of the latest bookings out of the list, if any.
func (m *modelCheck) recent() (modelBooking, bool) {
	if len(m.bookings) == 0 {
		return modelBooking{}, false
	}
	i := len(m.bookings) - 1 - m.rng.IntN(min(len(m.bookings), 6))
	bk := m.bookings[i]
	m.bookings = slices.Delete(m.bookings, i, i+1)
	return bk, true
}

// reserve books a random key at a random cost, an estimate half the time,
// with a random budget and time not before.
func (m *modelCheck) reserve(step int) {
	key := m.keys[m.rng.IntN(len(m.keys))]
	_, a, burst := m.limiterOf(key)
	cost := m.rng.Int64N(burst) + 1
	budget := []time.Duration{MaxDelay, 0, time.Duration(m.rng.Int64N(5*a)) * time.Microsecond}[m.rng.IntN(3)]
	notBefore := []time.Duration{0, 0, time.Duration(m.rng.Int64N(3*a)) * time.Microsecond}[m.rng.IntN(3)]
	q := store.Request{Key: key, Costs: uniform(int(cost), store.MaxLimits), Settled: true}
	if m.rng.IntN(2) == 0 {
		q.Estimated = 1
	}
	q.Again = m.rng.IntN(4) == 0
	m.reserveWith(step, q, budget, notBefore)
}

func (m *modelCheck) reserveWith(step int, q store.Request, budget, notBefore time.Duration) {
	key, cost := q.Key, int64(q.Costs[0])
	r, a, burst := m.limiterOf(key)
	b, err := storeOf(r).Reserve(context.Background(), q, budget, notBefore)
	if err != nil {
		m.t.Fatalf("step %d: %v", step, err)
	}
	now := m.now(step, b.Now)
	steer := m.model.steers[key]
	want := m.model.reserve(key, a, burst, cost, budget.Microseconds(), notBefore.Microseconds(), now, has(q.Estimated, 0), q.Again)
	if b.Granted != want.Granted || b.Delay != want.Delay || b.Finishes[0] != want.Finishes[0] || b.Booked[0] != want.Booked[0] ||
		b.Listening != want.Listening || b.Recovered != want.Recovered {
		m.t.Fatalf("step %d: reserve(%s, cost %d, budget %v, not before %v) at %d: script granted=%v delay=%v finish=%d booked=%d listening=%v recovered=%v, model %v %v %d %d %v %v",
			step, key, cost, budget, notBefore, now, b.Granted, b.Delay, b.Finishes[0], b.Booked[0], b.Listening, b.Recovered,
			want.Granted, want.Delay, want.Finishes[0], want.Booked[0], want.Listening, want.Recovered)
	}
	if b.Recovered {
		m.counts["rate-recovered"]++
	}
	if !b.Granted {
		m.counts["refused"]++
		return
	}
	m.counts["granted"]++
	m.bookings = append(m.bookings, modelBooking{key, b})
	switch {
	case steer != nil && steer.till > now && steer.spread > 0:
		m.counts["granted-spread"]++
	case steer != nil && steer.till > now:
		m.counts["granted-held"]++
	case steer != nil:
		m.counts["granted-steered"]++
	}
}

func (m *modelCheck) refund(step int) {
	bk, ok := m.recent()
	if !ok {
		return
	}
	r, a, _ := m.limiterOf(bk.key)
	results, now, err := storeOf(r).Refund(context.Background(), bk.key, bk.b)
	if err != nil {
		m.t.Fatalf("step %d: %v", step, err)
	}
	got, finish := results[0], bk.b.Finishes[0]
	if want := m.model.refund(bk.key, finish, int64(bk.b.Costs[0])*a, m.now(step, now)); got != want {
		m.t.Fatalf("step %d: refund(%s, finish %d) at %d: script %d, model %d", step, bk.key, finish, now, got, want)
	}
	m.counts[[]string{"refund-nothing", "refund-tail", "refund-gap"}[got]]++
}

// line puts two requests its class deferred in a key's line, each as one
// whose wait comes within its horizon from 0 to 5 intervals from now, and
// whose turn takes 1 to 3 intervals. The line is lua/line.lua; a class's
// deferral is a refusal (a reserve whose budget is the horizon), which
// reserve covers: the rate bound over all classes is the bucket's.
func (m *modelCheck) line(step int) {
	key := m.keys[m.rng.IntN(len(m.keys))]
	for range 2 {
		m.lineOne(step, key)
	}
}

func (m *modelCheck) lineOne(step int, key string) {
	r, a, _ := m.limiterOf(key)
	earliest, turn := m.rng.Int64N(5*a), (m.rng.Int64N(3)+1)*a
	now, got, err := storeOf(r).LineAt(context.Background(), key, store.Microseconds(earliest), store.Microseconds(turn))
	if err != nil {
		m.t.Fatalf("step %d: line: %v", step, err)
	}
	now = m.now(step, now)
	want := max(now+earliest, m.lines[key]) - now
	if got != store.Microseconds(want) {
		m.t.Fatalf("step %d: line(%s, earliest %d, turn %d) at %d: script %v, model %dµs", step, key, earliest, turn, now, got, want)
	}
	m.counts[map[bool]string{true: "line-first", false: "line-behind"}[want == earliest]]++
	m.lines[key] = now + want + turn
}

func (m *modelCheck) settle(step int) {
	bk, ok := m.recent()
	if !ok {
		return
	}
	r, a, burst := m.limiterOf(bk.key)
	actual := m.rng.Int64N(2*burst + 2)
	settled, now, err := storeOf(r).Settle(context.Background(), bk.key, bk.b, uniform(int(actual), store.MaxLimits))
	if err != nil || !settled {
		m.t.Fatalf("step %d: settle: %v, %v", step, settled, err)
	}
	m.model.settle(bk.key, a, burst, actual-int64(bk.b.Costs[0]), actual-known(has(bk.b.Estimated, 0), int64(bk.b.Costs[0])), m.now(step, now))
	m.counts[map[bool]string{true: "settle-up", false: "settle-down"}[actual > int64(bk.b.Costs[0])]]++
}

// sync steers the key of a recent booking (half the time the latest) with
// a random reading (see randomSteering), of a request the upstream served
// or, a quarter of the time, refused. The booking stays in the list, so
// that a later reading may come for an older request.
func (m *modelCheck) sync(step int) {
	if len(m.bookings) == 0 {
		return
	}
	bk := m.bookings[len(m.bookings)-1]
	if m.rng.IntN(2) == 0 {
		bk, _ = m.recent()
		m.bookings = append(m.bookings, bk)
	}
	r, a, burst := m.limiterOf(bk.key)
	m.syncOne(step, r, a, burst, bk, randomSteering(m.rng, 0, a, burst), m.rng.IntN(4) == 0)
}

// syncOne steers the key of booking bk, on r (a limit of interval a and
// burst), with st, for a request the upstream served or refused.
func (m *modelCheck) syncOne(step int, r *Redis, a, burst int64, bk modelBooking, st store.Steer, refused bool) {
	reply, err := storeOf(r).Sync(context.Background(), bk.key, bk.b, []store.Steer{st}, refused, "pace-model-holds")
	if err != nil {
		m.t.Fatalf("step %d: sync: %v", step, err)
	}
	want := m.model.sync(bk.key, bk.key, a, burst, bk.b, 0, st, refused, m.now(step, reply.Now))
	var synced int64
	if s := m.model.steers[bk.key]; s != nil {
		synced = s.synced
	}
	if reply.Results[0] != want || reply.Synced[0] != synced {
		m.t.Fatalf("step %d: sync(%s, %+v) at %d: script %d (synced %d), model %d (synced %d)", step, bk.key, st, reply.Now, reply.Results[0], reply.Synced[0], want, synced)
	}
	m.counts[[]string{"sync-stale", "sync-applied", "sync-learned"}[want]]++
	if s := m.model.steers[bk.key]; s != nil && s.faded {
		m.counts["sync-faded"]++
	}
	if s := m.model.steers[bk.key]; s != nil && s.foreign != 0 {
		m.counts["sync-foreign"]++
		if want > 0 && s.probing {
			m.counts["sync-probe"]++
		}
	}
}

// randomSteering is a random reading for limit i of interval a and burst b:
// of a quota that refills, of a window, a level alone (a reset said in
// whole seconds, a second away or less) or a bucket's level alone (it
// refills too), with none, few or many
// units left, resetting within 60 intervals (or, a quarter of the time,
// one: a quota faster than the fleet; or 600: a window others spend in
// full while the fleet probes it) and
// perhaps sooner (by none, a third, or all of that time), with or without
// a limit to learn, and stating its size or not (a quota that was full
// when the request came, or one that lacks a few units).
func randomSteering(rng *rand.Rand, i int, a, b int64) store.Steer {
	left := []int64{0, rng.Int64N(b + 1), rng.Int64N(3 * b)}[rng.IntN(3)]
	kind := rng.IntN(4) // a quota that refills, a window, a level alone, a bucket's level alone
	reset := time.Duration(rng.Int64N([]int64{1, 60, 60, 600}[rng.IntN(4)]*a)+1) * time.Microsecond
	return store.Steer{Limit: i, Remaining: left, Refills: kind == 0 || kind == 3, Rounded: kind >= 2, Reset: reset,
		Early: []time.Duration{0, reset / 3, reset}[rng.IntN(3)], Learned: []int64{0, 0, a / 2, 2 * a}[rng.IntN(4)],
		Size: []int64{0, left + 1, left + 1 + rng.Int64N(b+1)}[rng.IntN(3)]}
}

// refusal tells the key of a recent booking of key f (whose rate after
// refusals then interleaves with everything else, while the other keys'
// grants are not cut to nothing) that the upstream refused its request
// without saying why, or, a third of the time, served it: the key's rate
// takes it, in the script and the model. The booking stays in the list.
func (m *modelCheck) refusal(step int) {
	for i := len(m.bookings) - 1; i >= max(len(m.bookings)-8, 0); i-- {
		if bk := m.bookings[i]; bk.key == "f" {
			m.refusalOf(step, bk, m.rng.IntN(3) == 0)
			return
		}
	}
}

// refusalOf tells the key of booking bk that the upstream refused its
// request, or served it.
func (m *modelCheck) refusalOf(step int, bk modelBooking, served bool) {
	// A refusal that brought a hold looks back at the hold before.
	m.refusalAfter(step, bk, served, []int64{0, m.holdEnds[bk.key], bk.b.Now - m.rng.Int64N(1_000_000)}[m.rng.IntN(3)])
}

// refusalAfter is refusalOf, for a refusal whose hold came after the one
// that ended at before (0: it brought none).
func (m *modelCheck) refusalAfter(step int, bk modelBooking, served bool, before int64) {
	r, a, burst := m.limiterOf(bk.key)
	trimmed := m.model.trimmed
	share, now, err := storeOf(r).Refused(context.Background(), bk.key, bk.b, served, before, "pace-model-holds")
	if err != nil {
		m.t.Fatalf("step %d: refused: %v", step, err)
	}
	if want := m.model.refused(bk.key, []modelBucket{{bk.key, a, burst}}, bk.b, served, before, m.now(step, now), int64(store.BucketBurst(storeLimits(r.limits, time.Now)))); share != want {
		m.t.Fatalf("step %d: refused(%s, booked at %d, served %v) at %d: script %d, model %d", step, bk.key, bk.b.Now, served, now, share, want)
	}
	if m.model.trimmed > trimmed {
		m.counts["rate-trimmed"]++
	}
	switch {
	case served:
		m.counts["rate-served"]++
	case share > 0:
		m.counts["rate-cut"]++
	default:
		m.counts["rate-unchanged"]++
	}
}

// recover opens the rate of a key of its own with one refusal, which cuts
// nothing, and books on it until its rate, quiet for 5 s with no other
// refusal, is dropped, for 3 s more at most.
func (m *modelCheck) recover(step int) {
	const key = "z"
	m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
	m.refusalOf(step, m.bookings[len(m.bookings)-1], false)
	time.Sleep(5 * time.Second)
	for deadline := time.Now().Add(3 * time.Second); m.counts["rate-recovered"] == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
	}
}

// storm opens the rate of a key of its own, cuts it a little with a
// refusal after 20 requests gone, and then refuses two requests booked
// before that cut: the second storms (see internal/steer's Rate.storm), in the
// script as in the model.
func (m *modelCheck) storm(step int) {
	const key = "st"
	book := func() modelBooking {
		m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
		return m.bookings[len(m.bookings)-1]
	}
	m.refusalAfter(step, book(), false, 0) // opens the rate
	var early []modelBooking
	for range 20 {
		early = append(early, book())
	}
	_, a, _ := m.limiterOf(key)
	time.Sleep(time.Duration(30*a) * time.Microsecond) // until the 20 are gone from the rate's schedule
	m.refusalAfter(step, book(), false, 0)             // 1 of 21
	cuts := m.counts["rate-cut"]
	m.refusalAfter(step, early[0], false, 0)
	m.refusalAfter(step, early[1], false, 0)
	if m.counts["rate-cut"] != cuts+1 {
		m.t.Errorf("two refusals of requests booked before a small cut made %d cuts, want the storm's 1", m.counts["rate-cut"]-cuts)
	}
}

// probe drives a window of a key of its own into a probe (see spend in
// lua/sync.lua): readings of 100, then 99 left in a window of 60 s (the
// first steers the bucket, the second is the baseline of others'
// spending), then, a request apart, of 50 and of 1 left, which say twice
// in a row that others spend all of it. Others' spending is told only by a request that waited
// for its turn: the window is long enough that, spread over it, the 99
// units leave 600 ms between turns, more than a step takes on a loaded
// machine (in a window of 600 ms, 6 ms apart, a request of a cold make
// test's once went at once, and no key was probed); and the first
// reading's request is booked a tenth of a second ahead (one interval
// ahead, a pause of 5 ms before the readings left it gone, its next
// request went at once, and no key was probed: once in make test). Each
// of up to three keys of its own tries, and the error says what the model
// held of the last.
func (m *modelCheck) probe(step int) {
	var state string
	for _, key := range []string{"p", "p2", "p3"} {
		probed, s := m.probeKey(step, key)
		if probed {
			return
		}
		state += fmt.Sprintf(" %s: %+v;", key, s)
	}
	m.t.Errorf("the window of 50 then 1 left after 99, a request apart, was not probed, on 3 keys:%s", state)
}

// probeKey runs probe's readings on key, and returns whether they probed
// it, with the model's steering of key after them.
func (m *modelCheck) probeKey(step int, key string) (bool, steerModel) {
	r, a, burst := m.limiterOf(key)
	var last modelBooking
	for i := int64(0); i <= burst+100_000/a; i++ { // the burst, and a tenth of a second's turns
		m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
		last = m.bookings[len(m.bookings)-1]
	}
	probes := m.counts["sync-probe"]
	for _, left := range []int64{100, 99, 50, 1} {
		st := store.Steer{Remaining: left, Reset: time.Duration(60000*a) * time.Microsecond}
		m.syncOne(step, r, a, burst, last, st, false)
		m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
		last = m.bookings[len(m.bookings)-1]
	}
	var s steerModel
	if p := m.model.steers[key]; p != nil {
		s = *p
	}
	return m.counts["sync-probe"] > probes, s
}

// faded steers keys of their own, past their burst, with readings of a
// quota that refills: its burst left (twice: the first sets no baseline),
// then, three turns later, nothing left (others spent it), then full: the
// estimate of others' rate fades, in the script as in the model (see fade
// in lua/sync.lua).
func (m *modelCheck) faded(step int) {
	var state string
	for _, key := range []string{"g", "g2", "g3"} {
		r, a, burst := m.limiterOf(key)
		faded := m.counts["sync-faded"]
		for range burst + 1 {
			m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
		}
		for i, left := range []int64{burst, burst, -1, -1, 0, -1, burst - 1} { // -1: a booking alone
			m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
			if left >= 0 {
				st := store.Steer{Remaining: left, Refills: true, Reset: time.Duration(a) * time.Microsecond}
				if i == 6 {
					st.Reset, st.Size = time.Microsecond, burst
				}
				m.syncOne(step, r, a, burst, m.bookings[len(m.bookings)-1], st, false)
			}
		}
		m.keys = append(m.keys, key)
		m.sameState(step)
		if m.counts["sync-faded"] > faded {
			return
		}
		if s := m.model.steers[key]; s != nil {
			state += fmt.Sprintf(" %s: %+v;", key, *s)
		}
	}
	m.t.Errorf("a quota others spent, then full, did not fade their rate's estimate, on 3 keys:%s", state)
}

// expired steers a key of its own with a reading that comes once Redis
// has expired its bucket, not steered before (at the end of the second in
// which it is full again; Redis's clock is this machine's): the reading
// finds no schedule, in the script as in the model.
func (m *modelCheck) expired(step int) {
	const key = "expired"
	m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
	bk := m.bookings[len(m.bookings)-1]
	gone := bk.b.Finishes[0] - bk.b.Finishes[0]%1_000_000 + 1_000_000
	time.Sleep(time.Until(time.UnixMicro(gone + 2000)))
	r, a, burst := m.limiterOf(key)
	m.syncOne(step, r, a, burst, bk, store.Steer{Reset: time.Second}, false)
	m.keys = append(m.keys, key)
	m.sameState(step)
}

// trimmed books two seconds of queue on each of two keys of the slowest
// limit, the second steered, and refuses the last booking: the refusal
// opens the key's rate, and its wake takes all but what it keeps of the
// queue out of the key's bucket (see lua/refused.lua's trim_queues), in
// the script as in the model.
func (m *modelCheck) trimmed(step int) {
	for _, key := range []string{"r", "u"} {
		r, a, burst := m.limiterOf(key)
		var last modelBooking
		for i := range 8 {
			m.reserveWith(step, store.Request{Key: key, Costs: uniform(1, store.MaxLimits), Settled: true}, MaxDelay, 0)
			last = m.bookings[len(m.bookings)-1]
			if i == 0 && key == "u" {
				m.syncOne(step, r, a, burst, last, store.Steer{Remaining: 100, Reset: time.Second, Refills: true}, false)
				m.keys = append(m.keys, key)
			}
		}
		trims := m.counts["rate-trimmed"]
		m.refusalAfter(step, last, false, 0)
		if m.counts["rate-trimmed"] != trims+1 {
			m.t.Errorf("key %s: a refusal that opened the rate over a queue of %v trimmed no bucket", key, time.Duration(last.b.Delay))
		}
		stored, err := m.client.Get(context.Background(), DefaultPrefix+"{"+key+"}").Result()
		if err != nil {
			m.t.Fatalf("step %d: reading %s: %v", step, key, err)
		}
		if tat := strings.Fields(stored)[0]; tat != strconv.FormatInt(m.model.tat[key], 10) {
			m.t.Fatalf("step %d: key %s's schedule in Redis ends at %s after the wake, in the model at %d", step, key, tat, m.model.tat[key])
		}
		m.sameState(step)
	}
}

// hold holds a random key for up to 10 intervals.
func (m *modelCheck) hold(step int) {
	key := m.keys[m.rng.IntN(len(m.keys))]
	r, a, _ := m.limiterOf(key)
	d := time.Duration(m.rng.Int64N(10*a)+1) * time.Microsecond
	changed, end, before, err := storeOf(r).Hold(context.Background(), key, d, "pace-model-holds")
	if err != nil {
		m.t.Fatalf("step %d: hold: %v", step, err)
	}
	now := m.now(step, end-d.Microseconds())
	if changed != (end > m.holdEnds[key]) || before != m.holdEnds[key] {
		m.t.Fatalf("step %d: hold(%s, %v) at %d: changed=%v, the hold before ended at %d, but the last hold ended at %d", step, key, d, now, changed, before, m.holdEnds[key])
	}
	if changed {
		m.holdEnds[key] = end
		m.model.hold(key, end)
		m.counts["hold"]++
	}
}

// eachKind is how often a model check wants each kind of step it names.
const eachKind = 20

// requireEach fails the test if any kind of step happened fewer than
// eachKind times: then the sequence did not exercise the scripts.
func (m *modelCheck) requireEach(kinds ...string) {
	m.t.Helper()
	m.t.Logf("%v", m.counts)
	for _, kind := range kinds {
		m.require(kind, eachKind)
	}
}

// exercised reports whether each kind of step has come eachKind times.
func (m *modelCheck) exercised(kinds []string) bool {
	return !slices.ContainsFunc(kinds, func(kind string) bool { return m.counts[kind] < eachKind })
}

// require fails the test if a kind of step happened fewer than least times.
func (m *modelCheck) require(kind string, least int) {
	m.t.Helper()
	if m.counts[kind] < least {
		m.t.Errorf("only %d %s steps: the sequence did not exercise the scripts", m.counts[kind], kind)
	}
}

// TestRedisDeadlineBooksNothing: a wait that would need 500 ms under a 50 ms
// deadline fails at once (without waiting any of it), says how long it would
// have been, and books nothing.
func TestRedisDeadlineBooksNothing(t *testing.T) { checkDeadlineBooksNothing(t, scriptRedis(t)) }

func checkDeadlineBooksNothing(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	// 50 ms a token: after 10 bookings, the 11th caller would wait 500 ms
	// from the first booking.
	r := mustRedis(t, c, PerSecond(20).WithBurst(1))
	firstBooked := time.Now()
	for range 10 {
		if _, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A limiter's first Wait starts its listener and heartbeat: the measure
	// is of one already running.
	if err := r.Wait(ctx, "warm-up", 1); err != nil {
		t.Fatal(err)
	}
	before, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0) // a probe: refused, books nothing
	if err != nil || before.Granted {
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
	// At once: one call, no sleep (0.3 ms to 1 ms under the race detector;
	// 8 ms once beside other tests). A wait that slept would take its 50 ms.
	if elapsed >= 25*time.Millisecond {
		t.Errorf("Wait took %v to refuse, want well within its deadline of 50ms: it must not wait", elapsed)
	}
	after, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after.Finishes[0] != before.Finishes[0] {
		t.Errorf("the next caller would finish at %d, before the refused wait at %d: the refused wait booked %d µs",
			after.Finishes[0], before.Finishes[0], after.Finishes[0]-before.Finishes[0])
	}
	// The warm-up and the probe took some of the 500 ms (14 ms once on a
	// cluster, under load).
	if least := 500*time.Millisecond - time.Since(firstBooked) - time.Millisecond; de.Delay > before.Delay || de.Delay < after.Delay || de.Delay < least {
		t.Errorf("DeadlineError.Delay = %v, want between %v and %v, and at least %v (500ms since the first booking)", de.Delay, after.Delay, before.Delay, least)
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
	storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0) // the next caller would wait about 200 ms
	err := r.Wait(ctx, "k", 1)
	var de *DeadlineError
	if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || de.Budget != 150*time.Millisecond || de.Delay < 150*time.Millisecond {
		t.Fatalf("Wait past the maximum wait: %v, want a *DeadlineError with a budget of 150ms", err)
	}
}

// TestRedisCancelGivesBack: of 10 booked callers, cancelling the last 5 (all
// at once, so their refunds reach Redis in any order) moves the next new
// caller up by exactly 5 tokens.
func TestRedisCancelGivesBack(t *testing.T) { checkCancelGivesBack(t, scriptRedis(t)) }

func checkCancelGivesBack(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	booked := make(chan Event, 16)
	r := mustRedis(t, c, PerSecond(2).WithBurst(1), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait {
			booked <- e
		}
	}))
	if _, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0); err != nil { // empty the bucket
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
	before, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}

	for _, cancel := range cancels[5:] {
		go cancel()
	}
	lastFive.Wait() // each Wait returns once its refund is done

	after, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if moved, want := before.Finishes[0]-after.Finishes[0], 5*r.limits[0].intervalMicros(); moved != want {
		t.Errorf("cancelling 5 callers moved the next caller up by %d µs, want %d (5 tokens)", moved, want)
	}
	for i, err := range errs[5:] {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled caller %d: %v, want an error wrapping context.Canceled", i+5, err)
		}
	}
	if n, err := c.Exists(ctx, storeOf(r).BucketKey("k")+":gaps").Result(); err != nil || n != 0 {
		t.Errorf("gaps key left behind after every gap joined the tail: exists=%d, %v", n, err)
	}
	t.Logf("next caller's delay: %v before the cancels, %v after", before.Delay, after.Delay)
}

// TestRedisSurvivesScriptFlush: SCRIPT FLUSH and FUNCTION FLUSH between two
// waits change nothing for the caller: the function not found is loaded
// once, and the bucket carries on from where it was.
func TestRedisSurvivesScriptFlush(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	r := mustRedis(t, c, PerSecond(10).WithBurst(1)) // 100 ms a token
	first, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	second, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}, MaxDelay, 0)
	if err != nil {
		t.Fatalf("reserve after SCRIPT FLUSH: %v", err)
	}
	if want := first.Finishes[0] + r.limits[0].intervalMicros(); second.Finishes[0] != want {
		t.Errorf("after SCRIPT FLUSH the booking finished at %d, want %d: the bucket lost its state", second.Finishes[0], want)
	}
	calls, err := redistest.CommandStats(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if calls["function|load"].Calls != 1 || calls["fcall"].Calls != 2 || calls["eval"].Calls+calls["evalsha"].Calls != 0 {
		t.Errorf("commandstats %v: want exactly one FUNCTION LOAD between an FCALL not found and the one that books", calls)
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
	b, err := storeOf(r).Reserve(ctx, store.Request{Key: "api.example.com:443", Costs: uniform(2, store.MaxLimits)}, MaxDelay, 0)
	if err != nil {
		t.Fatal(err)
	}
	const key = "quota:{api.example.com:443}"
	stored, err := c.Get(ctx, key).Int64()
	if err != nil || stored != b.Finishes[0] {
		t.Fatalf("GET %s = %d, %v; want the schedule time %d", key, stored, err, b.Finishes[0])
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	full := time.Duration(b.Finishes[0]-b.Now) * time.Microsecond // 2 s: the bucket is full again then
	if ttl < full-50*time.Millisecond || ttl > full+time.Second {
		t.Errorf("PTTL %s = %v, want from %v, when the bucket is full again, to a second later", key, ttl, full)
	}
}

// storeOf is r's store, for tests that call the scripts directly.
func storeOf(r *Redis) *store.Store { return r.store.(*store.Store) }
