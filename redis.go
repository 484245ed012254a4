package pace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/outage"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// Redis paces events for a whole fleet: every process whose Redis limiter
// uses the same Redis, prefix and key draws on one bucket. Each decision is
// one script call (a Redis Function, or EVALSHA where Redis has none) that reads
// Redis's clock, books the caller's tokens and returns the exact wait; the
// caller then sleeps on one timer. Callers are served in the order their calls
// reach Redis.
//
// For a key, the script keeps the bucket at prefix{key} (a schedule time in
// integer microseconds) and, only after cancellations, prefix{key}#gaps.
// Both expire once the bucket is full again; the braces make them one Redis
// Cluster hash slot.
//
// When Redis fails (no answer within the call timeout, a dead connection,
// an error such as OOM, BUSY or LOADING), the limiter decides by its
// FailurePolicy, by default pacing locally at this process's share of the
// limit, and leaves Redis alone for a cool-down before one request probes it
// again; the shared limit resumes by itself when a probe succeeds. Bookings
// made before a switch are kept: their callers go at the time they were
// given.
//
// Check, at start, says whether Redis answers and counts the fleet
// before the first request.
//
// A Redis is safe for concurrent use. Create it with NewRedis.
type Redis struct {
	namedLimits
	id          string // names this limiter's requests in Redis (see Process.newLimiterID)
	fallbackKey string // names its fleet and quota among the process's outage limiters
	client      redis.Scripter
	costCap     int // the smallest burst or window count of the limits: the most a request may cost under every limit
	config      redisConfig
	now         func() time.Time // time.Now, or a test's clock
	calls       *store.Caller
	store       sharedStore
	failover    *outage.Failover[*Local]
	fleet       *fleet
	tokens      tokenLeases // the keys whose demand takes their tokens several at a time

	cap           slotCap        // the quota's cap in flight, if any
	slotCap       *store.SlotCap // the cap, as its calls to Redis name it
	slotWaiters   slotWaiters    // this process's requests in line for a slot
	fallbackSlots *semaphore     // slots of this process's share of the cap while Redis is away
	held          heldKeys       // the fleet's holds this process heard of
	mismatches    mismatches     // when this process last reported each key's disagreement
	retimes       steer.Retimes  // the fleet's retimes this process heard of
	syncs         steer.Throttle // when each key may be steered next
	windows       steer.Windows  // the quotas that say they refill and count down as windows
	phases        steer.Phases   // the windows that state their resets in whole seconds
	resubscribed  atomic.Int64   // UnixNano of the hold channel's last subscription after a break; MaxInt64 while broken; 0 before any break
	listenOnce    sync.Once
	stopListening func()
	listening     sync.WaitGroup
}

// sharedStore is what a Redis limiter asks of Redis: a *store, or a test's
// fake.
type sharedStore interface {
	Reserve(ctx context.Context, q store.Request, budget, notBefore time.Duration) (store.Booking, error)
	NewCall() uint64
	Refund(ctx context.Context, key string, b store.Booking) ([store.MaxLimits]store.RefundResult, int64, error)
	Settle(ctx context.Context, key string, b store.Booking, actual store.LimitCosts) (settled bool, now int64, err error)
	Sync(ctx context.Context, key string, b store.Booking, steers []store.Steer, refused bool, channel string) (store.SyncReply, error)
	Hold(ctx context.Context, key string, d time.Duration, channel string) (changed bool, end, before int64, err error)
	Slots(ctx context.Context, key string, c store.SlotCall) (store.SlotsReply, error)
	Line(ctx context.Context, key string, earliest, turn time.Duration) (time.Duration, error)
	HeldUntil(ctx context.Context, key string) (int64, error)
	Refused(ctx context.Context, key string, b store.Booking, served bool, before int64, channel string) (fraction, now int64, err error)
	Repay(ctx context.Context, key string, debt store.LimitCosts, lastTurn time.Duration, shares int) (took store.LimitCosts, err error)
	Check(ctx context.Context) (now int64, err error)
	Announce(ctx context.Context, key string) error
	LeaseTokens(ctx context.Context, key string, n int64, span, budget time.Duration) (store.TokenLease, error)
}

