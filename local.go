package pace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
	"golang.org/x/time/rate"
)

// Local paces events within one process, with one golang.org/x/time/rate
// limiter per key and limit. A key's limiters are created on first use and
// dropped within a refill period (the time an empty bucket takes to fill, at
// least a second) of being full again, when new ones would behave the same;
// so a crawler that meets millions of hosts keeps only the recently busy
// ones.
//
// A Local is safe for concurrent use. Create it with NewLocal.
type Local struct {
	namedLimits       // token buckets
	costCap     int   // the smallest burst: the most a request may cost under every limit
	openBurst   int64 // the refusals before a key's rate opened that weigh nothing (store.BucketBurst)
	cap         slotCap
	slots       *semaphore    // the slots of cap, when the quota has one
	lines       deferLines    // of the requests their class deferred
	retimes     steer.Retimes // the cuts of keys' rates (see internal/steer), in microseconds of now
	config      commonConfig
	now         func() time.Time // time.Now, or a test's clock
	// emptyAt, if set, is when the buckets of keys met later were empty, or,
	// for the keys in floors, the later time there: a Redis limiter's
	// outage starts so, lest each process burst its share on top of what
	// Redis granted just before. A map in floors is not changed once
	// stored (see addFloors).
	emptyAt time.Time
	floors  atomic.Pointer[map[string]time.Time]
	refill  time.Duration // the longest an empty bucket takes to fill
	seed    maphash.Seed
	shards  [localShards]localShard
}

// localShards spreads keys over independent locks, so that callers on
// different keys rarely wait for one another, and a sweep holds up only a
// small part of the keys.
const localShards = 32

type localShard struct {
	mu        sync.Mutex
	limiters  map[string]*localKey
	holds     map[string]time.Time // keys held until then
	nextSweep time.Time
}

// localKey is a key's limiters, one a limit, and the latest time a
// reservation was made at. x/time/rate takes a time before its last one for
// the last one and counts the time between twice, so no reservation or
// cancellation is made before it: a booking at a time ahead (the end of a
// hold, a time Redis gave) makes the ones after it begin there too.
type localKey struct {
	lims []*rate.Limiter // a limit's bucket; nil for a window
	wins []*localWindows // a fixed window's counts, nil for a bucket; nil for a quota of buckets
	last time.Time
	rate steer.Rate // after refusals the upstream gave without saying why
}

// rateNote is what a booking tells its key's rate after refusals, and
// what it found of it: again, the request is booked anew (see
// steer.Rate.Book); it listens for a success, or it was dropped, back at
// the configured rate.
type rateNote struct{ again, listening, recovered bool }

// bucketsBooked is what a Local booked for one request: a reservation a
// bucket, or none where the request was granted at once; and what it
// booked in fixed windows, if any.
type bucketsBooked struct {
	res     [store.MaxLimits]*rate.Reservation
	windows *windowsBooked
}

// windowsBooked is the start of the window each fixed window booked (zero
// for the other limits), and the costs booked there.
type windowsBooked struct {
	starts [store.MaxLimits]time.Time
	costs  store.LimitCosts
}

// NewLocal returns a Local that gives each key the quota q: a Limit, or
// several token buckets and fixed windows (FixedWindow, Daily, Monthly)
// at once with AllOf, and at most one cap of requests in flight
// (Concurrent). Sliding windows need a Redis limiter.
func NewLocal(q Quota, opts ...Option) (*Local, error) {
	all, err := checkQuota(q)
	if err != nil {
		return nil, err
	}
	limits, c := newSlotCap(all)
	for _, l := range limits {
		if l.kind == slidingWindow {
			return nil, fmt.Errorf("pace: NewLocal(%s): sliding windows need a Redis limiter; Local paces token buckets and fixed windows", l)
		}
	}
	config, err := localConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := config.validate(); err != nil {
		return nil, err
	}
	if c, err = keptCap(c, &config); err != nil {
		return nil, err
	}
	loc := newLocal(newNamedLimits(limits), config, time.Now)
	if loc.cap = c; c.capped {
		loc.slots = newSemaphore(config.lease, loc.now, config.observer, localLimiter)
	}
	return loc, nil
}

