package pace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis paces events for a whole fleet: every process whose Redis limiter
// uses the same Redis, prefix and key draws on one bucket. Each decision is
// one script call (EVALSHA, or EVAL when Redis lacks the script) that reads
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
// A Redis is safe for concurrent use. Create it with NewRedis.
type Redis struct {
	namedLimits
	id       string // names this limiter's requests in Redis (see newLimiterID)
	client   redis.Scripter
	costCap  int // the smallest burst or window count of the limits: the most a request may cost under every limit
	config   redisConfig
	now      func() time.Time // time.Now, or a test's clock
	calls    *caller
	store    sharedStore
	failover *failover
	fleet    *fleet

	cap           slotCap      // the quota's cap in flight, if any
	slotWaiters   slotWaiters  // this process's requests in line for a slot
	fallbackSlots *semaphore   // slots of this process's share of the cap while Redis is away
	held          heldKeys     // the fleet's holds this process heard of
	retimes       retimes      // the fleet's retimes this process heard of
	syncs         throttle     // when each key may be steered next
	resubscribed  atomic.Int64 // UnixNano of the hold channel's last subscription after a break; MaxInt64 while broken; 0 before any break
	listenOnce    sync.Once
	stopListening func()
	listening     sync.WaitGroup
}

var (
	_ Holder   = (*Redis)(nil)
	_ Reserver = (*Redis)(nil)
	_ Syncer   = (*Redis)(nil)
	_ Slotter  = (*Redis)(nil)
)

// sharedStore is what a Redis limiter asks of Redis: a *store, or a test's
// fake.
type sharedStore interface {
	reserve(ctx context.Context, q request, budget, notBefore time.Duration) (booking, error)
	refund(ctx context.Context, key string, b booking) ([maxLimits]refundResult, int64, error)
	settle(ctx context.Context, key string, b booking, actual limitCosts) (settled bool, now int64, err error)
	sync(ctx context.Context, key string, b booking, steers []steering, refused bool, channel string) (syncReply, error)
	hold(ctx context.Context, key string, d time.Duration, channel string) (changed bool, end int64, err error)
	slots(ctx context.Context, key string, c slotCall) (slotsReply, error)
	line(ctx context.Context, key string, earliest, turn time.Duration) (time.Duration, error)
	heldUntil(ctx context.Context, key string) (int64, error)
	refused(ctx context.Context, key string, b booking, served bool, channel string) (share, now int64, err error)
	repay(ctx context.Context, key string, debt limitCosts) (took limitCosts, err error)
}

// NewRedis returns a Redis limiter that gives each key the quota q (a Limit,
// or several at once with AllOf), shared through client. Any go-redis client
// serves: *redis.Client, *redis.ClusterClient, *redis.Ring, a Sentinel
// failover client, or any redis.UniversalClient. NewRedis does not contact
// Redis.
func NewRedis(client redis.Scripter, q Quota, opts ...RedisOption) (*Redis, error) {
	if client == nil {
		return nil, errors.New("pace: NewRedis: nil client")
	}
	r, err := newRedis(q, time.Now, opts...)
	if err != nil {
		return nil, err
	}
	r.client = client
	r.calls = newCaller(client, r.config.callTimeout)
	r.failover.breaker.answers = &r.calls.answers
	r.store = newStore(r.calls, r.config.prefix, r.id, r.limits)
	return r, nil
}

// newRedis returns a Redis limiter on the clock now, without its client and
// store: NewRedis adds them, a test its fakes.
func newRedis(q Quota, now func() time.Time, opts ...RedisOption) (*Redis, error) {
	all, err := checkQuota(q)
	if err != nil {
		return nil, err
	}
	limits, c := newSlotCap(all)
	r := &Redis{namedLimits: newNamedLimits(limits), config: defaultRedisConfig(), now: now, costCap: smallestBurst(limits), cap: c}
	for _, o := range opts {
		o.applyRedis(&r.config)
	}
	if err := r.config.validate(); err != nil {
		return nil, err
	}
	r.fleet = newFleet(r.config.prefix, r.config.fleetName, r.config.fleetSize)
	r.id = newLimiterID()
	r.fallbackSlots = newSemaphore(r.lease(), now, r.config.observer, "local")
	r.failover = &failover{
		policy:      r.config.policy,
		minCooldown: r.config.minCooldown,
		maxCooldown: r.config.maxCooldown,
		newLocal:    r.outageLimiter,
	}
	return r, nil
}