// NewRedis returns a Redis limiter that gives each key the quota q (a Limit,
// or several at once with AllOf), shared through client. Any go-redis client
// serves: *redis.Client, *redis.ClusterClient, *redis.Ring, a Sentinel
// failover client, or any redis.UniversalClient. NewRedis does not contact
// Redis.
func NewRedis(client redis.Scripter, q Quota, opts ...Option) (*Redis, error) {
	return newRedisOn(client, q, time.Now, opts...)
}

// newRedisOn is NewRedis on the clock now: time.Now, or a test's.
func newRedisOn(client redis.Scripter, q Quota, now func() time.Time, opts ...Option) (*Redis, error) {
	if client == nil {
		return nil, errors.New("pace: NewRedis: nil client")
	}
	r, err := newRedis(q, now, opts...)
	if err != nil {
		return nil, err
	}
	r.client = client
	r.fallbackKey = fallbackKey(client, r.config.prefix, r.config.fleetName, r.limits)
	r.calls = store.NewCaller(client, r.config.callTimeout)
	r.failover.CountAnswers(&r.calls.Answers)
	r.store = store.New(r.calls, r.config.prefix, r.id, storeLimits(r.limits, r.now))
	return r, nil
}

// newRedis returns a Redis limiter on the clock now, without its client and
// store: NewRedis adds them, a test its fakes.
func newRedis(q Quota, now func() time.Time, opts ...Option) (*Redis, error) {
	all, err := checkQuota(q)
	if err != nil {
		return nil, err
	}
	limits, c := newSlotCap(all)
	r := &Redis{namedLimits: newNamedLimits(limits), config: defaultRedisConfig(), now: now, costCap: smallestBurst(limits), cap: c}
	for _, o := range opts {
		o.apply(&r.config)
	}
	if err := r.config.validate(); err != nil {
		return nil, err
	}
	if r.config.dryRun {
		r.config.prefix += dryRunPrefix // see WithDryRun
	}
	if r.cap, err = keptCap(r.cap, &r.config.commonConfig); err != nil {
		return nil, err
	}
	r.slotCap = store.NewSlotCap(limitName(c.limit), c.limit.burst, r.lease(), r.holdChannel())
	r.fleet = newFleet(r.config.prefix, r.config.fleetName, r.config.fleetSize, r.config.process)
	r.id = r.config.process.newLimiterID()
	r.fallbackSlots = newSemaphore(r.lease(), now, r.config.observer, localLimiter)
	r.failover = outage.New(outage.Config[*Local]{
		PacesLocally: r.config.policy == FallbackLocal,
		MinCooldown:  r.config.minCooldown,
		MaxCooldown:  r.config.maxCooldown,
		NewLocal:     r.fallbackLimiter,
		Release:      r.releaseFallback,
		Jitter:       r.config.process.draw,
	})
	r.fallbackKey = r.id // a test's fakes: its own
	return r, nil
}

// Wait implements Limiter. It books cost tokens for key in Redis, under
// every limit, and sleeps until they are due; if ctx ends first, the tokens
// go back to the bucket, so that the next callers get them sooner. While
// Redis fails, the FailurePolicy decides instead. On a quota with a cap in
// flight, a caller that holds no slot of key (see WithSlot) takes one for
// the wait, and frees it once granted.
func (r *Redis) Wait(ctx context.Context, key string, cost int) error {
	if r.cap.needsSlot(ctx, key) {
		return waitWithSlot(ctx, r, key, cost)
	}
	_, err := r.waitGrant(ctx, key, cost)
	return err
}

// waitGrant implements backend.
func (r *Redis) waitGrant(ctx context.Context, key string, cost int) (grant, error) {
	return r.waitOn(ctx, target{key: key}, cost)
}