// newLocal returns a Local of valid token buckets and configuration, on a
// clock.
func newLocal(limits namedLimits, config commonConfig, now func() time.Time) *Local {
	loc := &Local{namedLimits: limits, config: config, now: now, seed: maphash.MakeSeed(), costCap: smallestBurst(limits.limits),
		openBurst: int64(store.BucketBurst(storeLimits(limits.limits, now)))}
	for _, l := range limits.limits {
		if l.kind == bucket { // a window's key goes once its windows are over
			loc.refill = max(loc.refill, time.Duration(l.burst)*time.Duration(float64(l.period)/l.count))
		}
	}
	for i := range loc.shards {
		loc.shards[i].limiters = make(map[string]*localKey)
		loc.shards[i].holds = make(map[string]time.Time)
	}
	return loc
}

// Wait implements Limiter. It books cost tokens for key under every limit
// and sleeps until they are due; if ctx ends first, the tokens go back to
// the buckets. On a quota with a cap in flight, a caller that holds no slot
// of key (see WithSlot) takes one for the wait, and frees it once granted.
func (loc *Local) Wait(ctx context.Context, key string, cost int) error {
	if loc.cap.needsSlot(ctx, key) {
		return waitWithSlot(ctx, loc, key, cost)
	}
	var w localBooking
	return loc.waitFor(ctx, target{key: key}, cost, &w)
}

// waitGrant implements backend.
func (loc *Local) waitGrant(ctx context.Context, key string, cost int) (grant, error) {
	return loc.waitOn(ctx, target{key: key}, cost)
}

// waitOn waits as waitGrant does, on at (see target).
func (loc *Local) waitOn(ctx context.Context, at target, cost int) (grant, error) {
	if loc.cap.capped {
		if err := loc.checkCap(ctx, at); err != nil {
			return grant{}, err
		}
	}
	g := grant{booking{limiter: localLimiter, local: loc}}
	err := loc.waitFor(ctx, at, cost, &g.booking.localBooking)
	return g, err
}

// checkCap refuses a wait on at that the quota's cap in flight does not
// allow: one of a pool, or one whose caller holds no slot of its key.
func (loc *Local) checkCap(ctx context.Context, at target) error {
	if at.pool != nil {
		return errPoolCapped(at)
	}
	return loc.cap.check(ctx, at.key)
}

// admit implements backend: under a cap in flight, a slot of key's cap, in
// line if it must, then the wait; else the wait alone.
func (loc *Local) admit(ctx context.Context, at target, cost int) (*Slot, grant, error) {
	if loc.cap.capped && at.pool == nil {
		return slotThenWait(ctx, loc, at.key, cost)
	}
	g, err := loc.waitOn(ctx, at, cost)
	return nil, g, err
}

// waitFor waits as Wait does, by a caller that needs no slot, and puts
// what it booked in w.
func (loc *Local) waitFor(ctx context.Context, at target, cost int, w *localBooking) error {
	if err := checkWait(ctx, loc.costCap, at.key, cost); err != nil || !loc.cap.rated {
		return err
	}
	costs := uniform(cost, len(loc.limits))
	return loc.wait(ctx, at, &costs, false, w)
}

// Acquire waits for a slot of key's cap in flight, then for cost under the
// quota's rate limits, as Redis.Acquire does. It takes one of the slots of the quota's
// cap in this process, first come first served, then waits for cost as
// Wait does.
func (loc *Local) Acquire(ctx context.Context, key string, cost int) (*Slot, error) {
	if err := checkWait(ctx, loc.costCap, key, cost); err != nil {
		return nil, err
	}
	return acquire(ctx, loc, key, cost)
}

// TakeSlot waits for a slot of key's cap, as Redis.TakeSlot does: one of the slots of the quota's cap in this
// process, first come first served.
func (loc *Local) TakeSlot(ctx context.Context, key string) (*Slot, error) {
	if !loc.cap.capped {
		return nil, nil
	}
	return loc.slots.acquire(ctx, key, loc.cap.limit.burst)
}

// Reserve waits as Wait does, for the estimated
// costs under each limit.
func (loc *Local) Reserve(ctx context.Context, key string, estimate Costs) (*Reservation, error) {
	return loc.reserveFor(ctx, target{key: key}, estimate)
}

