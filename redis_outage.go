package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/outage"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// What a Redis limiter does when Redis fails: its failover (internal/outage,
// with its breaker) says when; here, the whole route of a request's
// booking (decideAsking: by Redis, by the failure policy while Redis is
// away, or both while it returns), how each call's outcome is recorded
// (outcome), and how the calls beside a booking run either way (shared).

// A FailurePolicy says what a Redis limiter does while Redis fails.
type FailurePolicy uint8

const (
	// FallbackLocal paces each key in this process at its share of the
	// limit: the rate and burst divided by the fleet's size. It is the default.
	FallbackLocal FailurePolicy = iota
	// FailOpen lets every request through at once, unpaced.
	FailOpen
	// FailClosed fails every request with an error that wraps ErrUnavailable.
	FailClosed
)

// String returns the policy's name, such as "FallbackLocal".
func (p FailurePolicy) String() string {
	switch p {
	case FallbackLocal:
		return "FallbackLocal"
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", uint8(p))
}

// ErrUnavailable is wrapped by the errors of a FailClosed limiter while Redis
// fails.
var ErrUnavailable = errors.New("pace: Redis unavailable")

// decideAsking decides q as decide does, from now on, and asks Redis again
// after a failure the breaker did not confirm, for the booking of the same
// id: one that Redis made, whose answer was lost, is found, not made twice.
// A caller that leaves after its call expired gives back what that call
// may have booked.
func (r *Redis) decideAsking(ctx context.Context, q request) (booking, error) {
	q.Call = r.store.NewCall()
	for {
		t, err := r.decide(ctx, q, r.now())
		if !errors.Is(err, errUnconfirmed) {
			return t, err
		}
		if q.failures++; ctx.Err() != nil {
			if store.IsExpiry(err) {
				r.forget(context.WithoutCancel(ctx), q.Request)
			}
			return booking{}, fmt.Errorf("pace: key %s: %w", store.QuoteKey(q.Key), context.Cause(ctx))
		}
	}
}

// decide books the wait of a request that begins at now, by Redis or,
// while the failover says so, without it. It does not sleep. A wait beyond
// the horizon of the request's class is a *deferral.
func (r *Redis) decide(ctx context.Context, q request, now time.Time) (booking, error) {
	q.own = waitBudget(ctx, r.config.maxWait, now)
	budget := classBudget(q.own, q.horizon)
	route, local, cause := r.failover.Route(now)
	if owed := r.failover.TakeOwed(); owed != nil {
		r.repayFirst(context.WithoutCancel(ctx), q.Key, owed)
	}
	if route == outage.WithoutRedis {
		return r.decideWithout(ctx, q, local, cause, budget)
	}
	// While returning, the outage's share decides first, and Redis books the
	// request for the time it will go: booked sooner, its tokens would seem
	// spent before they are, and be granted again once the share lifts.
	var first booking
	if local != nil {
		var err error
		if first, err = r.decideLocally(ctx, q, local, now, budget); err != nil {
			return booking{}, err
		}
		q.Key, q.Pool = first.key, nil // Redis books the key the share chose
	}
	t, err := r.decideShared(ctx, q, now, budget, route, first)
	if first.local != nil && (err != nil || t.local != first.local) {
		first.local.cancel(q.Key, first.buckets, r.now()) // refused, or decided by the next outage
	}
	return t, err
}

// decideShared books the request in Redis, not before the local time of
// first (the outage's share, while returning; else none).
func (r *Redis) decideShared(ctx context.Context, q request, now time.Time, budget time.Duration, route outage.Route, first booking) (booking, error) {
	q.Probe = route == outage.ViaProbe
	b, err := r.store.Reserve(ctx, q.Request, budget, first.delay)
	if err == nil {
		q.Key = q.BookedKey(b)
	}
	away, local, err := r.outcome(ctx, redisCall{key: q.Key, cost: q.Costs[0], route: route, began: now, failures: q.failures}, err)
	if away {
		return r.decideWithout(ctx, q, local, err, budget)
	}
	if err != nil {
		return booking{}, err
	}
	r.beat(ctx, b.Now, now)
	if b.SlotBusy {
		return booking{}, errSlotBusy
	}
	if b.Recovered {
		reportRate(ctx, r.config.observer, redisLimiter, q.Key, steer.Full, 0)
	}
	r.mismatch(ctx, q.Key, b)
	if !b.Granted {
		return booking{}, r.refuse(ctx, q, redisLimiter, b.Delay, budget)
	}
	return r.pass(ctx, q, now, b, first)
}

// pass returns the booking of what Redis booked, b, for a request that began at
// start, which first, the outage's share, may have decided already. When
// the failover gates a grant no share decided (an answer that arrived once
// an outage had begun, or the probe), the outage's local limiter books the
// wait too, at or after its time; if that would pass the caller's budget,
// b is given back and the wait refused.
func (r *Redis) pass(ctx context.Context, q request, start time.Time, b store.Booking, first booking) (booking, error) {
	now := r.now()
	// The reply came after the decision, so its arrival plus the delay is no
	// earlier than its time itself.
	due := now.Add(b.Delay)
	gate := r.failover.Granted(q.Key, due, now, first.local != nil)
	if first.local != nil {
		first.limiter, first.delay, first.redis, first.listening = redisLimiter, b.Delay, b, b.Listening
		return first, nil
	}
	t := booking{limiter: redisLimiter, redis: b, local: gate, localBooking: localBooking{key: q.Key, delay: b.Delay, start: start, listening: b.Listening}}
	if gate == nil {
		return t, nil
	}
	budget := waitBudget(ctx, r.config.maxWait, now)
	delay, ok := t.local.reserve(q.Key, &q.Costs, now, due, budget, &t.buckets, nil)
	if !ok {
		err := refuse(ctx, r.config.observer, r.asked(q, redisLimiter), delay, budget)
		return booking{}, errors.Join(err, r.refund(ctx, q.Key, b))
	}
	t.delay = delay
	return t, nil
}

// forget gives back the booking of q, whose call expired, if Redis made it
// (its call's record says; a booking due at once has none, and is spent),
// as a caller that leaves gives back what it booked: in one more call.
func (r *Redis) forget(ctx context.Context, q store.Request) {
	b, err := r.store.Reserve(ctx, q, -time.Microsecond, 0) // within no budget: it finds the booking, or books nothing
	if err == nil && b.Granted {
		r.store.Refund(ctx, q.BookedKey(b), b)
	}
}

// errUnconfirmed says that a Redis call failed, but the breaker did not
// confirm an outage: the request asks Redis again.
var errUnconfirmed = errors.New("pace: a Redis call failed; no outage confirmed")

// decideWithout decides a request by the failure policy while Redis is
// away; local is the outage's local limiter, cause the failure.
func (r *Redis) decideWithout(ctx context.Context, q request, local *Local, cause error, budget time.Duration) (booking, error) {
	now := r.now()
	switch r.config.policy {
	case FailOpen:
		return booking{limiter: openLimiter, cause: cause, localBooking: localBooking{key: q.Key, start: now}}, nil
	case FailClosed:
		return booking{}, r.unavailable(ctx, q.Key, q.Costs[0], cause)
	}
	t, err := r.decideLocally(ctx, q, local, now, budget)
	t.cause = cause // the observer hears why Redis did not decide
	return t, err
}

// unavailable returns the error of a request for cost units of key that
// FailClosed fails while Redis is away (cause says why), and tells the
// observer.
func (r *Redis) unavailable(ctx context.Context, key string, cost int, cause error) error {
	err := &unavailableError{key: key, cause: cause}
	r.config.observer.emit(ctx, Event{Kind: EventFail, Limiter: redisLimiter, Key: key, Cost: cost, Err: err})
	return err
}

// An unavailableError fails a request for key while Redis is away, as
// cause (the failure that confirmed the outage, or the last) says. It
// wraps ErrUnavailable and cause, and names the key once.
type unavailableError struct {
	key   string
	cause error
}

// Error names the key, then the failure: the script and, when the call was
// for another key, that key.
func (e *unavailableError) Error() string {
	msg := "pace: key " + store.QuoteKey(e.key) + ": Redis unavailable"
	var call *store.CallError
	switch {
	case errors.As(e.cause, &call) && call.Key == e.key:
		return msg + ": " + call.Call()
	case errors.As(e.cause, &call):
		return msg + ": " + call.Script + " script for key " + store.QuoteKey(call.Key) + ": " + call.Err.Error()
	case e.cause != nil:
		return msg + ": " + e.cause.Error()
	}
	return msg
}

// Unwrap returns ErrUnavailable and the cause.
func (e *unavailableError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrUnavailable}
	}
	return []error{ErrUnavailable, e.cause}
}