// waitOn waits as waitGrant does, on at (see target).
func (r *Redis) waitOn(ctx context.Context, at target, cost int) (grant, error) {
	if err := checkWait(ctx, r.costCap, at.key, cost); err != nil {
		return grant{}, err
	}
	if r.cap.capped {
		if at.pool != nil {
			return grant{}, errPoolCapped(at)
		}
		if err := r.cap.check(ctx, at.key); err != nil || !r.cap.rated {
			return grant{}, err
		}
	}
	q := request{Request: store.Request{Key: at.key, Pool: at.pool, First: at.first, Costs: uniform(cost, len(r.limits))}}
	q.horizon = horizonOf(ctx, &r.config.commonConfig, r.limits, &q.Costs)
	if k := r.leases(q, at, r.now()); k != nil {
		if t, ok, err := r.waitLeased(ctx, k, q, cost); ok {
			return grant{t}, err
		}
	}
	t, err := r.wait(ctx, q)
	return grant{t}, err
}

// admit implements backend: under a cap in flight, a slot and the wait
// (admitCapped); else the wait alone.
func (r *Redis) admit(ctx context.Context, at target, cost int) (*Slot, grant, error) {
	if r.cap.capped && at.pool == nil {
		return r.admitCapped(ctx, at.key, cost)
	}
	g, err := r.waitOn(ctx, at, cost)
	return nil, g, err
}

// Acquire waits for a slot of key's cap in flight, first come first
// served, then for cost under the quota's rate limits as Wait does, and
// returns the Slot, which the caller must Release once its request has
// ended; a caller whose context ends while in line leaves it, holding
// nothing. On a limiter without a cap, it waits as Wait does and returns a
// Slot whose Release does nothing. It takes one of the slots of the quota's
// cap in Redis, first come first served across the fleet, then waits for
// cost as Wait does. While Redis is away, the FailurePolicy decides:
// FallbackLocal takes a slot of this process's share of the cap.
func (r *Redis) Acquire(ctx context.Context, key string, cost int) (*Slot, error) {
	if err := checkWait(ctx, r.costCap, key, cost); err != nil {
		return nil, err
	}
	return acquire(ctx, r, key, cost)
}

// Reserve waits as Wait does, for the estimated
// costs under each limit, all booked in one script call.
func (r *Redis) Reserve(ctx context.Context, key string, estimate Costs) (*Reservation, error) {
	return r.reserveFor(ctx, target{key: key}, estimate)
}

// reserveFor implements backend.
func (r *Redis) reserveFor(ctx context.Context, at target, estimate Costs) (*Reservation, error) {
	costs, err := r.checkReserve(ctx, at.key, estimate)
	switch {
	case err == nil && r.cap.capped && at.pool != nil:
		err = errPoolCapped(at)
	case err == nil:
		err = r.cap.check(ctx, at.key)
	}
	if err != nil {
		return nil, err
	}
	q := request{Request: store.Request{Key: at.key, Pool: at.pool, First: at.first, Costs: costs, Settled: true, Estimated: r.estimated(estimate)}, horizon: horizonOf(ctx, &r.config.commonConfig, r.limits, &costs)}
	t, err := r.wait(ctx, q)
	if err != nil {
		return nil, err
	}
	return &Reservation{limiter: r, key: t.key, estimate: costs, booked: t}, nil // t.key: at's, or the pool's key booked
}

// request is one wait: what its booking needs, the horizon of its class (0
// for none; see Class), and what became of it so far.
type request struct {
	store.Request
	horizon  time.Duration
	own      time.Duration // the caller's budget, before its class narrowed it
	failures int           // its Redis calls that failed, unconfirmed, so far
}