// reserveFor implements backend.
func (loc *Local) reserveFor(ctx context.Context, at target, estimate Costs) (*Reservation, error) {
	costs, err := loc.checkReserve(ctx, at.key, estimate)
	if err == nil && loc.cap.capped {
		err = loc.checkCap(ctx, at)
	}
	if err != nil {
		return nil, err
	}
	r := &Reservation{limiter: loc, estimate: costs, booked: booking{limiter: localLimiter, local: loc}}
	if err := loc.wait(ctx, at, &costs, true, &r.booked.localBooking); err != nil {
		return nil, err
	}
	r.key = r.booked.key // at's, or the pool's key booked
	return r, nil
}

// Settle settles r with the actual costs (see Reservation): the difference between actual and the
// reservation's estimate is charged to key's buckets, or given back (never
// beyond full), now.
func (loc *Local) Settle(ctx context.Context, r *Reservation, actual Costs) error {
	costs, err := loc.checkSettle(loc, r, actual)
	if err != nil {
		return loc.settleFailed(ctx, loc.config.observer, localLimiter, loc, r, err)
	}
	if !r.settled.CompareAndSwap(false, true) {
		return nil
	}
	loc.capDebts(ctx, loc.config.observer, localLimiter, r, &costs, loc.config.maxHold)
	loc.settle(r.key, &r.booked.localBooking.buckets, r.estimate, costs, loc.now())
	return loc.settled(ctx, loc.config.observer, localLimiter, r.key, &r.estimate, &costs, nil)
}

// wait books costs on at (see target) and sleeps until they are due,
// booking anew after a hold that came meanwhile, or a cut of the key's
// rate, and puts what it booked in w. reserved says it is a reservation's
// wait.
func (loc *Local) wait(ctx context.Context, at target, costs *store.LimitCosts, reserved bool, w *localBooking) error {
	o := loc.config.observer
	for turn, again := false, false; ; {
		horizon := horizonOf(ctx, &loc.config, loc.limits, costs)
		if turn {
			horizon *= 2 // see Class
		}
		now := loc.now()
		own := waitBudget(ctx, loc.config.maxWait, now)
		w.start = now
		note := rateNote{again: again}
		key, delay, ok := loc.reserveOn(at, costs, now, classBudget(own, horizon), &w.buckets, &note)
		w.key = key
		if note.recovered {
			reportRate(ctx, loc.config.observer, localLimiter, key, steer.Full, 0)
		}
		if !ok && defers(delay, own, horizon) {
			if err := loc.deferInLine(ctx, loc.asked(o, localLimiter, key, costs, reserved), costs, delay-horizon, own, horizon); err != nil {
				return err
			}
			turn, w.buckets = true, bucketsBooked{}
			continue
		}
		if !ok {
			e := loc.asked(o, localLimiter, key, costs, reserved)
			e.DryRun = loc.config.dryRun
			if err := refuse(ctx, o, e, delay, classBudget(own, horizon)); !e.DryRun {
				return err
			}
			return nil // a dry run's refusal, as the event says
		}
		w.delay, w.listening = delay, note.listening
		if o != nil { // the event is built for an observer alone: the path without one stays as quick as rate.Limiter's
			e := loc.asked(o, localLimiter, key, costs, reserved)
			e.Kind, e.Delay, e.DryRun = EventWait, delay, loc.config.dryRun
			o(ctx, e)
		}
		if loc.config.dryRun {
			return nil
		}
		switch err := sleepUnlessRetimed(ctx, &loc.retimes, key, delay, now.UnixMicro()); {
		case errors.Is(err, steer.ErrRetimed):
			loc.cancel(key, w.buckets, loc.now())
			// The key's rate was cut while this caller slept, which took
			// its booking as gone: it is counted anew.
			w.buckets, again = bucketsBooked{}, false
			continue
		case err != nil:
			loc.cancel(key, w.buckets, loc.now())
			e := loc.asked(o, localLimiter, key, costs, reserved)
			e.Kind, e.Delay, e.Err = EventCancel, delay, err
			o.emit(ctx, e)
			return err
		}
		if delay == 0 || !loc.heldPast(key, now.Add(delay)) {
			return nil
		}
		// A hold came while this caller slept, and its time lies before
		// the hold's end: it books anew, after the hold.
		w.buckets, again = bucketsBooked{}, true
	}
}

