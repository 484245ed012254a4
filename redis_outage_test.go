package pace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/outage"
	"github.com/fleetpace/pace/internal/store"
)

// The failover's table tests: a Redis limiter on a fake clock, over a fake
// store that keeps the model of the reserve and refund scripts and can be
// made to fail. Nothing sleeps; each row takes well under 100 ms. The
// wall-clock fault tests against a real redis-server (redis_fault_test.go,
// redis_outage_transitions_test.go) are the end-to-end proof.

// fakeStore stands in for Redis: one token bucket per key, kept by the
// model of reserve.lua and refund.lua, on the test's clock (nil: the time of
// the synctest bubble the test runs in).
type fakeStore struct {
	mu              sync.Mutex
	clock           *fakeClock
	interval, burst int64
	model           *bucketModel
	holds           map[string]int64                                   // key → when its hold ends, in microseconds
	down            error                                              // when set, every call fails with it
	failNext        int                                                // reserves that fail with errConnRefused before the store answers again
	failTakes       time.Duration                                      // how long each failing reserve takes, on the clock, as a call that times out
	bookThenFail    int                                                // reserves that book, then fail as a call that timed out after Redis ran it
	records         map[uint64]int64                                   // the bookings ahead, by call → when each is due, as lua/record.lua keeps them
	leases          func(n int64, span time.Duration) store.TokenLease // what LeaseTokens leases, if set
	answers         atomic.Uint64                                      // reserves answered, as the caller counts them
	during          func()                                             // when set, runs once inside the next reserve, as another goroutine's failure would
	reserves        int
	calls           uint64
	refunds         int
	syncs           int
	steered         []store.Steer   // what the last sync told
	slotHolders     map[string]bool // ids holding a slot
	repaid          map[string]int  // key → the units repaid under the first limit
}

func newFakeStore(clock *fakeClock, l Limit) *fakeStore {
	return &fakeStore{clock: clock, interval: l.intervalMicros(), burst: int64(l.burst), model: newBucketModel(), holds: map[string]int64{}, records: map[uint64]int64{}}
}

func (s *fakeStore) NewCall() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.calls
}

func (s *fakeStore) Reserve(_ context.Context, q store.Request, budget, notBefore time.Duration) (store.Booking, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, costs := q.Key, q.Costs
	s.reserves++
	if f := s.during; f != nil {
		s.during = nil
		f()
	}
	if s.down != nil || s.failNext > 0 {
		s.failNext = max(s.failNext-1, 0)
		s.advance(s.failTakes)
		return store.Booking{}, cmp.Or(s.down, errConnRefused)
	}
	now := s.now().UnixMicro()
	b, recorded := store.Booking{Granted: true, Now: now}, false
	if due, ok := s.records[q.Call]; ok && q.Call != 0 {
		b.Delay, recorded = store.Microseconds(max(due-now, 0)), true
	} else {
		b = s.model.reserve(key, s.interval, s.burst, int64(costs[0]), budget.Microseconds(), notBefore.Microseconds(), now, has(q.Estimated, 0), q.Again)
	}
	if b.Granted && b.Delay > 0 && !recorded {
		s.records[q.Call] = b.Due()
	}
	b.Costs = costs
	if s.bookThenFail > 0 {
		s.bookThenFail--
		s.advance(s.failTakes)
		return store.Booking{}, context.DeadlineExceeded
	}
	s.answers.Add(1)
	return b, nil
}

func (s *fakeStore) Refused(_ context.Context, key string, b store.Booking, served bool, before int64, _ string) (int64, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return 0, 0, s.down
	}
	now := s.now().UnixMicro()
	return s.model.refused(key, []modelBucket{{key, s.interval, s.burst}}, b, served, before, now, s.burst), now, nil
}

func (s *fakeStore) Refund(_ context.Context, key string, b store.Booking) ([store.MaxLimits]store.RefundResult, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var results [store.MaxLimits]store.RefundResult
	if s.down != nil {
		return results, 0, s.down
	}
	s.refunds++
	now := s.now().UnixMicro()
	results[0] = s.model.refund(key, b.Finishes[0], int64(b.Costs[0])*s.interval, now)
	return results, now, nil
}

