package pace

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/outage"
)

// Token leases: a key this process waits on often (demandHot waits in a
// demandWindow: 800 a second) takes its tokens from Redis several at a
// time, one script call a lease (see lua/tokenlease.lua), and hands them
// out itself, without a lock, within the lease's span. A leased token is a
// granted token: the fleet stays within b + r*t exactly; a token not
// handed out in time lapses. A key held, cut by refusals, steered by
// counters or paced at different limits across the fleet gets no lease
// and books one request at a time, as do waits under a cap, on a pool, in
// a class, of a reservation and in a dry run. While Redis is away, a key
// spends the lease in hand, then its fallback.

const (
	// leasePeriod is how long of this process's demand for a key one
	// lease holds.
	leasePeriod = 20 * time.Millisecond
	// leaseMinTokens is the smallest lease worth a call: a key whose
	// demand fills less books one request at a time.
	leaseMinTokens = 8
	// leaseMinSpan is the shortest span worth a lease: a bucket whose
	// burst refills faster leases nothing.
	leaseMinSpan = time.Millisecond
	// leasePause is how long a key that got no lease books one request
	// at a time before it asks for one again.
	leasePause = 250 * time.Millisecond
	// demandWindow is the span over which the waits on keys not leased
	// are counted; a key with demandHot of them in one takes leases: twice
	// leaseMinTokens a leasePeriod, so that a burst at the start of a
	// slower key's traffic does not.
	demandWindow = 100 * time.Millisecond
	demandHot    = 2 * leaseMinTokens * int(demandWindow/leasePeriod)
	// demandKeys is the most keys counted in one demandWindow.
	demandKeys = 4096
	// leaseIdle is how long a key's leases stay idle before the key is
	// forgotten, its demand counted anew.
	leaseIdle = time.Second
)

// tokenLeases are a Redis limiter's leases of tokens: for each key whose
// demand is high, its keyLeases; for the others, their demand so far.
type tokenLeases struct {
	demand  demand
	keys    sync.Map // key -> *keyLeases
	refills sync.WaitGroup
	swept   atomic.Int64 // UnixNano of the last sweep
}

// sweep forgets, once a leaseIdle at most, the keys whose leases have
// been idle that long, so that a process keeps no memory for keys that
// were hot once.
func (t *tokenLeases) sweep(now time.Time) {
	last := t.swept.Load()
	if now.UnixNano()-last < int64(leaseIdle) || !t.swept.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	t.keys.Range(func(key, v any) bool {
		if v.(*keyLeases).idle(now) {
			t.keys.CompareAndDelete(key, v)
		}
		return true
	})
}

// demand counts the waits on each key in the current demandWindow.
type demand struct {
	mu     sync.Mutex
	start  time.Time
	counts map[string]int
}

// hot counts a wait on key at now, and reports the key's rate once it is
// high enough to lease (0 until then).
func (d *demand) hot(key string, now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now.Sub(d.start) >= demandWindow || d.counts == nil {
		d.start, d.counts = now, make(map[string]int)
	}
	n, ok := d.counts[key]
	if !ok && len(d.counts) >= demandKeys {
		return 0
	}
	d.counts[key] = n + 1
	if n+1 < demandHot {
		return 0
	}
	delete(d.counts, key)
	return float64(n+1) / demandWindow.Seconds()
}

// keyLeases are the leases of one key: the one handed out now, the one
// prefetched behind it, and the one call under way for more.
type keyLeases struct {
	cur      atomic.Pointer[tokenLease]
	asked    atomic.Int64 // tokens waited for since measured, leased or not
	mu       sync.Mutex
	next     *tokenLease
	refill   chan struct{} // closed when the call under way ends; nil when none
	measured time.Time
	rate     float64       // tokens a second this process waits for
	rtt      time.Duration // the last lease call's round trip
	late     bool          // its reply came too late to hand a token out, and the one before did not
	paused   time.Time     // no lease asked before then
}

// idle reports whether k has had no lease, no call and no wait for
// leaseIdle at now.
func (k *keyLeases) idle(now time.Time) bool {
	if !k.mu.TryLock() {
		return false // in use
	}
	defer k.mu.Unlock()
	l := k.cur.Load()
	return k.refill == nil && k.next == nil && (l == nil || now.Sub(l.end) > leaseIdle) && now.Sub(k.measured) > leaseIdle
}

// A tokenLease is a number of tokens this process may hand out from begin
// to end, by its own clock.
type tokenLease struct {
	left       atomic.Int64
	size       int64
	begin, end time.Time
	redisNow   int64     // Redis's clock at arrived, in microseconds
	arrived    time.Time // when the lease's reply arrived
}