// decideLocally books the wait on local, the outage's local limiter.
func (r *Redis) decideLocally(ctx context.Context, q request, local *Local, now time.Time, budget time.Duration) (booking, error) {
	t := booking{limiter: localLimiter, local: local, localBooking: localBooking{start: now}}
	key, delay, ok := local.reserveOn(target{key: q.Key, pool: q.Pool, first: q.First}, &q.Costs, now, budget, &t.buckets, nil)
	q.Key, t.key = key, key
	if !ok {
		return booking{}, r.refuse(ctx, q, localLimiter, delay, budget)
	}
	t.delay = delay
	return t, nil
}

// A redisCall is one Redis call of a request for cost units of key, begun
// at began on route, after failures failed calls of the request.
type redisCall struct {
	key      string
	cost     int
	route    outage.Route
	began    time.Time
	failures int
}

// outcome records what became of call, which ended with err, and emits the
// failover's events, each from here alone: a probe that Redis answered ends
// the outage (EventRecover); a failure goes to the breaker (EventFallback
// when it confirms an outage, EventProbe for a failed probe). It returns
// whether Redis is away, with the outage's local limiter (nil unless the
// policy is FallbackLocal), and err: wrapped in errUnconfirmed for a
// failure the breaker did not confirm.
func (r *Redis) outcome(ctx context.Context, call redisCall, err error) (away bool, local *Local, _ error) {
	if err == nil || !store.IsOutage(err) {
		if call.route == outage.ViaProbe {
			r.config.observer.emit(ctx, Event{Kind: EventRecover, Limiter: redisLimiter, Key: call.key, Cost: call.cost, Delay: r.failover.Recover(r.now(), r.callTimeout())})
		}
		return false, nil, err
	}
	probe := call.route == outage.ViaProbe
	began, down, local := r.failover.Fail(r.now(), outage.Failure{Began: call.began, Probe: probe, Failures: call.failures + 1, Err: err}, r.callTimeout())
	switch {
	case began:
		if r.calls != nil {
			r.calls.Abandon() // the requests asking Redis now go by the outage's pacing
		}
		r.config.observer.emit(ctx, Event{Kind: EventFallback, Limiter: redisLimiter, Key: call.key, Cost: call.cost, Err: err, Reason: r.neverAnswered()})
	case probe:
		r.config.observer.emit(ctx, Event{Kind: EventProbe, Limiter: redisLimiter, Key: call.key, Cost: call.cost, Err: err})
	}
	if !down {
		return false, nil, fmt.Errorf("%w: %w", errUnconfirmed, err)
	}
	return true, local, err
}