func (s *fakeStore) Settle(_ context.Context, key string, b store.Booking, actual store.LimitCosts) (bool, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return false, 0, s.down
	}
	now := s.now().UnixMicro()
	s.model.settle(key, s.interval, s.burst, int64(actual[0]-b.Costs[0]), int64(actual[0])-known(has(b.Estimated, 0), int64(b.Costs[0])), now)
	return true, now, nil
}

func (s *fakeStore) Sync(_ context.Context, key string, b store.Booking, steers []store.Steer, refused bool, _ string) (store.SyncReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs, s.steered = s.syncs+1, steers
	if s.down != nil {
		return store.SyncReply{}, s.down
	}
	r := store.SyncReply{Now: s.now().UnixMicro()}
	for i, st := range steers {
		r.Results[i] = s.model.sync(key, key, s.interval, s.burst, b, 0, st, refused, r.Now)
		if steer := s.model.steers[key]; steer != nil {
			r.Synced[i] = steer.synced
		}
	}
	return r, nil
}

func (s *fakeStore) Hold(_ context.Context, key string, d time.Duration, _ string) (bool, int64, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return false, 0, 0, s.down
	}
	now := s.now().UnixMicro()
	end, before := now+d.Microseconds(), s.holds[key]
	s.model.hold(key, end)
	s.holds[key] = end
	return true, end, before, nil
}

// Slots keeps holders without leases or a line: a request that finds the
// cap full is told it waits, and is never told its slot.
func (s *fakeStore) Slots(_ context.Context, _ string, c store.SlotCall) (store.SlotsReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return store.SlotsReply{}, s.down
	}
	if s.slotHolders == nil {
		s.slotHolders = map[string]bool{}
	}
	reply := store.SlotsReply{Now: s.now().UnixMicro(), State: store.SlotHeld}
	switch {
	case c.Op == store.SlotRelease:
		delete(s.slotHolders, c.ID)
		reply.State = store.SlotNone
	case c.Op == store.SlotRenew || s.slotHolders[c.ID] || len(s.slotHolders) < c.Cap.Limit:
		s.slotHolders[c.ID] = true
	default:
		reply.State = store.SlotWaiting
	}
	return reply, nil
}

// Line keeps no line: each deferred request's turn is its earliest.
func (s *fakeStore) Line(_ context.Context, _ string, earliest, _ time.Duration) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return 0, s.down
	}
	return earliest, nil
}

func (s *fakeStore) Repay(_ context.Context, key string, debt store.LimitCosts, _ time.Duration, _ int) (store.LimitCosts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return store.LimitCosts{}, s.down
	}
	if s.repaid == nil {
		s.repaid = map[string]int{}
	}
	s.repaid[key] += debt[0]
	return debt, nil
}

func (s *fakeStore) HeldUntil(_ context.Context, key string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return 0, s.down
	}
	return s.holds[key], nil
}

func (s *fakeStore) Announce(context.Context, string) error { return nil }

// LeaseTokens leases what s.leases says, if set (none else: the fake books
// every request; see redis_tokenlease_test.go for leases on the real
// script).
func (s *fakeStore) LeaseTokens(_ context.Context, _ string, n int64, span, _ time.Duration) (store.TokenLease, error) {
	if s.leases == nil {
		return store.TokenLease{}, nil
	}
	return s.leases(n, span), nil
}

func (s *fakeStore) Check(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return 0, s.down
	}
	return s.now().UnixMicro(), nil
}

// now is the store's time, Redis's clock.
func (s *fakeStore) now() time.Time {
	if s.clock == nil {
		return time.Now()
	}
	return s.clock.Now()
}

// advance lets d pass, as a call that takes that long.
func (s *fakeStore) advance(d time.Duration) {
	if s.clock == nil {
		time.Sleep(d)
		return
	}
	s.clock.Advance(d)
}

// failoverTest is one row's limiter, store and clock.
type failoverTest struct {
	t     *testing.T
	clock *fakeClock
	store *fakeStore
	r     *Redis
	log   *eventLog
}

var errConnRefused = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