// deferInLine waits for the turn of a request (asked) its class kept out of
// its key's schedule, whose wait comes within its horizon after earliest,
// at the end of the key's line (see Redis.deferInLine). A turn past the
// caller's budget (own) is refused at once.
func (loc *Local) deferInLine(ctx context.Context, asked Event, costs *store.LimitCosts, earliest, own, horizon time.Duration) error {
	retry := loc.lines.lineUp(asked.Key, loc.now(), earliest, refillOf(loc.limits, costs))
	if retry+horizon > own {
		return refuse(ctx, loc.config.observer, asked, retry+horizon, own)
	}
	return sleepDeferred(ctx, loc.config.observer, asked, retry)
}

// reserveOn books costs, as reserve does from now, on at: its key, or,
// for a pool, the first of its keys, asked from its first on, that can go
// at once, else the one that can go soonest (the earlier asked on a tie;
// see lua/pick.lua). It returns the key it booked, or would have.
func (loc *Local) reserveOn(at target, costs *store.LimitCosts, now time.Time, budget time.Duration, b *bucketsBooked, note *rateNote) (string, time.Duration, bool) {
	if at.pool == nil {
		delay, ok := loc.reserve(at.key, costs, now, now, budget, b, note)
		return at.key, delay, ok
	}
	best, soonest := "", time.Duration(math.MaxInt64)
	for j := range at.pool {
		key := at.pool[(at.first+j)%len(at.pool)]
		// Within no budget, only a grant at once books anything.
		if delay, ok := loc.reserve(key, costs, now, now, -1, b, nil); ok {
			return key, delay, true
		} else if delay < soonest {
			best, soonest = key, delay
		}
	}
	delay, ok := loc.reserve(best, costs, now, now, budget, b, note)
	return best, delay, ok
}

// reserve books costs for key at notBefore or later (and after any hold,
// as the key's rate after refusals allows), under every limit at once,
// puts the reservations in b, and returns the delay from now until they
// are due. When that delay would exceed budget, it books nothing and
// returns false with the delay. Where a request is granted at once, there
// is no reservation to give back. note, if not nil, hears what the booking
// found of the key's rate.
func (loc *Local) reserve(key string, costs *store.LimitCosts, now, notBefore time.Time, budget time.Duration, b *bucketsBooked, note *rateNote) (delay time.Duration, ok bool) {
	shard := loc.shard(key)
	shard.mu.Lock()
	defer shard.mu.Unlock()
	k := shard.limiter(loc, key, now)
	// x/time/rate forgets a time ahead of now unless the reservation is
	// made at it: the booking begins at the latest of now, notBefore, the
	// end of a hold and the key's last reservation.
	at := latest(k.last, notBefore)
	if len(shard.holds) > 0 {
		at = latest(at, shard.holds[key])
	}
	var unit int64 // what the key's rate after refusals measures costs by
	if k.rate.On() {
		at, unit = loc.underRate(k, costs, now, at, note)
	}
	if !at.After(now) {
		at, k.last = now, now
		if k.allowAll(now, costs) {
			delay, ok = 0, true
		}
	}
	if !ok {
		delay, ok = k.book(costs, now, at, budget, b)
	}
	if ok && unit > 0 {
		k.rate.Book(now.UnixMicro(), now.Add(delay).UnixMicro(), unit, note != nil && note.again)
	}
	return delay, ok
}

// underRate returns the earliest time from at that k's rate after refusals
// lets a request of costs go, booked at now, and what the rate measures it
// by (see rateUnit); note, if not nil, hears what it found of the rate.
func (loc *Local) underRate(k *localKey, costs *store.LimitCosts, now, at time.Time, note *rateNote) (time.Time, int64) {
	us := now.UnixMicro()
	if note != nil {
		note.recovered, note.listening = k.rate.Recovered(us), k.rate.Listening()
	}
	unit := rateUnit(costs, len(loc.limits), func(i int) int64 { return loc.intervals[i] })
	return latest(at, time.UnixMicro(k.rate.Allow(us, at.UnixMicro(), unit))), unit
}