// Wait implements Limiter. It books cost tokens for key in Redis, under
// every limit, and sleeps until they are due; if ctx ends first, the tokens
// go back to the bucket, so that the next callers get them sooner. While
// Redis fails, the FailurePolicy decides instead.
func (r *Redis) Wait(ctx context.Context, key string, cost int) error {
	_, err := r.WaitGrant(ctx, key, cost)
	return err
}

// WaitGrant implements Heeder: it waits as Wait does, and returns what it
// booked, by which the response steers the key (see Heed).
func (r *Redis) WaitGrant(ctx context.Context, key string, cost int) (Grant, error) {
	if err := checkWait(ctx, r.costCap, key, cost); err != nil {
		return Grant{}, err
	}
	if err := r.cap.check(ctx, key); err != nil || !r.cap.rated {
		return Grant{}, err
	}
	q := request{key: key, costs: uniform(cost)}
	q.horizon = horizonOf(ctx, r.config.commonConfig, r.limits, &q.costs)
	t, err := r.wait(ctx, q)
	return Grant{t}, err
}

// Acquire implements Slotter: it takes one of the slots of the quota's
// cap in Redis, first come first served across the fleet, then waits for
// cost as Wait does. While Redis is away, the FailurePolicy decides:
// FallbackLocal takes a slot of this process's share of the cap.
func (r *Redis) Acquire(ctx context.Context, key string, cost int) (*Slot, error) {
	if err := checkWait(ctx, r.costCap, key, cost); err != nil {
		return nil, err
	}
	return acquire(ctx, r, key, cost)
}

// Reserve implements Reserver: it waits as Wait does, for the estimated
// costs under each limit, all booked in one script call.
func (r *Redis) Reserve(ctx context.Context, key string, estimate Costs) (*Reservation, error) {
	costs, err := r.checkReserve(ctx, key, estimate)
	if err == nil {
		err = r.cap.check(ctx, key)
	}
	if err != nil {
		return nil, err
	}
	q := request{key: key, costs: costs, settled: true, estimated: r.estimated(estimate), horizon: horizonOf(ctx, r.config.commonConfig, r.limits, &costs)}
	t, err := r.wait(ctx, q)
	if err != nil {
		return nil, err
	}
	return &Reservation{limiter: r, key: key, estimate: costs, ticket: t}, nil
}

// request is one wait: its key, its cost under each limit, whether it will
// be settled and which of its costs are estimates, and the horizon of its
// class (0 for none; see Class).
type request struct {
	key       string
	costs     limitCosts
	settled   bool
	estimated limitSet
	horizon   time.Duration
	own       time.Duration // the caller's budget, before its class narrowed it
	failures  int           // its Redis calls that failed, unconfirmed, so far
	probe     bool          // the failover's probe, whose call may answer late (see caller.runLong)
}

// wait books the wait of q and sleeps until it is due, booking anew after a
// hold that replaced its slot meanwhile, or a retime that voided its
// booking, and returns what it booked.
func (r *Redis) wait(ctx context.Context, q request) (ticket, error) {
	r.listen()
	for turn := false; ; {
		qt := atTurn(q, turn)
		t, err := r.decideAsking(ctx, qt)
		if d, ok := asDeferral(err); ok {
			if err, turn = r.deferred(ctx, qt, d.delay-qt.horizon), true; err == nil {
				continue // its turn has come
			}
		}
		if err != nil {
			return ticket{}, err
		}
		r.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: t.limiter, Key: q.key, Cost: q.costs[0], Delay: t.delay, Err: t.cause})
		switch err := r.sleep(ctx, q.key, t); {
		case errors.Is(err, errRetimed):
			if t.local != nil {
				t.local.cancel(q.key, t.res, r.now())
			}
			if errors.Is(err, errRecut) {
				r.refund(ctx, q.key, t.booking) // a failure reaches the observer
			}
			continue // the key's pace changed while this caller slept
		case err != nil:
			return ticket{}, r.giveBack(ctx, q, t, err)
		}
		if !r.replacedByHold(ctx, q.key, t) {
			if t.limiter == "local" {
				r.failover.debts.owe(q.key, q.costs, limitCosts{})
			}
			return t, nil
		}
		// The upstream asked the fleet to hold off while this caller
		// slept: its slot belongs to a schedule the hold replaced.
	}
}