// usable reports whether l has tokens left at now, within its span.
func (l *tokenLease) usable(now time.Time) bool {
	return l != nil && !now.After(l.end) && l.left.Load() > 0
}

// take takes cost of l's tokens at now, if it has them and its span has
// not ended.
func (l *tokenLease) take(cost int64, now time.Time) bool {
	if l == nil || now.After(l.end) {
		return false
	}
	for v := l.left.Load(); v >= cost; v = l.left.Load() {
		if l.left.CompareAndSwap(v, v-cost) {
			return true
		}
	}
	return false
}

// redisTime is now on Redis's clock, in microseconds, as l's reply told it.
func (l *tokenLease) redisTime(now time.Time) int64 {
	return l.redisNow + now.Sub(l.arrived).Microseconds()
}

// leases returns key's leases when they may serve a wait of q at now:
// the key's demand is high, and nothing asks for one booking a request.
// While Redis is away, a key spends the lease in hand, and takes no new
// one (see startRefill).
func (r *Redis) leases(q request, at target, now time.Time) *keyLeases {
	if r.config.noTokenLeases || r.config.dryRun || r.cap.capped || at.pool != nil || q.horizon > 0 ||
		len(r.limits) != 1 || r.limits[0].kind != bucket {
		return nil
	}
	r.tokens.sweep(now)
	if k, ok := r.tokens.keys.Load(at.key); ok {
		return k.(*keyLeases)
	}
	if r.failover.Mode() != outage.Shared {
		return nil
	}
	rate := r.tokens.demand.hot(at.key, now)
	if rate == 0 {
		return nil
	}
	k, _ := r.tokens.keys.LoadOrStore(at.key, &keyLeases{measured: now, rate: rate})
	return k.(*keyLeases)
}

// waitLeased waits for cost of key's tokens from k's leases, and reports
// false when they have none to give in the caller's budget (or a hold
// came meanwhile): the wait books in Redis instead.
func (r *Redis) waitLeased(ctx context.Context, k *keyLeases, q request, cost int) (booking, bool, error) {
	k.asked.Add(int64(cost))
	l, now := r.leased(ctx, k, q.Key, int64(cost))
	switch {
	case l == nil && ctx.Err() != nil:
		return booking{}, true, endedBefore(ctx, q.Key)
	case l == nil:
		return booking{}, false, nil
	}
	t := booking{limiter: redisLimiter, leased: true, localBooking: localBooking{key: q.Key, delay: max(l.begin.Sub(now), 0), start: now}}
	t.redis.Now = l.redisNow // when its token was booked: a refusal of it weighs in the key's rate (see heed)
	if t.delay > waitBudget(ctx, r.config.maxWait, now) {
		l.left.Add(int64(cost)) // back to the lease: Redis refuses the wait, as it refuses any beyond the budget
		return booking{}, false, nil
	}
	e := r.asked(q, redisLimiter)
	e.Kind, e.Delay = EventWait, t.delay
	r.config.observer.emit(ctx, e)
	if err := sleep(ctx, q.Key, t.delay); err != nil {
		l.left.Add(int64(cost)) // back to the lease: no token is spent twice
		e.Kind, e.Err = EventCancel, err
		r.config.observer.emit(ctx, e)
		return booking{}, true, err
	}
	if r.held.before(q.Key, l.redisTime(r.now())) {
		// A hold this process heard of: the token lapses, and the request
		// books anew in Redis, which knows the hold.
		r.voidLeases(q.Key)
		return booking{}, false, nil
	}
	return t, true, nil
}

// leased takes cost of key's tokens from k's leases at now, and returns
// the lease, and now (nil when there is none to take).
func (r *Redis) leased(ctx context.Context, k *keyLeases, key string, cost int64) (*tokenLease, time.Time) {
	now := r.now()
	l := k.cur.Load()
	if l != nil && cost > l.size {
		return nil, now // more than a lease holds
	}
	if !l.take(cost, now) {
		if l = r.refilled(ctx, k, key, cost); l == nil {
			return nil, now
		}
		now = r.now()
	}
	if l.left.Load() < l.size/2 {
		r.prefetch(k, key)
	}
	return l, now
}

// refilled returns a lease of key's from which cost tokens were taken: the
// one prefetched, or one of the next two calls' (under way, or made);
// nil when neither serves, or ctx ends first.
func (r *Redis) refilled(ctx context.Context, k *keyLeases, key string, cost int64) *tokenLease {
	k.mu.Lock()
	defer k.mu.Unlock()
	for calls := 0; ctx.Err() == nil; {
		now := r.now()
		if l := k.cur.Load(); l.take(cost, now) {
			return l
		}
		if k.next != nil {
			k.cur.Store(k.next)
			k.next = nil
			continue
		}
		if calls == 2 {
			return nil // others took them, or cost is more than a lease holds
		}
		if k.refill == nil && !r.startRefill(k, key, now) {
			if k.rate == 0 {
				r.tokens.keys.CompareAndDelete(key, k) // its demand fell: counted anew
			}
			return nil
		}
		done := k.refill
		k.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		k.mu.Lock()
		calls++
	}
	return nil
}