// book books costs under every limit of k at once, at the first time from
// at when each has them, unless that is beyond budget from now. The caller
// holds the shard's lock, so nobody else books on k meanwhile.
func (k *localKey) book(costs *store.LimitCosts, now, at time.Time, budget time.Duration, b *bucketsBooked) (delay time.Duration, ok bool) {
	due := at // when every limit has its cost
	for i, lim := range k.lims {
		if lim == nil {
			continue
		}
		if short := float64(costs[i]) - lim.TokensAt(at); short > 0 {
			due = latest(due, at.Add(time.Duration(math.Ceil(short/float64(lim.Limit())*float64(time.Second)))))
		}
	}
	due, fits := k.fitWindows(costs, due)
	if !fits {
		return max(due.Sub(now), store.MaxDelay+time.Second), false // no window within reach: beyond any wait
	}
	if delay = due.Sub(now); delay > budget {
		return delay, false
	}
	for i, lim := range k.lims {
		switch {
		case costs[i] == 0:
		case lim == nil:
			if b.windows == nil {
				b.windows = new(windowsBooked)
			}
			b.windows.starts[i], b.windows.costs[i] = k.wins[i].add(due, costs[i], now), costs[i]
		default:
			b.res[i] = lim.ReserveN(due, costs[i])
			delay = max(delay, b.res[i].DelayFrom(now))
			k.last = due // a window counts by its own time: only a bucket needs it
		}
	}
	return delay, true
}

// allowAll grants costs at now under every limit when each has them, and
// reports whether it did.
func (k *localKey) allowAll(now time.Time, costs *store.LimitCosts) bool {
	if k.wins != nil {
		return false // a window's count: book
	}
	if len(k.lims) == 1 {
		return k.lims[0].AllowN(now, costs[0])
	}
	for i, lim := range k.lims {
		if lim.TokensAt(now) < float64(costs[i]) {
			return false
		}
	}
	for i, lim := range k.lims {
		lim.AllowN(now, costs[i])
	}
	return true
}

// cancel gives back booking b of key, at now or, if that is earlier, at the
// key's last reservation time.
func (loc *Local) cancel(key string, b bucketsBooked, now time.Time) {
	shard := loc.shard(key)
	shard.mu.Lock()
	defer shard.mu.Unlock()
	if k, ok := shard.limiters[key]; ok {
		k.last = latest(now, k.last)
		for i, r := range b.res {
			if r != nil {
				r.CancelAt(k.last)
			}
			if b.windows != nil && !b.windows.starts[i].IsZero() {
				k.wins[i].giveBack(b.windows.starts[i], b.windows.costs[i], now)
			}
		}
	}
}

// trimQueues takes out of k's buckets, at now, the queue booked beyond
// what a refusal keeps (steer.Kept; wake: it wakes the sleepers, cut: it
// cut the rate), as lua/refused.lua's trim_queues does, and returns the
// due time past which a booking is no longer whole in them, zero when it
// took nothing. Each bucket (of interval intervals[i]) is emptied anew at
// that time, the latest of theirs: a bucket that keeps less keeps as much
// as the others here, never more than Redis's.
func (k *localKey) trimQueues(now time.Time, intervals []int64, wake, cut bool) time.Time {
	var whole time.Duration // how far ahead of now a bucket keeps whole bookings
	for i, lim := range k.lims {
		if lim != nil {
			burst := int64(lim.Burst()) * intervals[i]
			whole = max(whole, time.Duration(steer.Kept(burst, wake, cut, false)-burst)*time.Microsecond)
		}
	}
	after := now.Add(whole)
	if !k.last.After(after) {
		return time.Time{}
	}
	for i, lim := range k.lims {
		if lim != nil { // a window's bookings are given back whole
			k.lims[i] = rate.NewLimiter(lim.Limit(), lim.Burst())
			k.lims[i].AllowN(after, lim.Burst())
		}
	}
	k.last = after
	return after
}