// errRetimed ends the sleep of a caller whose booking a retime voided:
// the key learned another limit (and Redis took the booking out of the
// schedule), or, errRecut, its rate was cut (and the caller gives the
// booking back).
var (
	errRetimed = errors.New("pace: the key's pace changed")
	errRecut   = fmt.Errorf("%w: its rate was cut", errRetimed)
)

// sleep sleeps for t's delay, unless ctx ends first, or, for a booking in
// Redis, the key is retimed meanwhile (errRetimed, or errRecut).
func (r *Redis) sleep(ctx context.Context, key string, t ticket) error {
	if !t.booking.granted {
		return sleep(ctx, key, t.delay)
	}
	return r.retimes.sleep(ctx, key, t.delay, t.booking.now)
}

// A ticket is a wait that a limiter granted: how long it is, who decided
// it, and what to give back should its caller stop waiting.
type ticket struct {
	limiter   string // "redis", "local" or "open"
	delay     time.Duration
	start     time.Time // when the decision began, by the limiter's clock
	cause     error     // why Redis did not decide, if it did not
	booking   booking   // Redis's booking, when booking.granted
	local     *Local    // the local limiter that booked the wait too, or nil
	res       localBooking
	listening bool // the key's rate listens for a success (see refusals.go)
}

// decide books the wait of a request that begins at now, by Redis or,
// while the failover says so, without it. It does not sleep. A wait beyond
// the horizon of the request's class is a *deferral.
func (r *Redis) decide(ctx context.Context, q request, now time.Time) (ticket, error) {
	q.own = waitBudget(ctx, r.config.maxWait, now)
	budget := classBudget(q.own, q.horizon)
	route, local, cause := r.failover.route(now)
	if owed := r.failover.takeOwed(); owed != nil {
		go r.repay(context.WithoutCancel(ctx), owed)
	}
	if route == withoutRedis {
		return r.decideWithout(ctx, q, local, cause, budget)
	}
	// While returning, the outage's share decides first, and Redis books the
	// request for the time it will go: booked sooner, its tokens would seem
	// spent before they are, and be granted again once the share lifts.
	var first ticket
	if local != nil {
		var err error
		if first, err = r.decideLocally(ctx, q, local, now, budget); err != nil {
			return ticket{}, err
		}
	}
	t, err := r.decideShared(ctx, q, now, budget, route, first)
	if first.local != nil && (err != nil || t.local != first.local) {
		first.local.cancel(q.key, first.res, r.now()) // refused, or decided by the next outage
	}
	return t, err
}

// decideShared books the request in Redis, not before the local slot of
// first (the outage's share, while returning; else none).
func (r *Redis) decideShared(ctx context.Context, q request, now time.Time, budget time.Duration, route route, first ticket) (ticket, error) {
	q.probe = route == viaProbe
	b, err := r.store.reserve(ctx, q, budget, first.delay)
	if isOutage(err) {
		down, local := r.failed(ctx, q.key, q.costs[0], failedCall{began: now, probe: q.probe, failures: q.failures + 1, err: err})
		if !down {
			return ticket{}, errUnconfirmed
		}
		return r.decideWithout(ctx, q, local, err, budget)
	}
	if route == viaProbe {
		r.config.observer.emit(ctx, Event{Kind: EventRecover, Limiter: "redis", Key: q.key, Cost: q.costs[0], Delay: r.failover.recover(r.now(), r.callTimeout())})
	}
	if err != nil {
		return ticket{}, err
	}
	r.beat(ctx, b.now, now)
	if b.recovered {
		reportRate(ctx, r.config.observer, "redis", q.key, rateFull, 0)
	}
	if !b.granted {
		return ticket{}, r.refuse(ctx, q, "redis", b.delay, budget)
	}
	return r.pass(ctx, q, now, b, first)
}