// wait books the wait of q and sleeps until it is due, booking anew after a
// hold that replaced its time meanwhile, or a retime that voided its
// booking, and returns what it booked.
func (r *Redis) wait(ctx context.Context, q request) (booking, error) {
	r.listen()
	for turn := false; ; {
		qt := atTurn(q, turn)
		t, err := r.decideAsking(ctx, qt)
		if d, ok := asDeferral(err); ok {
			if err, turn = r.deferInLine(ctx, qt, d.delay-qt.horizon), true; err == nil {
				continue // its turn has come
			}
		}
		var late *DeadlineError
		switch {
		case r.config.dryRun && errors.As(err, &late):
			return booking{limiter: redisLimiter, localBooking: localBooking{key: q.Key}}, nil // refused, as the event says
		case err != nil:
			return booking{}, err
		}
		q.Key = t.key // on a pool, the key booked
		e := r.asked(q, t.limiter)
		e.Kind, e.Delay, e.Err = EventWait, t.delay, t.cause
		r.config.observer.emit(ctx, e)
		if r.config.dryRun {
			return t, nil
		}
		switch err := r.sleep(ctx, q.Key, t); {
		case errors.Is(err, steer.ErrRetimed):
			if t.local != nil {
				t.local.cancel(q.Key, t.buckets, r.now())
			}
			// A cut of the key's rate took its bookings as gone: counted
			// anew (see steer.Rate.Refused). Another retime did not.
			q.Again = !errors.Is(err, steer.ErrRecut)
			if !q.Again {
				r.refund(ctx, q.Key, t.redis) // a failure reaches the observer
			}
			continue // the key's pace changed while this caller slept
		case err != nil:
			return booking{}, r.giveBack(ctx, q, t, err)
		}
		if t.delay <= 0 || !r.replacedByHold(ctx, q.Key, t) { // a caller that did not sleep missed no hold
			if t.limiter == localLimiter {
				r.failover.Owe(q.Key, q.Costs, store.LimitCosts{})
			}
			return t, nil
		}
		// The upstream asked the fleet to hold off while this caller
		// slept: its time belongs to a schedule the hold replaced.
		q.Again = true
	}
}

// listen subscribes, once, to the fleet's holds (see subscribe).
func (r *Redis) listen() { r.listenOnce.Do(r.subscribe) }

// sleep sleeps for t's delay, unless ctx ends first, or, for a booking in
// Redis, the key is retimed meanwhile (steer.ErrRetimed, or steer.ErrRecut).
func (r *Redis) sleep(ctx context.Context, key string, t booking) error {
	if !t.redis.Granted {
		return sleep(ctx, key, t.delay)
	}
	return sleepUnlessRetimed(ctx, &r.retimes, key, t.delay, t.redis.Now)
}

// refuse refuses q's wait of delay, beyond budget, as limiter decided: a
// *deferral when it is beyond the horizon of q's class only.
func (r *Redis) refuse(ctx context.Context, q request, limiter string, delay, budget time.Duration) error {
	if defers(delay, q.own, q.horizon) {
		return &deferral{delay: delay}
	}
	return refuse(ctx, r.config.observer, r.asked(q, limiter), delay, budget)
}

// asked is the event of q, as limiter decides it: what it asked for (see
// namedLimits.asked).
func (r *Redis) asked(q request, limiter string) Event {
	e := r.namedLimits.asked(r.config.observer, limiter, q.Key, &q.Costs, q.Settled)
	e.DryRun = r.config.dryRun
	return e
}

// atTurn is q, with twice the horizon of its class when its turn has come
// (see Class).
func atTurn(q request, turn bool) request {
	if turn {
		q.horizon *= 2
	}
	return q
}

// deferInLine waits for the turn of a request q its class kept out of the
// schedule, whose wait comes within its horizon after earliest: in the
// line of the key's deferred requests (see lua/line.lua), or, while Redis
// is away, at earliest. A request whose turn came, but found the schedule
// beyond its horizon still, lines up again: every booking of the class is
// a turn of the line, which so spaces them. A turn past the caller's budget
// is refused at once.
func (r *Redis) deferInLine(ctx context.Context, q request, earliest time.Duration) error {
	retry := earliest
	refill := refillOf(r.limits, &q.Costs)
	r.shared(ctx, q.Key, false, func() error { // a line that fails is a courtesy lost
		lined, err := r.store.Line(ctx, q.Key, earliest, refill)
		if err == nil {
			retry = lined
		}
		return err
	}, nil)
	if own := waitBudget(ctx, r.config.maxWait, r.now()); retry+q.horizon > own {
		return refuse(ctx, r.config.observer, r.asked(q, redisLimiter), retry+q.horizon, own)
	}
	return sleepDeferred(ctx, r.config.observer, r.asked(q, redisLimiter), retry)
}

// giveBack returns what booking t took, for a caller whose wait ended
// early with err, and returns err with anything that went wrong.
func (r *Redis) giveBack(ctx context.Context, q request, t booking, err error) error {
	if t.local != nil {
		t.local.cancel(q.Key, t.buckets, r.now())
	}
	if t.redis.Granted {
		err = errors.Join(err, r.refund(ctx, q.Key, t.redis))
	}
	e := r.asked(q, t.limiter)
	e.Kind, e.Delay, e.Err = EventCancel, t.delay, err
	r.config.observer.emit(ctx, e)
	return err
}