// settle charges key's buckets, at now or its last reservation time, with
// the difference between actual and estimate under each limit: a debt (of
// a burst at most: see capDebts), or a credit that fills the bucket at most;
// and the windows b booked (the window of now, when it booked none) with it,
// never below zero.
func (loc *Local) settle(key string, b *bucketsBooked, estimate, actual store.LimitCosts, now time.Time) {
	shard := loc.shard(key)
	shard.mu.Lock()
	defer shard.mu.Unlock()
	k := shard.limiter(loc, key, now)
	k.last = latest(now, k.last)
	for i, lim := range k.lims {
		switch diff := actual[i] - estimate[i]; {
		case lim == nil:
			k.wins[i].add(cmp.Or(b.windows.start(i), now), diff, now)
		case diff > 0:
			// A reservation may not exceed the burst: for the time of the
			// debt, the burst is the debt.
			burst := lim.Burst()
			lim.SetBurstAt(k.last, diff)
			lim.ReserveN(k.last, diff)
			lim.SetBurstAt(k.last, burst)
		case diff < 0:
			lim.ReserveN(k.last, diff) // a negative reservation gives tokens back, up to the burst
		}
	}
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (loc *Local) shard(key string) *localShard {
	return &loc.shards[maphash.String(loc.seed, key)%localShards]
}

// Len returns how many keys have a limiter at the moment.
func (loc *Local) Len() int {
	n := 0
	for i := range loc.shards {
		s := &loc.shards[i]
		s.mu.Lock()
		n += len(s.limiters)
		s.mu.Unlock()
	}
	return n
}

// heldPast reports whether key is held beyond due: a booking at due was
// made before the hold.
func (loc *Local) heldPast(key string, due time.Time) bool {
	s := loc.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	until, held := s.holds[key]
	return held && due.Before(until)
}

// limiter returns key's limiters, creating them if needed. Once per refill
// period (at least a second) it first drops the keys whose buckets are all
// full again, since new ones would behave the same. The caller holds s.mu.
func (s *localShard) limiter(loc *Local, key string, now time.Time) *localKey {
	if !now.Before(s.nextSweep) {
		for name, k := range s.limiters {
			if !k.last.After(now) && k.full(now) && !k.rate.On() {
				delete(s.limiters, name)
			}
		}
		for k, until := range s.holds {
			if !until.After(now) {
				delete(s.holds, k)
			}
		}
		s.nextSweep = now.Add(max(loc.refill, time.Second))
	}
	k, ok := s.limiters[key]
	if !ok {
		k = &localKey{lims: make([]*rate.Limiter, len(loc.limits))}
		if until, held := s.holds[key]; held {
			k.rate.Held(until.UnixMicro())
		}
		if !loc.emptyAt.IsZero() {
			k.last = latest(loc.emptyAt, (*loc.floors.Load())[key])
		}
		for i, l := range loc.limits {
			if l.kind == fixedWindow {
				if k.wins == nil {
					k.wins = make([]*localWindows, len(loc.limits))
				}
				k.wins[i] = &localWindows{limit: l}
				continue
			}
			k.lims[i] = rate.NewLimiter(rate.Limit(l.Rate()), l.burst)
			if !k.last.IsZero() {
				k.lims[i].AllowN(k.last, l.burst)
			}
		}
		s.limiters[key] = k
	}
	return k
}

// full reports whether every bucket of the key is full at now.
func (k *localKey) full(now time.Time) bool {
	for i, lim := range k.lims {
		if lim == nil && !k.wins[i].empty(now) || lim != nil && lim.TokensAt(now) < float64(lim.Burst()) {
			return false
		}
	}
	return true
}

// Allow reports whether cost units for key can go now, and books them if
// so, as Redis.Allow does.
func (loc *Local) Allow(ctx context.Context, key string, cost int) (bool, error) {
	return allow(ctx, loc, key, cost)
}

// unsettled implements backend.
func (loc *Local) unsettled(ctx context.Context, res *Reservation) {
	loc.settleFailed(ctx, loc.config.observer, localLimiter, loc, res, errBodyCollected)
}

// MaxCost returns the largest cost a wait can be granted: the smallest
// burst, or window count, of the quota's limits. NewRules refuses a Rule
// whose Cost is larger.
func (loc *Local) MaxCost() int { return loc.costCap }

// longestHold implements backend.
func (loc *Local) longestHold() time.Duration { return loc.config.maxHold }

// heed implements backend: it applies w, what the response to the request
// granted as g said, past ctx's end: the holds, then a refusal that
// neither explains to the key's rate, or a success it listens for (see
// internal/steer). Local is not steered by counters. A dry run heeds
// nothing.
func (loc *Local) heed(ctx context.Context, key string, g grant, w headers.Word, o heedScope) {
	if loc.config.dryRun {
		return // see WithDryRun
	}
	ctx = context.WithoutCancel(ctx)
	before := heldBefore(w, func(h headers.Hold) (int64, error) { return loc.hold(ctx, key, h) })
	if o.refusals && g.booking.local == loc {
		loc.heedRate(ctx, key, g.booking, w, before)
	}
}

// heedRate tells key's rate what became of the request booked as t, as w
// says: refused without counters that explain it (after w's holds, the one
// before them ending at before), or served while the rate listens for a
// success.
func (loc *Local) heedRate(ctx context.Context, key string, t booking, w headers.Word, before int64) {
	served := !w.Refused && t.listening
	if !served && (!w.Refused || loc.namedLimits.explains(w)) {
		return
	}
	now := loc.now()
	shard := loc.shard(key)
	shard.mu.Lock()
	k := shard.limiter(loc, key, now)
	if served {
		k.rate.Served(t.start.UnixMicro())
		shard.mu.Unlock()
		return
	}
	cut, wake := k.rate.Refused(now.UnixMicro(), t.start.UnixMicro(), loc.openBurst, before)
	var after time.Time
	if wake || cut {
		after = k.trimQueues(now, loc.intervals, wake, cut)
	}
	if !wake && !after.IsZero() {
		k.rate.Trim(after.UnixMicro(), now.UnixMicro())
	}
	fraction := k.rate.Bottom()
	shard.mu.Unlock()
	switch {
	case wake:
		loc.retimes.Add(key, now.UnixMicro(), 0, true, now) // its sleepers book anew
	case !after.IsZero():
		loc.retimes.Add(key, now.UnixMicro(), after.UnixMicro(), true, now) // those booked past after
	}
	if cut {
		reportRate(ctx, loc.config.observer, localLimiter, key, fraction, w.Status)
	}
}

// headers.Hold pauses key: no wait for key ends sooner than h.For from now,
// capped at the limiter's MaxHold (see WithMaxHold); a hold of a quota that
// none of the limits is (see Hold.Quota) holds nothing.
func (loc *Local) Hold(ctx context.Context, key string, h headers.Hold) error {
	_, err := loc.hold(ctx, key, h)
	return err
}

// hold is Hold; it also returns when key's hold before this one ended, in
// microseconds (0 for none), which a refusal's weight looks back at (see
// internal/steer's Rate.Refused).
func (loc *Local) hold(ctx context.Context, key string, h headers.Hold) (before int64, err error) {
	h, holds, err := loc.config.hold(loc.namedLimits, key, h)
	if err != nil || !holds {
		return 0, err
	}
	now := loc.now()
	until := now.Add(h.For)
	shard := loc.shard(key)
	shard.mu.Lock()
	was, held := shard.holds[key]
	if held {
		before = was.UnixMicro()
	}
	changed := !was.After(until)
	if changed {
		shard.holds[key] = until
		if k, ok := shard.limiters[key]; ok {
			k.rate.Held(until.UnixMicro())
		}
	}
	shard.mu.Unlock()
	reportHold(ctx, loc.config.observer, localLimiter, key, h, changed)
	return before, nil
}

// addFloors adds floors to loc's, the later time of each key: a limiter
// that joins loc's outage had booked them in Redis.
func (loc *Local) addFloors(floors map[string]time.Time) {
	if len(floors) == 0 {
		return
	}
	merged := maps.Clone(*loc.floors.Load())
	if merged == nil {
		merged = make(map[string]time.Time, len(floors))
	}
	for key, t := range floors {
		merged[key] = latest(merged[key], t)
	}
	loc.floors.Store(&merged)
}