// neverAnswered says, for an outage's EventFallback, that Redis has never
// answered this process, and what follows: "" when it has.
func (r *Redis) neverAnswered() string {
	if r.calls == nil || r.calls.Answers.Load() > 0 {
		return ""
	}
	const never = "Redis has never answered this process: check its address, database and password"
	if r.config.policy == FallbackLocal && r.fleet.pinned == 0 {
		return never + "; its fleet was never counted, and it paces at the whole limit as if alone until Redis answers"
	}
	return never
}

// callTimeout returns the timeout of a Redis call that begins now.
func (r *Redis) callTimeout() time.Duration {
	if r.calls == nil {
		return r.config.callTimeout // a test's store
	}
	return r.calls.Timeout()
}

// shared runs viaRedis, a Redis call for key beside a request's booking
// (a hold, a refund, a settlement, a sync, a line, a rate's news), or,
// while Redis is taken to be away, without, with the outage's local
// limiter (nil when the policy paces nothing locally), and returns the
// error of the one it ran; without may be nil: nothing to do without
// Redis. A failure of viaRedis is recorded; one the breaker confirms runs
// without. With retry, a failure the breaker does not confirm calls again
// (its outage.ConfirmRow-th confirms), else it is returned as it is. So
// the outage is decided here alone: its callers say what each way does.
func (r *Redis) shared(ctx context.Context, key string, retry bool, viaRedis func() error, without func(*Local) error) error {
	if down, local := r.failover.Down(); down {
		return runWithout(without, local)
	}
	for failures := 0; ; failures++ {
		began := r.now()
		err := viaRedis()
		away, local, recorded := r.outcome(ctx, redisCall{key: key, route: outage.ViaRedis, began: began, failures: failures}, err)
		switch {
		case away:
			return runWithout(without, local)
		case !errors.Is(recorded, errUnconfirmed) || !retry:
			return err
		}
	}
}

// runWithout runs without, if any, with local.
func runWithout(without func(*Local) error, local *Local) error {
	if without == nil {
		return nil
	}
	return without(local)
}

// What a process granted alone during an outage, booked on the shared keys
// once it is back on Redis: the others may have spent the whole limit in
// Redis meanwhile, and an hourly or daily quota would otherwise lose its
// bound over its period by this process's share.