// pass returns the ticket of Redis's booking b for a request that began at
// start, which first, the outage's share, may have decided already. When
// the failover gates a grant no share decided (an answer that arrived once
// an outage had begun, or the probe), the outage's local limiter books the
// wait too, at or after its slot; if that would pass the caller's budget,
// b is given back and the wait refused.
func (r *Redis) pass(ctx context.Context, q request, start time.Time, b booking, first ticket) (ticket, error) {
	now := r.now()
	// The reply came after the decision, so its arrival plus the delay is no
	// earlier than the slot itself.
	slot := now.Add(b.delay)
	gate := r.failover.granted(q.key, slot, now, first.local != nil)
	if first.local != nil {
		first.limiter, first.delay, first.booking, first.listening = "redis", b.delay, b, b.listening
		return first, nil
	}
	t := ticket{limiter: "redis", delay: b.delay, start: start, booking: b, local: gate, listening: b.listening}
	if gate == nil {
		return t, nil
	}
	budget := waitBudget(ctx, r.config.maxWait, now)
	delay, ok := t.local.reserve(q.key, &q.costs, now, slot, budget, &t.res, nil)
	if !ok {
		err := refuse(ctx, r.config.observer, "redis", q.key, q.costs[0], delay, budget)
		return ticket{}, errors.Join(err, r.refund(ctx, q.key, b))
	}
	t.delay = delay
	return t, nil
}

// refuse refuses q's wait of delay, beyond budget, as limiter decided: a
// *deferral when it is beyond the horizon of q's class only.
func (r *Redis) refuse(ctx context.Context, q request, limiter string, delay, budget time.Duration) error {
	if defers(delay, q.own, q.horizon) {
		return &deferral{delay: delay}
	}
	return refuse(ctx, r.config.observer, limiter, q.key, q.costs[0], delay, budget)
}

// atTurn is q, with twice the horizon of its class when its turn has come
// (see Class).
func atTurn(q request, turn bool) request {
	if turn {
		q.horizon *= 2
	}
	return q
}

// deferred waits for the turn of a request q its class kept out of the
// schedule, whose wait comes within its horizon after earliest: in the
// line of the key's deferred requests (see lua/line.lua), or, while Redis
// is away, at earliest. A request whose turn came, but found the schedule
// beyond its horizon still, lines up again: every booking of the class is
// a turn of the line, which so spaces them. A turn past the caller's budget
// is refused at once.
func (r *Redis) deferred(ctx context.Context, q request, earliest time.Duration) error {
	retry := earliest
	refill := refillOf(r.limits, &q.costs)
	r.shared(ctx, q.key, false, func() error { // a line that fails is a courtesy lost
		lined, err := r.store.line(ctx, q.key, earliest, refill)
		if err == nil {
			retry = lined
		}
		return err
	})
	if own := waitBudget(ctx, r.config.maxWait, r.now()); retry+q.horizon > own {
		return refuse(ctx, r.config.observer, "redis", q.key, q.costs[0], retry+q.horizon, own)
	}
	return deferred(ctx, r.config.observer, "redis", q.key, q.costs[0], retry)
}

// giveBack returns what ticket t booked, for a caller whose wait ended
// early with err, and returns err with anything that went wrong.
func (r *Redis) giveBack(ctx context.Context, q request, t ticket, err error) error {
	if t.local != nil {
		t.local.cancel(q.key, t.res, r.now())
	}
	if t.booking.granted {
		err = errors.Join(err, r.refund(ctx, q.key, t.booking))
	}
	r.config.observer.emit(ctx, Event{Kind: EventCancel, Limiter: t.limiter, Key: q.key, Cost: q.costs[0], Delay: t.delay, Err: err})
	return err
}

// errNotGivenBack says why a booking stayed in Redis.
var errNotGivenBack = errors.New("pace: tokens not given back: Redis is unavailable")

