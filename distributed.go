package pace

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
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
// integer microseconds) and, only after cancellations, prefix{key}:gaps. Both
// expire once the bucket is full again; the braces make them one Redis
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
	client   redis.Scripter
	limit    Limit
	interval int64 // microseconds one token adds to the schedule
	config   redisConfig
	calls    *caller
	breaker  breaker
	fleet    *fleet

	held          heldKeys // the fleet's holds this process heard of
	listenOnce    sync.Once
	stopListening context.CancelFunc
	listening     sync.WaitGroup

	// The script arguments that never change, boxed once rather than on
	// every call.
	intervalArg, burstArg any
}

var _ Holder = (*Redis)(nil)

var (
	//go:embed lua/reserve.lua
	reserveSource string
	reserveScript = redis.NewScript(reserveSource)

	//go:embed lua/refund.lua
	refundSource string
	refundScript = redis.NewScript(refundSource)

	//go:embed lua/hold.lua
	holdSource string
	holdScript = redis.NewScript(holdSource)
)

// NewRedis returns a Redis limiter that gives each key the limit l, shared
// through client. Any go-redis client serves: *redis.Client,
// *redis.ClusterClient, *redis.Ring, a Sentinel failover client, or any
// redis.UniversalClient. NewRedis does not contact Redis.
func NewRedis(client redis.Scripter, l Limit, opts ...RedisOption) (*Redis, error) {
	if client == nil {
		return nil, errors.New("pace: NewRedis: nil client")
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	r := &Redis{client: client, limit: l, interval: l.intervalMicros(), config: defaultRedisConfig()}
	r.intervalArg, r.burstArg = r.interval, int64(l.burst)
	for _, o := range opts {
		o.applyRedis(&r.config)
	}
	if err := r.config.validate(); err != nil {
		return nil, err
	}
	r.calls = newCaller(client, r.config.callTimeout)
	r.breaker = breaker{minCooldown: r.config.minCooldown, maxCooldown: r.config.maxCooldown}
	r.fleet = newFleet(r.config.prefix, r.config.fleetName, r.config.fleetSize)
	return r, nil
}

// Wait implements Limiter. It books cost tokens for key in Redis and sleeps
// until they are due; if ctx ends first, the tokens go back to the bucket,
// so that the next callers get them sooner. While Redis fails, the
// FailurePolicy decides instead.
func (r *Redis) Wait(ctx context.Context, key string, cost int) error {
	if err := checkWait(ctx, r.limit, key, cost); err != nil {
		return err
	}
	r.listen()
	now := time.Now()
	route, cause, fallback := r.breaker.route(now)
	if route == withoutRedis {
		return r.waitWithoutRedis(ctx, key, cost, cause, fallback)
	}
	budget := waitBudget(ctx, r.config.maxWait, now)
	b, err := r.reserve(ctx, key, cost, budget)
	if err != nil && isRedisFailure(err) {
		fallback := r.failed(ctx, key, cost, route == viaProbe, err)
		return r.waitWithoutRedis(ctx, key, cost, err, fallback)
	}
	if route == viaProbe {
		outage := r.breaker.recover(time.Now())
		r.config.observer.emit(ctx, Event{Kind: EventRecover, Limiter: "redis", Key: key, Cost: cost, Delay: outage})
	}
	if err != nil {
		return err
	}
	if p, ok := r.client.(pipeliner); ok && r.fleet.pinned == 0 && r.fleet.beatDue(now) {
		go r.heartbeat(ctx, key, cost, p, b.now) // beside the request, which need not wait for it
	}
	if !b.granted {
		return refuse(ctx, r.config.observer, "redis", key, cost, b.delay, budget)
	}
	r.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay})
	if err := sleep(ctx, key, b.delay); err != nil {
		if r.breaker.open.Load() {
			// Redis failed meanwhile: the tokens stay booked rather than
			// hold this caller for a call timeout.
			err = fmt.Errorf("%w (tokens not given back: Redis is unavailable)", err)
		} else if _, _, refundErr := r.refund(ctx, key, cost, b.finish); refundErr != nil {
			err = errors.Join(err, refundErr)
			r.failed(ctx, key, cost, false, refundErr)
		}
		r.config.observer.emit(ctx, Event{Kind: EventCancel, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay, Err: err})
		return err
	}
	if r.held.before(key, b.now+b.delay.Microseconds()) {
		// The upstream asked the fleet to hold off while this caller slept:
		// its slot belongs to a schedule the hold replaced. It books anew.
		return r.Wait(ctx, key, cost)
	}
	return nil
}

// pipeliner is a client that can send several commands in one round trip.
type pipeliner interface{ Pipeline() redis.Pipeliner }

// heartbeat counts this process into the fleet at redisNow, Redis's clock
// of the reservation just made for the request of ctx.
func (r *Redis) heartbeat(ctx context.Context, key string, cost int, p pipeliner, redisNow int64) {
	if err := r.fleet.beat(ctx, r.calls, p.Pipeline(), redisNow); err != nil {
		r.failed(ctx, key, cost, false, err)
	}
}

// failed records a failed Redis call, tells the observer, and returns the
// local limiter of the outage (nil unless the policy is FallbackLocal).
func (r *Redis) failed(ctx context.Context, key string, cost int, probe bool, err error) *Local {
	began, fallback := r.breaker.fail(time.Now(), probe, err, r.newFallback)
	switch {
	case began:
		r.config.observer.emit(ctx, Event{Kind: EventFallback, Limiter: "redis", Key: key, Cost: cost, Err: err})
	case probe:
		r.config.observer.emit(ctx, Event{Kind: EventProbe, Limiter: "redis", Key: key, Cost: cost, Err: err})
	}
	return fallback
}