// prefetch asks for key's next lease before its current one runs out,
// unless one is there or under way.
func (r *Redis) prefetch(k *keyLeases, key string) {
	if !k.mu.TryLock() {
		return // its holder is refilling, or asking whether to
	}
	defer k.mu.Unlock()
	if k.next == nil && k.refill == nil {
		r.startRefill(k, key, r.now())
	}
}

// startRefill starts the call for key's next lease, with k.mu held, and
// reports false when the key asks for none now: it got none of late,
// Redis is away, or its demand fell (then k.rate is 0).
func (r *Redis) startRefill(k *keyLeases, key string, now time.Time) bool {
	n, span := r.leaseSize(k, now)
	if n == 0 || now.Before(k.paused) || r.failover.Mode() != outage.Shared {
		return false
	}
	done := make(chan struct{})
	k.refill = done
	r.tokens.refills.Go(func() {
		l, rtt, late := r.leaseTokens(key, n, span)
		k.mu.Lock()
		defer k.mu.Unlock()
		k.rtt, k.late = rtt, late && !k.late
		switch {
		case k.late:
			// One reply too late to hand a token out: a stall, as a busy
			// machine has; the next wait asks again, allowing for it.
		case l == nil:
			k.paused = r.now().Add(leasePause)
		case k.cur.Load().usable(r.now()):
			k.next = l
		default:
			k.cur.Store(l)
		}
		k.refill = nil
		close(done)
	})
	return true
}

// leaseSize is the size and span of key's next lease, by the rate its
// waits came at of late (0 when too low to lease, or before the fleet is
// counted): a leasePeriod of it, at most a share of half the burst as the
// fleet is counted; its span two leasePeriods, or two round trips to Redis
// on a slow link, within what the burst allows. A rate that falls below
// leaseMinTokens a leasePeriod is 0.
func (r *Redis) leaseSize(k *keyLeases, now time.Time) (n int64, span time.Duration) {
	if elapsed := now.Sub(k.measured); elapsed >= leasePeriod {
		k.rate = (k.rate + float64(k.asked.Swap(0))/elapsed.Seconds()) / 2
		k.measured = now
	}
	if k.rate*leasePeriod.Seconds() < leaseMinTokens {
		k.rate = 0
	}
	l := r.limits[0]
	n = min(int64(k.rate*leasePeriod.Seconds()), int64(l.burst/(2*r.fleet.Size())))
	span = min(max(2*leasePeriod, 2*k.rtt), time.Duration(int64(l.burst)*3/4-n)*time.Duration(l.intervalMicros())*time.Microsecond)
	if n < leaseMinTokens || span < leaseMinSpan || !r.fleet.counted() {
		return 0, 0
	}
	return n, span
}

// leaseTokens asks Redis for a lease of n of key's tokens for span, and
// returns it and the call's round trip (nil for none: the key gets none,
// the call failed, which the next booking in Redis finds out, or, late,
// its reply came too late to hand any token out within the span).
func (r *Redis) leaseTokens(key string, n int64, span time.Duration) (l *tokenLease, rtt time.Duration, late bool) {
	ctx := context.Background()
	sent := r.now()
	budget := time.Second
	if r.config.maxWait > 0 {
		budget = min(budget, r.config.maxWait)
	}
	got, err := r.store.LeaseTokens(ctx, key, n, span, budget)
	arrived := r.now()
	rtt = arrived.Sub(sent)
	if err != nil || got.Tokens == 0 {
		return nil, rtt, false
	}
	r.beat(ctx, got.Now, arrived)
	l = &tokenLease{size: got.Tokens, begin: arrived.Add(got.Begin), end: arrived.Add(got.End - rtt), redisNow: got.Now, arrived: arrived}
	if l.end.Sub(l.begin) < leaseMinSpan {
		return nil, rtt, true // its tokens lapse: the next span allows for the round trip
	}
	l.left.Store(got.Tokens)
	return l, rtt, false
}

// voidLeases drops key's leases, if any, whose tokens left lapse, and
// makes it book in Redis for a while: a hold or a retime reached the
// fleet, or a response steered the key.
func (r *Redis) voidLeases(key string) {
	v, ok := r.tokens.keys.Load(key)
	if !ok {
		return
	}
	k := v.(*keyLeases)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cur.Store(nil)
	k.next = nil
	k.paused = r.now().Add(leasePause)
}