// refund gives booking b back to Redis, unless Redis is away: then the
// tokens stay booked rather than hold the caller for a call timeout.
func (r *Redis) refund(ctx context.Context, key string, b booking) error {
	_, err := r.shared(ctx, key, true, func() error {
		_, _, err := r.store.refund(ctx, key, b)
		return err
	})
	if errors.Is(err, errAway) {
		return errNotGivenBack
	}
	return err
}

// Settle implements Reserver: one script call charges the difference
// between actual and the reservation's estimate to its key under every
// limit, on Redis's clock, or gives it back. While Redis is away, the
// outage's local pacing (under FallbackLocal) takes the settlement, and
// Settle returns an error that wraps ErrUnavailable: Redis never hears of
// it. A reservation that an outage decided is settled there alone.
func (r *Redis) Settle(ctx context.Context, res *Reservation, actual Costs) error {
	costs, err := r.checkSettle(r, res, actual)
	if err != nil || !res.settled.CompareAndSwap(false, true) {
		return err
	}
	r.capDebts(ctx, r.config.observer, "redis", res, &costs, r.config.holdBound())
	t := res.ticket
	if t.booking.granted {
		err = r.settleShared(ctx, res, costs)
	}
	if t.local != nil {
		t.local.settle(res.key, res.estimate, costs, r.now())
	}
	if t.limiter == "local" {
		r.failover.debts.owe(res.key, costs, res.estimate)
	}
	return err
}

// settleShared settles a reservation that Redis booked; while Redis is
// away, on the outage's local limiter instead.
func (r *Redis) settleShared(ctx context.Context, res *Reservation, actual limitCosts) error {
	local, err := r.shared(ctx, res.key, true, func() error {
		_, _, err := r.store.settle(ctx, res.key, res.ticket.booking, actual)
		return err
	})
	if !errors.Is(err, errAway) {
		return err
	}
	if local != nil && local != res.ticket.local {
		local.settle(res.key, res.estimate, actual, r.now())
	}
	return fmt.Errorf("pace: key %s: the settlement is kept by this process alone: %w", quoteKey(res.key), ErrUnavailable)
}

// replacedByHold reports whether a hold replaced the slot of ticket t while
// its caller slept. A caller booked before the hold channel's subscription
// last stood may have missed the hold's message, and reads the key's hold
// from Redis.
func (r *Redis) replacedByHold(ctx context.Context, key string, t ticket) bool {
	if t.delay <= 0 {
		return false // it did not sleep
	}
	if t.local != nil && t.local.heldPast(key, t.start.Add(t.delay)) {
		return true
	}
	if !t.booking.granted {
		return false
	}
	slot := t.booking.slot()
	if r.held.before(key, slot) {
		return true
	}
	if !r.missedHolds(t.start) {
		return false
	}
	end, err := r.store.heldUntil(ctx, key)
	return err == nil && slot < end
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

// Hold implements Holder: in Redis, for every process of the fleet, no
// wait for key ends sooner than h.For from now (by Redis's clock), capped
// at the limiter's MaxHold (see WithMaxHold); a hold of a quota that none
// of the limits is (see Hold.Quota) holds nothing. While Redis is away, the
// hold goes to this process's outage limiter alone.
func (r *Redis) Hold(ctx context.Context, key string, h Hold) error {
	h, holds, err := r.config.hold(r.namedLimits, key, h)
	if err != nil || !holds {
		return err
	}
	r.listen()
	var changed bool
	var end int64
	local, err := r.shared(ctx, key, true, func() (err error) {
		changed, end, err = r.store.hold(ctx, key, h.For, r.holdChannel())
		return err
	})
	if errors.Is(err, errAway) {
		return holdLocally(ctx, local, key, h)
	}
	if err != nil {
		return err
	}
	r.heard(key, end, h.For)
	reportHold(ctx, r.config.observer, "redis", key, h, changed)
	return nil
}

// holdLocally holds key on an outage's local limiter, if there is one.
func holdLocally(ctx context.Context, local *Local, key string, h Hold) error {
	if local == nil {
		return nil
	}
	return local.Hold(ctx, key, h)
}