// newFallback returns the local limiter for an outage that begins now: this
// process's share of the limit, with every bucket empty at the start, since
// Redis may have just granted the whole burst.
func (r *Redis) newFallback() *Local {
	if r.config.policy != FallbackLocal {
		return nil
	}
	loc := newLocal(r.limit.share(r.fleet.Size()), r.config.commonConfig)
	loc.emptyAt = loc.now()
	return loc
}

// waitWithoutRedis decides a request by the failure policy while Redis is
// away; cause is the failure that sent it there.
func (r *Redis) waitWithoutRedis(ctx context.Context, key string, cost int, cause error, fallback *Local) error {
	switch r.config.policy {
	case FailOpen:
		r.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "open", Key: key, Cost: cost, Err: cause})
		return nil
	case FailClosed:
		return fmt.Errorf("pace: key %q: %w: %w", key, ErrUnavailable, cause)
	}
	return fallback.Wait(ctx, key, cost)
}

// Hold implements Holder: in Redis, for every process of the fleet, the
// next wait for key ends no sooner than h.For from now (by Redis's clock),
// and the ones after it follow at the rate. While Redis is away, the hold
// goes to this process's fallback alone.
func (r *Redis) Hold(ctx context.Context, key string, h Hold) error {
	if err := checkHold(key, h); err != nil {
		return err
	}
	if !r.breaker.open.Load() {
		var reply [2]int64
		r.listen()
		err := int64Reply(r.calls.run(ctx, holdScript, []string{r.bucketKey(key)},
			h.For.Microseconds(), r.intervalArg, r.burstArg, r.holdChannel(), key), reply[:])
		if err == nil {
			r.held.add(key, reply[1]+h.For.Microseconds(), h.For)
			reportHold(ctx, r.config.observer, "redis", key, h, reply[0] == 1)
			return nil
		}
		err = fmt.Errorf("pace: key %q: hold script: %w", key, err)
		if !isRedisFailure(err) {
			return err
		}
		r.failed(ctx, key, 0, false, err)
	}
	if fallback := r.breaker.local(); fallback != nil {
		return fallback.Hold(ctx, key, h)
	}
	return nil
}

// booking is what the reserve script decided.
type booking struct {
	granted bool
	delay   time.Duration
	now     int64 // the Redis TIME of the decision, in microseconds
	finish  int64 // the bucket's schedule time after the booking, in microseconds
}

// reserve runs the reserve script once: it books cost tokens for key unless
// the wait would exceed budget (noBudget: no limit).
func (r *Redis) reserve(ctx context.Context, key string, cost int, budget time.Duration) (booking, error) {
	budgetArg := noBudgetArg
	if budget != noBudget {
		budgetArg = budget.Microseconds()
	}
	var reply [4]int64
	err := int64Reply(r.calls.run(ctx, reserveScript, []string{r.bucketKey(key)},
		r.intervalArg, r.burstArg, cost, budgetArg), reply[:])
	if err == nil && (reply[0] < 0 || reply[0] > 1 || reply[1] < 0) {
		err = fmt.Errorf("replied %v, want [granted delay now finish]", reply)
	}
	if err != nil {
		return booking{}, fmt.Errorf("pace: key %q: reserve script: %w", key, err)
	}
	return booking{
		granted: reply[0] == 1,
		delay:   time.Duration(reply[1]) * time.Microsecond,
		now:     reply[2],
		finish:  reply[3],
	}, nil
}

// refundResult says what the refund script did with a booking.
type refundResult int64

const (
	refundNothing refundResult = iota // its time had passed, or the bucket was gone
	refundTail                        // the tokens went back into the bucket
	refundGap                         // kept as a gap until the bookings behind it go too
)

// refund gives back the booking of cost tokens for key that left the bucket
// at finish, and returns what became of it and the Redis TIME it used, in
// microseconds. Like every call, it has a deadline of its own, so it runs
// although ctx has usually ended.
func (r *Redis) refund(ctx context.Context, key string, cost int, finish int64) (refundResult, int64, error) {
	base := r.bucketKey(key)
	var reply [2]int64
	err := int64Reply(r.calls.run(ctx, refundScript, []string{base, base + ":gaps"},
		finish, int64(cost)*r.interval), reply[:])
	if err == nil && (reply[0] < int64(refundNothing) || reply[0] > int64(refundGap)) {
		err = fmt.Errorf("replied %v, want [result now] with result 0, 1 or 2", reply)
	}
	if err != nil {
		return refundNothing, 0, fmt.Errorf("pace: key %q: refund script: %w", key, err)
	}
	return refundResult(reply[0]), reply[1], nil
}

// noBudgetArg is the script argument for a caller without a budget.
var noBudgetArg any = int64(-1)

// int64Reply reads a script's reply of len(dst) integers into dst, without
// allocating. A reply of another shape is an error, never a panic.
func int64Reply(cmd *redis.Cmd, dst []int64) error {
	val, err := cmd.Result()
	if err != nil {
		return err
	}
	items, ok := val.([]any)
	if !ok || len(items) != len(dst) {
		return fmt.Errorf("replied %v, want %d integers", val, len(dst))
	}
	for i, item := range items {
		if dst[i], ok = item.(int64); !ok {
			return fmt.Errorf("replied %v, want %d integers", val, len(dst))
		}
	}
	return nil
}

// bucketKey is the Redis key of key's bucket.
func (r *Redis) bucketKey(key string) string {
	return r.config.prefix + "{" + key + "}"
}