// newFailoverTest returns a Redis limiter of l on a fake clock and a fake
// store, with the default options but a pinned fleet size. The clock starts
// a day ahead of the real one, so that the contexts of deadlines set on it
// have not ended.
func newFailoverTest(t *testing.T, l Limit, fleetSize int) *failoverTest {
	clock := &fakeClock{now: time.Now().Add(24 * time.Hour)}
	return newFailoverTestOn(t, l, fleetSize, clock, clock.Now)
}

// newFailoverTestOn returns the limiter and store of a failoverTest on
// clock (nil for the time of a synctest bubble), whose time now is.
func newFailoverTestOn(t *testing.T, l Limit, fleetSize int, clock *fakeClock, now func() time.Time) *failoverTest {
	log := &eventLog{}
	r, err := newRedis(l, now, WithFleetSize(fleetSize), WithObserver(log.observe))
	if err != nil {
		t.Fatal(err)
	}
	store := newFakeStore(clock, l)
	r.store = store
	r.failover.CountAnswers(&store.answers)
	return &failoverTest{t: t, clock: clock, store: store, r: r, log: log}
}

// decide decides one request for key, whose caller may wait budget (0:
// no deadline), without sleeping.
func (f *failoverTest) decide(key string, budget time.Duration) (booking, error) {
	ctx := context.Background()
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, f.clock.Now().Add(budget))
		defer cancel()
	}
	return f.r.decideAsking(ctx, request{Request: store.Request{Key: key, Costs: uniform(1, store.MaxLimits)}})
}

// grant decides a request that must be granted, and returns its booking.
func (f *failoverTest) grant(key string, budget time.Duration) booking {
	f.t.Helper()
	tk, err := f.decide(key, budget)
	if err != nil {
		f.t.Fatalf("%s: %v", key, err)
	}
	return tk
}

// fail makes Redis fail, and decides one request, which the outage then
// decides.
func (f *failoverTest) fail() booking {
	f.t.Helper()
	f.store.down = errConnRefused
	tk := f.grant("trigger", 0)
	if tk.limiter != "local" {
		f.t.Fatalf("the request that met the failure was decided by %q, want local", tk.limiter)
	}
	return tk
}

// recover brings Redis back, moves past the longest cool-down and makes the
// probe, which must succeed.
func (f *failoverTest) recover() {
	f.t.Helper()
	f.store.down = nil
	f.clock.Advance(DefaultMaxCooldown)
	if tk := f.grant("probe", 0); tk.limiter != "redis" {
		f.t.Fatalf("the probe was decided by %q, want redis", tk.limiter)
	}
	if _, ok := f.log.last(EventRecover); !ok {
		f.t.Fatal("no EventRecover after the probe")
	}
}

// checkDelay fails the row unless d is within [lo, hi].
func (f *failoverTest) checkDelay(what string, d, lo, hi time.Duration) {
	f.t.Helper()
	if d < lo || d > hi {
		f.t.Errorf("%s: delay %v, want %v to %v", what, d, lo, hi)
	}
}

