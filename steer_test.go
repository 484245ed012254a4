package pace

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// TestSteeringMatchesModel: the scripts and the Go model agree to the
// microsecond with the upstream's word in play: random readings (of quotas
// that refill and of windows, stale and fresh, learning limits, implying
// others' spending), holds, and refusals and successes that steer the
// key's rate, between bookings, refunds and settlements, each bucket's
// whole state compared after every step; then a window driven into a
// probe, a rate that recovers and is dropped, a storm of refusals, a
// reading of a bucket Redis has expired, and queues a wake trims.
func TestSteeringMatchesModel(t *testing.T) {
	m := newModelCheck(t, newTestRedis(t), 13)
	kinds := []string{"granted", "refused", "granted-spread", "granted-held", "granted-steered", "refund-nothing",
		"settle-up", "settle-down", "sync-stale", "sync-applied", "sync-learned", "sync-foreign", "hold",
		"rate-served", "rate-unchanged"}
	step := 0
	for ; step < 4500 || step < 20000 && !m.exercised(kinds); step++ {
		switch op := m.rng.IntN(26); {
		case op < 12:
			m.reserve(step)
		case op < 13:
			m.refund(step)
		case op < 15:
			m.settle(step)
		case op < 20:
			m.sync(step)
		case op < 21:
			m.hold(step)
		case op < 23:
			m.refusal(step)
		default:
			time.Sleep(time.Duration(m.rng.IntN(2000)) * time.Microsecond)
		}
		m.sameState(step)
	}
	m.probe(step)
	m.recover(step)
	m.storm(step)
	m.expired(step)
	m.faded(step)
	m.trimmed(step)
	m.requireEach(kinds...)
	m.require("rate-cut", 5)       // a round of refusals lasts 100 ms at least: a few tens in the run
	m.require("sync-probe", 1)     // others seem to spend all a window has left: rare at random, and once by probe
	m.require("rate-recovered", 1) // a key's rate back at the configured rate, dropped
}