// errNotGivenBack says why a booking stayed in Redis.
var errNotGivenBack = errors.New("pace: tokens not given back: Redis is unavailable")

// refund gives booking b back to Redis, unless Redis is away: then the
// tokens stay booked rather than hold the caller for a call timeout.
func (r *Redis) refund(ctx context.Context, key string, b store.Booking) error {
	return r.shared(ctx, key, true, func() error {
		_, _, err := r.store.Refund(ctx, key, b)
		return err
	}, func(*Local) error { return errNotGivenBack })
}

// Settle settles res with the actual costs (see Reservation): one script
// call charges the difference
// between actual and the reservation's estimate to its key under every
// limit, on Redis's clock, or gives it back. While Redis is away, the
// outage's local pacing (under FallbackLocal) takes the settlement, and
// Settle returns an error that wraps ErrUnavailable: Redis never hears of
// it. A reservation that an outage decided is settled there alone.
func (r *Redis) Settle(ctx context.Context, res *Reservation, actual Costs) error {
	costs, err := r.checkSettle(r, res, actual)
	if err != nil {
		return r.settleFailed(ctx, r.config.observer, redisLimiter, r, res, err)
	}
	if !res.settled.CompareAndSwap(false, true) {
		return nil
	}
	r.capDebts(ctx, r.config.observer, redisLimiter, res, &costs, r.config.maxHold)
	t := res.booked
	if t.redis.Granted {
		err = r.settleShared(ctx, res, costs)
	}
	if t.local != nil {
		t.local.settle(res.key, &t.buckets, res.estimate, costs, r.now())
	}
	if t.limiter == localLimiter {
		r.failover.Owe(res.key, costs, res.estimate)
	}
	return r.settled(ctx, r.config.observer, redisLimiter, res.key, &res.estimate, &costs, err)
}

// settleShared settles a reservation that Redis booked; while Redis is
// away, on the outage's local limiter instead.
func (r *Redis) settleShared(ctx context.Context, res *Reservation, actual store.LimitCosts) error {
	return r.shared(ctx, res.key, true, func() error {
		_, _, err := r.store.Settle(ctx, res.key, res.booked.redis, actual)
		return err
	}, func(local *Local) error {
		if local != nil && local != res.booked.local {
			local.settle(res.key, &bucketsBooked{}, res.estimate, actual, r.now())
		}
		return fmt.Errorf("pace: key %s: the settlement is kept by this process alone: %w", store.QuoteKey(res.key), ErrUnavailable)
	})
}

// pipeliner is a client that can send several commands in one round trip.
type pipeliner interface{ Pipeline() redis.Pipeliner }

// beat sends this process's heartbeat when one is due, at redisNow (Redis's
// clock of the reservation just made for the request of ctx), beside the
// request, which need not wait for it. A heartbeat that fails changes
// nothing: the next reservation finds out whether Redis is away.
func (r *Redis) beat(ctx context.Context, redisNow int64, now time.Time) {
	if p, ok := r.client.(pipeliner); ok && r.fleet.pinned == 0 && r.fleet.beatDue(now) {
		go r.fleet.beat(ctx, r.calls, p.Pipeline(), redisNow)
	}
}

// Allow reports whether cost units for key can go now, and books them if
// so: a Wait that books nothing and returns false when the request would
// have to wait at all (as rate.Limiter's AllowN does), for a caller that
// drops or defers work instead of waiting. Its error is one a Wait would
// return at once: a bad key or cost, or ErrUnavailable under FailClosed.
func (r *Redis) Allow(ctx context.Context, key string, cost int) (bool, error) {
	return allow(ctx, r, key, cost)
}

// unsettled implements backend.
func (r *Redis) unsettled(ctx context.Context, res *Reservation) {
	r.settleFailed(ctx, r.config.observer, redisLimiter, r, res, errBodyCollected)
}

// MaxCost returns the largest cost a wait can be granted, as Local.MaxCost
// does.
func (r *Redis) MaxCost() int { return r.costCap }