func TestFailover(t *testing.T) {
	// Most rows pace 10/s burst 1 in a fleet of 1: an outage's buckets start
	// empty, so its first local grant of a key waits 100 ms.
	tenPerSecond := PerSecond(10).WithBurst(1)
	// The others pace 100/s burst 10 in a fleet of 2: the outage's share is
	// 50/s burst 5.
	hundredPerSecond := PerSecond(100).WithBurst(10)
	for _, row := range []struct {
		name  string
		limit Limit
		fleet int
		run   func(f *failoverTest)
	}{
		{"one failed call is asked again, and the process stays on Redis", tenPerSecond, 1, func(f *failoverTest) {
			f.store.failNext = 1
			if tk := f.grant("k", 0); tk.limiter != "redis" || f.store.reserves != 2 || f.r.failover.Mode() != outage.Shared {
				f.t.Errorf("after one failed call: decided by %q in %d calls, mode %v; want redis in 2, shared", tk.limiter, f.store.reserves, f.r.failover.Mode())
			}
			if e, ok := f.log.last(EventFallback); ok {
				f.t.Errorf("one failed call fell back: %v", e)
			}
		}},
		{"failures in a row confirm an outage: one request makes three calls", tenPerSecond, 1, func(f *failoverTest) {
			f.store.down = errConnRefused
			if tk := f.grant("k", 0); tk.limiter != "local" || f.store.reserves != outage.ConfirmRow {
				f.t.Errorf("Redis down: decided by %q after %d calls; want local after %d", tk.limiter, f.store.reserves, outage.ConfirmRow)
			}
			if _, ok := f.log.last(EventFallback); !ok {
				f.t.Error("no EventFallback")
			}
		}},
		{"an answer between failures breaks their row", tenPerSecond, 1, func(f *failoverTest) {
			for i := range 4 { // two failures and an answer, four times over
				f.store.failNext = outage.ConfirmRow - 1
				if tk := f.grant("k", 0); tk.limiter != "redis" {
					f.t.Fatalf("request %d, after %d failed calls and an answer: decided by %q, want redis", i, outage.ConfirmRow-1, tk.limiter)
				}
			}
			if mode := f.r.failover.Mode(); mode != outage.Shared {
				f.t.Errorf("mode %v after rows broken by answers, want shared", mode)
			}
		}},
		{"a second call without an answer, half a timeout after the first failure, confirms", tenPerSecond, 1, func(f *failoverTest) {
			f.store.down, f.store.failTakes = errConnRefused, DefaultCallTimeout
			if tk := f.grant("k", 0); tk.limiter != "local" || f.store.reserves != 2 {
				f.t.Errorf("two calls that timed out: decided by %q after %d calls; want local after 2", tk.limiter, f.store.reserves)
			}
		}},
		{"the calls under way when this process paused all time out at once: no outage, for their retries are answered", tenPerSecond, 1, func(f *failoverTest) {
			began := f.clock.Now()
			f.clock.Advance(DefaultCallTimeout * 2) // the pause
			for range 16 {
				if away, _, _ := f.r.outcome(context.Background(), redisCall{key: "k", cost: 1, began: began}, context.DeadlineExceeded); away {
					f.t.Fatal("calls that began before the row's first failure, timing out together, confirmed an outage")
				}
			}
			if tk := f.grant("k", 0); tk.limiter != "redis" || f.r.failover.Mode() != outage.Shared {
				f.t.Errorf("the next request: decided by %q, mode %v; want redis, shared", tk.limiter, f.r.failover.Mode())
			}
		}},
		{"slots booked ahead when an outage begins delay their key alone", tenPerSecond, 1, func(f *failoverTest) {
			for range 30 { // "hot" booked 2.9 s ahead at 10/s
				f.grant("hot", 0)
			}
			f.fail()
			tk := f.grant("cold", 5*time.Second)
			f.checkDelay("a key never used, during the outage", tk.delay, 100*time.Millisecond, 100*time.Millisecond)
			tk = f.grant("hot", 0)
			f.checkDelay("the booked key, during the outage", tk.delay, 3*time.Second, 3*time.Second)
		}},
		{"a held key beside a free key", tenPerSecond, 1, func(f *failoverTest) {
			if err := f.r.Hold(context.Background(), "held", headers.Hold{For: 5 * time.Second, Reason: "test"}); err != nil {
				f.t.Fatal(err)
			}
			f.grant("held", 0) // one caller booked after the hold
			f.fail()
			f.checkDelay("the free key", f.grant("free", time.Second).delay, 100*time.Millisecond, 100*time.Millisecond)
			f.checkDelay("the held key", f.grant("held", 0).delay, 5100*time.Millisecond, 5100*time.Millisecond)
		}},
		{"a failed probe doubles the cool-down and leaves Redis alone meanwhile", tenPerSecond, 1, func(f *failoverTest) {
			f.fail()
			f.clock.Advance(DefaultMinCooldown * 12 / 10) // past the first cool-down, whatever its jitter
			calls := f.store.reserves
			if tk := f.grant("k", 0); tk.limiter != "local" || f.store.reserves != calls+1 {
				f.t.Fatalf("after the cool-down: %q decided with %d calls, want the probe's one call, then local", tk.limiter, f.store.reserves-calls)
			}
			if _, ok := f.log.last(EventProbe); !ok {
				f.t.Error("no EventProbe for the failed probe")
			}
			f.clock.Advance(DefaultMinCooldown * 12 / 10) // not past the second, at least 160 ms
			f.grant("k", 0)
			if f.store.reserves != calls+1 {
				f.t.Errorf("Redis was asked again %v after a failed probe, within the doubled cool-down", DefaultMinCooldown*12/10)
			}
		}},
		{"a probe that succeeds while others are away keeps the outage's share until settled", hundredPerSecond, 2, func(f *failoverTest) {
			// Redis alone would give 10 at once, then 100/s; the share, 5 at once, then 50/s.
			f.fail()
			f.recover()
			var last time.Duration
			for i := range 15 {
				tk := f.grant("k", 0)
				if tk.local == nil {
					f.t.Fatalf("grant %d while returning passed no gate", i)
				}
				last = tk.delay
			}
			f.checkDelay("the 15th grant while returning (share 50/s, its bucket full)", last, 200*time.Millisecond, 200*time.Millisecond)
			f.clock.Advance(outage.ReturnWindow(f.r.config.maxCooldown, f.r.config.callTimeout))
			tk := f.grant("k2", 0)
			if tk.local != nil || f.r.failover.Mode() != outage.Shared {
				f.t.Errorf("after the settle time: gate %v, mode %v; want none, shared", tk.local != nil, f.r.failover.Mode())
			}
		}},
		{"while returning a cold key passes at once, and a key the share refuses is charged nothing", hundredPerSecond, 2, func(f *failoverTest) {
			f.fail()
			for range 150 { // "hot" booked 3 s ahead locally
				f.grant("hot", 0)
			}
			f.recover() // 2 s later
			if tk := f.grant("cold", 50*time.Millisecond); tk.delay != 0 {
				f.t.Errorf("a cold key while returning waited %v, want 0", tk.delay)
			}
			schedule := func() int64 { return max(f.store.model.tat["hot"], f.clock.Now().UnixMicro()) }
			before, calls := schedule(), f.store.reserves
			_, err := f.decide("hot", 100*time.Millisecond)
			var de *DeadlineError
			if !errors.As(err, &de) {
				f.t.Fatalf("the hot key under a deadline of 100ms while returning: %v, want a *DeadlineError", err)
			}
			if schedule() != before || f.store.reserves != calls {
				f.t.Errorf("the refused wait left Redis's schedule at %d (was %d), after %d calls: it was charged", schedule(), before, f.store.reserves-calls)
			}
			if tk := f.grant("hot", 0); tk.limiter != "redis" || tk.redis.Delay != tk.delay || tk.delay < time.Second {
				f.t.Errorf("the hot key without a deadline: %q, local delay %v, Redis's %v; want Redis to book it for its local time, over a second ahead", tk.limiter, tk.delay, tk.redis.Delay)
			}
		}},
		{"an answer that arrives after the outage began is counted locally too", tenPerSecond, 1, func(f *failoverTest) {
			f.store.during = func() {
				f.r.outcome(context.Background(), redisCall{key: "other", began: f.clock.Now(), failures: outage.ConfirmRow - 1}, errConnRefused)
			}
			tk := f.grant("k", 0)
			if tk.limiter != "redis" || tk.local == nil {
				f.t.Fatalf("the late answer: decided by %q, gate %v; want redis, gated by the outage's limiter", tk.limiter, tk.local != nil)
			}
			// share 10/s burst 1 (fleet of 1), empty at the outage: the late grant takes 100 ms, the next local one 200 ms.
			f.checkDelay("the late grant", tk.delay, 100*time.Millisecond, 100*time.Millisecond)
			f.checkDelay("the next local grant", f.grant("k", 0).delay, 200*time.Millisecond, 200*time.Millisecond)
		}},
		{"cancel during an outage gives the local tokens back and keeps the Redis booking", tenPerSecond, 1, func(f *failoverTest) {
			booked := f.grant("k", 0) // Redis: bucket of 1, now empty
			f.fail()
			first := f.grant("k", 0)
			err := f.r.giveBack(context.Background(), request{Request: store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}}, first, context.Canceled)
			if !errors.Is(err, context.Canceled) {
				f.t.Fatalf("giveBack: %v", err)
			}
			f.checkDelay("after the cancel, the next local grant", f.grant("k", 0).delay, first.delay, first.delay)
			err = f.r.giveBack(context.Background(), request{Request: store.Request{Key: "k", Costs: uniform(1, store.MaxLimits)}}, booked, context.Canceled)
			if !errors.Is(err, errNotGivenBack) || f.store.refunds != 0 {
				f.t.Errorf("a Redis booking cancelled during the outage: %v, %d refunds; want it kept, and said so", err, f.store.refunds)
			}
		}},
		{"hold during an outage holds its key alone", tenPerSecond, 1, func(f *failoverTest) {
			f.fail()
			if err := f.r.Hold(context.Background(), "held", headers.Hold{For: 2 * time.Second, Reason: "test"}); err != nil {
				f.t.Fatal(err)
			}
			f.checkDelay("the held key", f.grant("held", 0).delay, 2*time.Second, 2*time.Second)
			f.checkDelay("another key", f.grant("free", 0).delay, 100*time.Millisecond, 100*time.Millisecond)
		}},
		{"a failure while returning begins a new outage after what Redis booked", hundredPerSecond, 2, func(f *failoverTest) {
			f.fail()
			f.recover()
			var last booking
			for range 15 { // booked 200 ms ahead by the share, in Redis too
				last = f.grant("k", 0)
			}
			f.fail()
			tk := f.grant("k", 0)
			if tk.local == last.local || tk.limiter != "local" {
				f.t.Error("an outage that began while returning kept the last outage's limiter, and its share of the fleet's size then")
			}
			f.checkDelay("the next grant of the new outage", tk.delay, last.delay+20*time.Millisecond, last.delay+20*time.Millisecond)
		}},
		{"one request while returning is one EventWait", hundredPerSecond, 2, func(f *failoverTest) {
			f.fail()
			f.recover()
			f.log.events = nil
			if err := f.r.Wait(context.Background(), "cold", 1); err != nil {
				f.t.Fatal(err)
			}
			waits := 0
			for _, e := range f.log.events {
				if e.Kind == EventWait {
					waits++
				}
			}
			if waits != 1 {
				f.t.Errorf("%d EventWait for one request", waits)
			}
		}},
	} {
		t.Run(row.name, func(t *testing.T) { row.run(newFailoverTest(t, row.limit, row.fleet)) })
	}
}