// count returns how many events of kind the log holds.
func (l *eventLog) count(kind EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// refillReading is a reading of an upstream's bucket: left units, full
// again in reset.
func refillReading(left int64, reset time.Duration) []headers.Reading {
	return []headers.Reading{{Name: "requests", Remaining: left, Reset: reset, Refills: true, Header: "x-ratelimit-remaining-requests: " + strconv.FormatInt(left, 10)}}
}

// TestSyncTransitions: on an injected clock and a store that can fail, with
// the default options: a reading steers the key, and the next booking
// follows it; a reading of an older booking is dropped unasked, as stale; a
// sync that meets a failure is a failure the breaker counts (the next
// request's calls confirm the outage), and no sync is attempted during the
// outage, nor for a booking the outage decided;
// once Redis is back, readings steer again.
func TestSyncTransitions(t *testing.T) {
	f := newFailoverTest(t, PerSecond(100).WithBurst(10), 1)
	ctx := context.Background()
	first, second := f.grant("k", 0), f.grant("k", 0)
	if err := f.r.sync(ctx, "k", second.redis, refillReading(0, time.Second), false, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if f.store.syncs != 1 || f.log.count(EventReading) != 1 || f.store.model.steers["k"] == nil {
		t.Fatalf("%d syncs, %d EventReadings, steered %v: want the reading applied", f.store.syncs, f.log.count(EventReading), f.store.model.steers["k"] != nil)
	}
	// Nothing left: the next booking waits for the bucket to refill its own
	// unit, the unit booked before the reading's request in its burst (which
	// may have arrived after it), a request's cost for the jitter of
	// arrivals, and what others may spend in 50 ms before their rate is
	// estimated (5): 10 ms x (1 + 1 + 1 + 5).
	f.checkDelay("after a reading of none left", f.grant("k", 0).delay, 80*time.Millisecond, 80*time.Millisecond)
	if err := f.r.sync(ctx, "k", first.redis, refillReading(9, time.Second), false, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if f.store.syncs != 1 {
		t.Fatalf("a reading of a booking older than the last applied: %d syncs; want it dropped as stale, unasked", f.store.syncs)
	}

	f.clock.Advance(steer.SyncEvery)
	third, fresh := f.grant("k", 0), f.grant("k", 0) // decided before the failure
	f.store.down = errConnRefused
	if err := f.r.sync(ctx, "k", fresh.redis, refillReading(5, time.Second), false, f.clock.Now()); !errors.Is(err, errConnRefused) {
		t.Fatalf("sync against a failed Redis: %v, want the failure", err)
	}
	if e, ok := f.log.last(EventFallback); ok {
		t.Fatalf("one failed sync began an outage: %v", e)
	}
	syncs, reserves := f.store.syncs, f.store.reserves
	local := f.grant("k", 0)
	if _, ok := f.log.last(EventFallback); !ok || local.limiter != "local" || f.store.reserves != reserves+2 {
		t.Fatalf("after the failed sync, the next request: decided by %q after %d calls; want local, the outage confirmed by two calls begun after the sync's failure", local.limiter, f.store.reserves-reserves)
	}
	for _, b := range []store.Booking{third.redis, local.redis} {
		f.clock.Advance(steer.SyncEvery)
		if err := f.r.sync(ctx, "k", b, refillReading(5, time.Second), false, f.clock.Now()); err != nil || f.store.syncs != syncs {
			t.Fatalf("sync during the outage: %v, %d store calls; want none", err, f.store.syncs-syncs)
		}
	}

	f.recover()
	f.clock.Advance(steer.SyncEvery)
	if err := f.r.sync(ctx, "k", f.grant("k", 0).redis, refillReading(8, time.Second), false, f.clock.Now()); err != nil || f.log.count(EventReading) != 2 {
		t.Fatalf("sync after the outage: %v, %d EventReadings; want a second one", err, f.log.count(EventReading))
	}
}

// TestSyncReadsAWindow: Sync reads three readings 100 ms apart of a
// quota that says it refills, in OpenAI's fields, but counts down as a
// window of a second does (full at its reset whatever is spent): the
// first two steer a quota that refills, the third, once two in a row told
// the window, a level alone (see steer.Windows).
func TestSyncReadsAWindow(t *testing.T) {
	f := newFailoverTest(t, PerSecond(100).WithBurst(10), 1)
	ctx := context.Background()
	for i := range int64(3) {
		res, err := f.r.Reserve(ctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Duration(i) * 100 * time.Millisecond
		reading := headers.Reading{Name: "requests", Remaining: 90 - 10*i, Reset: time.Second - at, Refills: true}
		if err := f.r.Sync(ctx, res, []headers.Reading{reading}, false); err != nil {
			t.Fatal(err)
		}
		if got := f.store.steered; len(got) != 1 || got[0].Refills != (i < 2) || got[0].Rounded != (i == 2) {
			t.Errorf("reading %d: steered %+v; want a quota that refills before the third, a level alone then", i, got)
		}
		f.clock.Advance(100 * time.Millisecond)
	}
}

// TestSyncBadInput: Sync refuses a reservation it did not make, and ignores
// readings that steer none of the quota's limits.
func TestSyncBadInput(t *testing.T) {
	c := newTestRedis(t)
	ctx := context.Background()
	r, other := mustRedis(t, c, PerSecond(10)), mustRedis(t, c, PerSecond(10))
	res, err := other.Reserve(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*Reservation{nil, res} {
		if err := r.Sync(ctx, bad, refillReading(1, time.Second), false); err == nil || !strings.Contains(err.Error(), "did not make") {
			t.Errorf("Sync(%v): %v, want an error that says the limiter did not make it", bad, err)
		}
	}
	quota := mustRedis(t, c, AllOf(PerSecond(10).Named("requests"), PerSecond(1000).Named("tokens")))
	if res, err = quota.Reserve(ctx, "q", nil); err != nil {
		t.Fatal(err)
	}
	unnamed := []headers.Reading{{Name: "search", Remaining: 1, Reset: time.Second}, {Remaining: 1, Reset: time.Second}}
	if err := quota.Sync(ctx, res, unnamed, false); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, storeOf(quota).Keys("q", false)[0]).Result(); err != nil || strings.Contains(v, " ") {
		t.Errorf("the requests bucket after readings of other quotas: %q, %v; want it not steered", v, err)
	}
}

// TestTransportFollowsCounters: a Transport on Redis reads each response's
// counters (here OpenAI's) and steers the key with them, the observer
// hearing the reading and the limit learned, with the header; with
// IgnoreCounters it does not.
func TestTransportFollowsCounters(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "6000") // a minute's: 100/s
		w.Header().Set("X-Ratelimit-Remaining-Requests", "3")
		w.Header().Set("X-Ratelimit-Reset-Requests", "70ms")
	}))
	defer api.Close()
	c := newTestRedis(t)
	log := &eventLog{}
	r := mustRedis(t, c, mustParseLimit(t, "10/s learn 10..100"), WithObserver(log.observe))
	for _, ignore := range []bool{false, true} {
		key := fmt.Sprintf("ignore=%v", ignore)
		client := &http.Client{Transport: &Transport{Limiter: r, IgnoreCounters: ignore, Key: func(*http.Request) string { return key }}}
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		v, err := c.Get(context.Background(), storeOf(r).BucketKey(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if fields := strings.Fields(v); ignore != (len(fields) == 1) || (!ignore && fields[4] != "10000") {
			t.Errorf("IgnoreCounters %v: the bucket holds %q; want it steered (and a learned interval of 10000 µs) unless ignored", ignore, v)
		}
	}
	reading, ok := log.last(EventReading)
	if !ok || log.count(EventReading) != 1 || !strings.Contains(reading.Reason, "x-ratelimit-remaining-requests: 3") || reading.Cost != 3 {
		t.Errorf("EventReading %+v (%d of them); want one, of 3 left, with the header", reading, log.count(EventReading))
	}
	if learned, ok := log.last(EventLearned); !ok || learned.Key != "ignore=false" {
		t.Errorf("EventLearned %+v, %v; want one for the key steered", learned, ok)
	}
}

// TestRetimeWakesSleepers: a caller asleep for its turn at a cautious pace
// (1/s) wakes and books anew when the key learns a faster one (100/s), and
// goes at once instead of a second later.
func TestRetimeWakesSleepers(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	booked := make(chan time.Duration, 8)
	r := mustRedis(t, c, mustParseLimit(t, "1/s burst 1 learn 1..100"), WithObserver(func(_ context.Context, e Event) {
		if e.Kind == EventWait {
			booked <- e.Delay
		}
	}))
	res, err := r.Reserve(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-booked
	done := make(chan time.Time, 1)
	go func() {
		r.Wait(ctx, "k", 1)
		done <- time.Now()
	}()
	if d := <-booked; d < 900*time.Millisecond {
		t.Fatalf("the second caller was booked %v ahead, want about 1s", d)
	}
	waitForSubscriber(t, c, r.holdChannel())
	synced := time.Now()
	learn := []headers.Reading{{Limit: 100, Window: time.Second, Remaining: 90, Reset: 100 * time.Millisecond, Refills: true, Header: "test"}}
	if err := r.Sync(ctx, res, learn, false); err != nil {
		t.Fatal(err)
	}
	if went := (<-done).Sub(synced); went > 500*time.Millisecond {
		t.Errorf("the sleeper went %v after the key learned 100/s, want at once, not at its booked time a second on", went)
	}
	if len(booked) != 1 {
		t.Errorf("%d more bookings, want the sleeper's one anew", len(booked))
	}
}

// waitForSubscriber waits, for at most a second, until a client listens on
// channel.
func waitForSubscriber(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n, err := c.PubSubNumSub(context.Background(), channel).Result(); err == nil && n[channel] > 0 {
			return
		}
	}
	t.Fatalf("nobody listens on %s", channel)
}

// TestStaleReadingAcrossProcesses: two processes' limiters on one key; the
// counters of a request booked later steer it first, and those of the
// earlier one, come late to the other process, are stale: Redis ignores
// them, and that process's observer hears so.
func TestStaleReadingAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	logA, logB := &eventLog{}, &eventLog{}
	a := mustRedis(t, c, PerSecond(100), WithObserver(logA.observe))
	b := mustRedis(t, c, PerSecond(100), WithObserver(logB.observe))
	older, err := b.Reserve(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := a.Reserve(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx, newer, refillReading(40, time.Second), false); err != nil || logA.count(EventReading) != 1 {
		t.Fatalf("the newer reading: %v, %d EventReadings; want it applied", err, logA.count(EventReading))
	}
	before, _ := c.Get(ctx, storeOf(a).BucketKey("k")).Result()
	if err := b.Sync(ctx, older, refillReading(99, time.Second), false); err != nil || logB.count(EventStaleReading) != 1 || logB.count(EventReading) != 0 {
		t.Fatalf("the older reading: %v, %d EventStaleReadings, %d EventReadings; want it ignored as stale", err, logB.count(EventStaleReading), logB.count(EventReading))
	}
	if after, _ := c.Get(ctx, storeOf(a).BucketKey("k")).Result(); after != before {
		t.Errorf("the stale reading changed the bucket from %q to %q", before, after)
	}
}

// TestWindowEstimateOfOthers: on a real redis-server, the readings of a
// window (4000 units, resetting in 40 s) from 9 processes in turn. Three
// units the fleet's bookings do not explain, over one spread interval
// (10 ms), the jitter of arrivals, do not hold the window until its reset:
// the next request goes at its spread. Others then seen spending 1000 at
// once, twice in a row, more than the window has left at their rate, leave
// the fleet a probe, a request a second, not a hold of 40 s (once is not
// enough: see TestReorderedArrivalsAreNotOthers); once they have stopped,
// the probe's reading spreads the rest again.
func TestWindowEstimateOfOthers(t *testing.T) {
	// Not beside the parallel tests: what others spent "at once" is judged
	// by the time between its readings, which a machine crowded by fleets
	// of processes stretched past a spread (2 of 6 make tests).
	w := newWindowFleet(t, 9, PerSecond(200).WithBurst(10), 40*time.Second)
	left := int64(4000)
	// next books a request in process i and steers the key with what the
	// upstream then says is left: the fleet's request, and others' units,
	// spent.
	next := func(i int, others int64) time.Duration {
		t.Helper()
		res := w.reserve(i)
		left -= 1 + others
		w.sync(i, res, left)
		return res.Delay()
	}
	for i := range 3 {
		next(i, 0) // the first reading; one of a request that did not wait; the first baseline
	}
	next(3, 3)
	if d := next(4, 0); d > 100*time.Millisecond {
		t.Errorf("after 3 units unexplained over 10 ms, the next request waited %v; want its spread (10 ms), not the reset", d)
	}
	if d := next(5, 1000); d > 100*time.Millisecond {
		t.Errorf("after others spent 1000 at once, the next request waited %v; want its spread until a second reading says so too", d)
	}
	// The probe goes a second after the last unit booked, that of request
	// 6: the wait of the next counts from when it books, on the run's clock.
	booked := time.Now()
	next(6, 1000)
	if d := next(7, 0); d+time.Since(booked) < 900*time.Millisecond || d > 1100*time.Millisecond {
		t.Errorf("after others spent 1000 at once twice in a row, the next request waited %v, %v after the last booking; want the rest of a probe's second", d, time.Since(booked))
	}
	if d := next(8, 0); d > 100*time.Millisecond {
		t.Errorf("after the probe's reading (others stopped), the next request waited %v; want the rest's spread (20 ms)", d)
	}
}

// TestReorderedArrivalsAreNotOthers: on a real redis-server, the readings
// of a window (400 units, resetting in 40 s) from processes in turn, each
// of a request booked a spread (100 ms) after the one before. When a
// request booked later arrives at the upstream first, the reading of the
// earlier one counts it, and the later one's reading does not count it
// again: one unit unexplained, then one too many, which the fleet's
// bookings explain together. Neither slows the spread: it stays within 1%
// of what is left over the time left (with others' rate taken from one
// reading, 2 units a second until the reset would slow it by a fifth).
// Others who spend a unit a spread in two readings in a row are others:
// the spread slows.
func TestReorderedArrivalsAreNotOthers(t *testing.T) {
	besideOthers(t)
	w := newWindowFleet(t, 10, PerSecond(100).WithBurst(1), 40*time.Second)
	ctx, c, reserve, sync := t.Context(), w.client, w.reserve, w.sync
	left := int64(400)
	// spread returns the bucket's spread over the ideal: the time until the
	// reset over the units left for the fleet, less those booked ahead.
	spread := func(when string) float64 {
		t.Helper()
		v, err := c.Get(ctx, storeOf(w.fleet[0]).BucketKey("k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(v)
		tat, _ := strconv.ParseInt(f[0], 10, 64)
		till, _ := strconv.ParseInt(f[2], 10, 64)
		apart, _ := strconv.ParseInt(f[3], 10, 64)
		units, _ := strconv.ParseInt(f[5], 10, 64)
		ideal := float64(till-tat) / float64(units)
		t.Logf("%s: spread %d µs, %.3f of (till - TAT) / units left", when, apart, float64(apart)/ideal)
		return float64(apart) / ideal
	}
	for i := range 3 { // the first reading; one of a request that did not wait; the first baseline
		left--
		sync(i, reserve(i), left)
	}
	third, fourth := reserve(3), reserve(4)
	left -= 2
	sync(3, third, left) // the fourth arrived first: counted
	if s := spread("one unit unexplained"); s > 1.01 {
		t.Errorf("after one unit of a reordered arrival, the spread is %.3f of the ideal, want at most 1.01", s)
	}
	sync(4, fourth, left) // booked before the reading applied: stale
	left--
	sync(5, reserve(5), left) // one too many: the fourth is among the bookings since
	if s := spread("then one too many"); s > 1.01 {
		t.Errorf("after the reordered arrival's pair, the spread is %.3f of the ideal, want at most 1.01", s)
	}
	for i := 6; i < 10; i++ { // others spend a unit a spread
		left -= 2
		sync(i, reserve(i), left)
	}
	if s := spread("others spent a unit a spread, 4 readings in a row"); s < 1.5 {
		t.Errorf("after others spent a unit a spread in 4 readings, the spread is %.3f of the ideal, want it slowed (at least 1.5)", s)
	}
}

// windowFleet is a fleet of processes on one real redis-server that book
// key "k" in turn and steer it with readings of a window: each process
// syncs once, since a process syncs a key every 50 ms at most.
type windowFleet struct {
	t      *testing.T
	client *redis.Client
	fleet  []*Redis
	reset  time.Duration // how far the window's reset lies from each reading
}

// newWindowFleet starts a fleet of n processes, each pacing the key at
// limit, whose readings say the window resets in reset.
func newWindowFleet(t *testing.T, n int, limit Limit, reset time.Duration) *windowFleet {
	w := &windowFleet{t: t, client: newTestRedis(t), reset: reset}
	for range n {
		w.fleet = append(w.fleet, mustRedis(t, w.client, limit, sharedOnly)) // a slow call is no outage: each booking is steered
	}
	return w
}

// reserve books a request in process i, within 2 s.
func (w *windowFleet) reserve(i int) *Reservation {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 2*time.Second)
	defer cancel()
	res, err := w.fleet[i].Reserve(ctx, "k", nil)
	if err != nil {
		w.t.Fatalf("request %d: %v", i, err)
	}
	return res
}

// sync steers the key, in process i, by the reading of res's response:
// left units left in the window.
func (w *windowFleet) sync(i int, res *Reservation, left int64) {
	w.t.Helper()
	window := []headers.Reading{{Name: "requests", Remaining: left, Reset: w.reset, Header: "ratelimit: r=" + strconv.FormatInt(left, 10)}}
	if err := w.fleet[i].Sync(w.t.Context(), res, window, false); err != nil {
		w.t.Fatal(err)
	}
}

// TestBucketsLevelAlone: a level alone (a reset a second away or less, in
// whole seconds) is a token bucket's, whose refills since its request
// count, only when its limit is no more than the bucket's burst and less
// than a second of its rate; a window of a second states a second of the
// rate or more, and a reading of a quota that refills says so itself.
func TestBucketsLevelAlone(t *testing.T) {
	level := func(limit int64) headers.Reading {
		return headers.Reading{Limit: limit, Remaining: 3, Reset: time.Second, Early: time.Second}
	}
	gateway := PerSecond(100).WithBurst(10)
	for _, c := range []struct {
		name    string
		reading headers.Reading
		l       Limit
		want    bool
	}{
		{"a gateway's bucket: its burst as the limit", level(10), gateway, true},
		{"below the burst", level(5), gateway, true},
		{"above the burst", level(11), gateway, false},
		{"no limit said", level(0), gateway, false},
		{"a window of a second, at the rate with its default burst", level(100), PerSecond(100), false},
		{"a window holding a second of the rate", level(10), PerSecond(10).WithBurst(20), false},
		{"a reset a second and more away: a window's", headers.Reading{Limit: 10, Remaining: 3, Reset: 2 * time.Second, Early: time.Second}, gateway, false},
		{"a quota that refills says so", headers.Reading{Limit: 6000, Remaining: 3, Reset: 30 * time.Millisecond, Refills: true}, gateway, true},
	} {
		if got := refills(c.reading, c.l); got != c.want {
			t.Errorf("%s: refills(%+v, %v) = %v, want %v", c.name, c.reading, c.l, got, c.want)
		}
	}
}