// repayFirst repays key's debt, if any, before the request for key that
// took the debts books it, and the others' meanwhile: a booking before
// its repayment would take the burst the returning process's turns left
// free (see spent_through in repay.lua); it did, in the simulator, and the
// upstream refused it.
func (r *Redis) repayFirst(ctx context.Context, key string, owed map[string]store.LimitCosts) {
	if costs, ok := owed[key]; ok {
		delete(owed, key)
		r.repay(ctx, map[string]store.LimitCosts{key: costs})
	}
	if len(owed) > 0 {
		go r.repay(ctx, owed)
	}
}

// repay books each key's debt on Redis (see repay.lua), with the last
// turn Redis gave the key while this process returned and the fleet's
// size, one call a key, and tells the observer what each key took. A
// call that fails ends the repayment: Redis is away again, and the next
// outage's debts are its own.
func (r *Redis) repay(ctx context.Context, owed map[string]store.LimitCosts) {
	for key, costs := range owed {
		took, err := r.store.Repay(ctx, key, costs, r.failover.Ahead(key, r.now()), r.fleet.Size())
		r.config.observer.emit(ctx, Event{Kind: EventRepay, Limiter: redisLimiter, Key: key, Cost: took[0], Err: err})
		if store.IsOutage(err) {
			return
		}
	}
}

// While Redis is away, the limiters of one process that pace one key share
// the process's share of its limit: one outage limiter per fleet and quota
// in the process, however many limiters book it. Limiters of the same
// quota on different Redis servers (or prefixes, or fleets) do not.

// fallbacks are the outage limiters in use in a process, by fleet and
// quota (Redis.shareKey).
type fallbacks struct {
	sync.Mutex
	by map[string]*fallback
}

type fallback struct {
	local *Local
	users int
}

// fallbackKey names the fleet and quota of a limiter on client among this
// process's outage limiters: by the Redis the client reaches, when it says,
// the prefix, the fleet's name, and the limits.
func fallbackKey(client redis.Scripter, prefix, fleetName string, limits []Limit) string {
	var where any = fmt.Sprintf("%p", client)
	switch c := client.(type) {
	case *redis.Client: // a Sentinel failover client's Addr names no server: one per process
		where = c.Options().Network + " " + c.Options().Addr + " " + strconv.Itoa(c.Options().DB)
	case *redis.ClusterClient:
		where = c.Options().Addrs
	}
	stored := storeLimits(limits, time.Now)
	for i := range stored {
		stored[i].Windows = nil // a func prints as its address; the limit's key names its calendar
	}
	return fmt.Sprintf("%v %q %q %v", where, prefix, fleetName, stored)
}

// fallbackLimiter returns the local limiter for an outage of r that begins at
// since: the one this process's other limiters of r's fleet and quota use,
// if one is in an outage, with floors added; else a new one, under each
// limit this process's share of it (Limit.fallbackShare: a fixed or calendar
// window its share of the count, from the outage on; a sliding window taken
// as a bucket that never allows more), each key's buckets empty at since, or at its time in floors
// (the end of what Redis had booked of the key, or of its hold) if that is
// later, since Redis may have granted the whole burst and booked callers who
// still wait.
func (r *Redis) fallbackLimiter(since time.Time, floors map[string]time.Time) *Local {
	inUse := &r.config.process.fallbacks
	inUse.Lock()
	defer inUse.Unlock()
	if s := inUse.by[r.fallbackKey]; s != nil {
		s.users++
		s.local.addFloors(floors)
		return s.local
	}
	var shares []Limit
	for _, l := range r.limits {
		shares = append(shares, l.fallbackShare(r.fleet.Size()))
	}
	named := newNamedLimits(shares)
	named.names = r.names // the quota's: the shares' texts differ
	loc := newLocal(named, r.config.commonConfig, r.now)
	loc.emptyAt = since
	loc.floors.Store(&floors)
	inUse.by[r.fallbackKey] = &fallback{local: loc, users: 1}
	return loc
}

// releaseFallback lets go of loc, an outage limiter of r's: the last of its
// users forgets it.
func (r *Redis) releaseFallback(loc *Local) {
	inUse := &r.config.process.fallbacks
	inUse.Lock()
	defer inUse.Unlock()
	if s := inUse.by[r.fallbackKey]; s != nil && s.local == loc {
		if s.users--; s.users == 0 {
			delete(inUse.by, r.fallbackKey)
		}
	}
}