// TestUnavailableErrorNamesItsCauseOnce: FailClosed's error names its key
// once, then what failed: the script and its error, with the key of the
// call when it was another's; it wraps both ErrUnavailable and the cause.
func TestUnavailableErrorNamesItsCauseOnce(t *testing.T) {
	deadline := context.DeadlineExceeded
	for _, tc := range []struct {
		cause error
		want  string
	}{
		{&store.CallError{Key: "k", Script: "reserve", Err: deadline}, `pace: key "k": Redis unavailable: reserve script: context deadline exceeded`},
		{&store.CallError{Key: "other", Script: "hold", Err: deadline}, `pace: key "k": Redis unavailable: hold script for key "other": context deadline exceeded`},
		{fmt.Errorf("wrapped: %w", &store.CallError{Key: "k", Script: "sync", Err: deadline}), `pace: key "k": Redis unavailable: sync script: context deadline exceeded`},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), `pace: key "k": Redis unavailable: dial tcp 127.0.0.1:1: connect: connection refused`},
		{nil, `pace: key "k": Redis unavailable`},
	} {
		err := error(&unavailableError{key: "k", cause: tc.cause})
		if err.Error() != tc.want {
			t.Errorf("cause %v: %q, want %q", tc.cause, err, tc.want)
		}
		if !errors.Is(err, ErrUnavailable) || (tc.cause != nil && !errors.Is(err, tc.cause)) {
			t.Errorf("cause %v: %v wraps neither ErrUnavailable nor its cause", tc.cause, err)
		}
	}
}
