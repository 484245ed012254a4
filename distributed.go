package pace

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
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
	client      redis.Scripter
	limits      []Limit
	limit       Limit // limits[0]
	interval    int64 // limits[0]'s: microseconds one unit adds to a bucket's schedule
	largestCost int   // the smallest burst or count of the limits: the most a request may cost
	config      redisConfig
	calls       *caller
	breaker     breaker
	fleet       *fleet

	held          heldKeys // the fleet's holds this process heard of
	listenOnce    sync.Once
	stopListening context.CancelFunc
	listening     sync.WaitGroup

	suffixes   []string // each limit's key is prefix{key} and its suffix
	limitArgs  []any    // each limit's kind, interval or length, and burst or count, boxed once
	oneBucket  bool     // the quota is one bucket: reserve.lua, not quota.lua
	sliding    bool     // some limit is a sliding window, whose grants need ids
	requestIDs atomic.Uint64
	retiring   atomic.Pointer[retiring]
	// lastSlot is the latest slot this process has been given, by its own
	// clock (UnixNano): the shared schedule reaches at least that far, so an
	// outage's local pacing must not begin before it.
	lastSlot atomic.Int64
}

var _ Holder = (*Redis)(nil)

var (
	//go:embed lua/reserve.lua
	reserveSource string
	reserveScript = redis.NewScript(reserveSource)

	//go:embed lua/quota.lua
	quotaSource string
	quotaScript = redis.NewScript(quotaSource)

	//go:embed lua/refund.lua
	refundSource string
	refundScript = redis.NewScript(refundSource)

	//go:embed lua/hold.lua
	holdSource string
	holdScript = redis.NewScript(holdSource)
)

// NewRedis returns a Redis limiter that gives each key the quota q (a Limit,
// or several at once with AllOf), shared through client. Any go-redis client
// serves: *redis.Client, *redis.ClusterClient, *redis.Ring, a Sentinel
// failover client, or any redis.UniversalClient. NewRedis does not contact
// Redis.
func NewRedis(client redis.Scripter, q Quota, opts ...RedisOption) (*Redis, error) {
	if client == nil {
		return nil, errors.New("pace: NewRedis: nil client")
	}
	limits, err := checkQuota(q)
	if err != nil {
		return nil, err
	}
	r := &Redis{client: client, limits: limits, limit: limits[0], interval: limits[0].intervalMicros(), config: defaultRedisConfig()}
	r.largestCost = limits[0].burst
	for _, l := range limits {
		r.largestCost = min(r.largestCost, l.burst)
		a, b := l.intervalMicros(), int64(l.burst)
		if l.kind != bucket {
			a = l.period.Microseconds()
		}
		r.limitArgs = append(r.limitArgs, int64(l.kind)+1, a, b)
		r.sliding = r.sliding || l.kind == slidingWindow
		suffix := ":" + cmp.Or(l.name, l.String())
		if len(limits) == 1 && l.kind == bucket && l.name == "" {
			suffix = "" // the layout of a single bucket: prefix{key}
		}
		r.suffixes = append(r.suffixes, suffix)
	}
	r.oneBucket = len(limits) == 1 && limits[0].kind == bucket
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
	if err := checkWait(ctx, r.largestCost, key, cost); err != nil {
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
		outage, fallback := r.breaker.recover(time.Now())
		if fallback != nil {
			r.retiring.Store(&retiring{fallback, time.Now().Add(fallback.refill)})
		}
		r.config.observer.emit(ctx, Event{Kind: EventRecover, Limiter: "redis", Key: key, Cost: cost, Delay: outage})
	}
	if err != nil {
		return err
	}
	if route == viaRedis && r.breaker.open.Load() {
		// An outage began while this call was under way: the local pacing
		// now decides, and must count this request too, or it would grant
		// the same moment twice. The Redis booking is left unused.
		if fallback := r.breaker.local(); fallback != nil {
			return fallback.Wait(ctx, key, cost)
		}
	}
	if p, ok := r.client.(pipeliner); ok && r.fleet.pinned == 0 && r.fleet.beatDue(now) {
		go r.heartbeat(ctx, key, cost, p, b.now) // beside the request, which need not wait for it
	}
	if !b.granted {
		return refuse(ctx, r.config.observer, "redis", key, cost, b.delay, budget)
	}
	// The slot by this clock: the reply came after the decision, so its
	// arrival plus the delay is no earlier than the slot itself.
	for slot := time.Now().Add(b.delay).UnixNano(); ; {
		last := r.lastSlot.Load()
		if slot <= last || r.lastSlot.CompareAndSwap(last, slot) {
			break
		}
	}
	r.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay})
	if err := sleep(ctx, key, b.delay); err != nil {
		if r.breaker.open.Load() {
			// Redis failed meanwhile: the tokens stay booked rather than
			// hold this caller for a call timeout.
			err = fmt.Errorf("%w (tokens not given back: Redis is unavailable)", err)
		} else if _, _, refundErr := r.refund(ctx, key, b); refundErr != nil {
			err = errors.Join(err, refundErr)
			r.failed(ctx, key, cost, false, refundErr)
		}
		r.config.observer.emit(ctx, Event{Kind: EventCancel, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay, Err: err})
		return err
	}
	if r.held.before(key, b.slot()) {
		// The upstream asked the fleet to hold off while this caller slept:
		// its slot belongs to a schedule the hold replaced. It books anew.
		return r.Wait(ctx, key, cost)
	}
	if rt := r.retiring.Load(); rt != nil {
		// Redis does not know what this process granted while it was away:
		// until those local buckets are full again, a grant needs theirs too.
		if time.Now().Before(rt.until) {
			return rt.local.Wait(ctx, key, cost)
		}
		r.retiring.CompareAndSwap(rt, nil)
	}
	return nil
}

// retiring is the local limiter of an outage that has just ended, kept until
// its buckets are full again.
type retiring struct {
	local *Local
	until time.Time
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
// process's share of the limit, with every bucket empty at the start, or at
// the last slot Redis gave this process if that is later, since Redis may
// have granted the whole burst and booked callers who still wait.
func (r *Redis) newFallback() *Local {
	if r.config.policy != FallbackLocal {
		return nil
	}
	loc := newLocal(r.fallbackLimit().share(r.fleet.Size()), r.config.commonConfig)
	loc.emptyAt = loc.now()
	if last := time.Unix(0, r.lastSlot.Load()); last.After(loc.emptyAt) {
		loc.emptyAt = last
	}
	return loc
}

// fallbackLimit is one token bucket that allows no more than any of the
// limits: the lowest rate and the smallest burst, windows taken as buckets.
func (r *Redis) fallbackLimit() Limit {
	fallback := r.limits[0].asBucket()
	for _, l := range r.limits[1:] {
		l = l.asBucket()
		if l.Rate() < fallback.Rate() {
			fallback.count, fallback.period = l.count, l.period
		}
		fallback.burst = min(fallback.burst, l.burst)
	}
	return fallback
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
		args := append(make([]any, 0, 3+len(r.limitArgs)), h.For.Microseconds(), r.holdChannel(), key)
		err := int64Reply(r.calls.run(ctx, holdScript, r.keys(key, false), append(args, r.limitArgs...)...), reply[:])
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
	granted  bool
	delay    time.Duration
	now      int64            // the Redis TIME of the decision, in microseconds
	finishes [maxLimits]int64 // each bucket's schedule time after the booking (0 for windows)
	id       string           // the request's id in sliding windows
	cost     int
}

// slot is when the request goes, by Redis's clock, in microseconds.
func (b booking) slot() int64 { return b.now + b.delay.Microseconds() }

// reserve runs the reserve script once: it books cost units for key under
// every limit unless the wait would exceed budget (noBudget: no limit).
func (r *Redis) reserve(ctx context.Context, key string, cost int, budget time.Duration) (booking, error) {
	b := booking{cost: cost}
	budgetArg := noBudgetArg
	if budget != noBudget {
		budgetArg = budget.Microseconds()
	}
	n := len(r.limits)
	var reply [3 + maxLimits]int64
	var cmd *redis.Cmd
	if r.oneBucket {
		cmd = r.calls.run(ctx, reserveScript, r.keys(key, false), r.limitArgs[1], r.limitArgs[2], cost, budgetArg)
	} else {
		if r.sliding {
			b.id = r.fleet.member + ":" + strconv.FormatUint(r.requestIDs.Add(1), 10)
		}
		args := append(make([]any, 0, 3+len(r.limitArgs)), cost, budgetArg, b.id)
		cmd = r.calls.run(ctx, quotaScript, r.keys(key, false), append(args, r.limitArgs...)...)
	}
	err := int64Reply(cmd, reply[:3+n])
	if err == nil && (reply[0] < 0 || reply[0] > 1 || reply[1] < 0) {
		err = fmt.Errorf("replied %v, want [granted delay now finish...]", append([]int64(nil), reply[:3+n]...))
	}
	if err != nil {
		return booking{}, fmt.Errorf("pace: key %q: reserve script: %w", key, err)
	}
	b.granted, b.delay, b.now = reply[0] == 1, time.Duration(reply[1])*time.Microsecond, reply[2]
	copy(b.finishes[:], reply[3:3+n])
	return b, nil
}

// refundResult says what the refund script did with a booking under one
// limit.
type refundResult int64

const (
	refundNothing refundResult = iota // its time had passed, or the bucket was gone
	refundTail                        // the tokens went back into the bucket, or the window
	refundGap                         // kept as a gap until the bookings behind it go too
)

// refund gives back booking b for key under every limit, and returns what
// became of it under each and the Redis TIME it used, in microseconds. Like
// every call, it has a deadline of its own, so it runs although ctx has
// usually ended.
func (r *Redis) refund(ctx context.Context, key string, b booking) ([maxLimits]refundResult, int64, error) {
	var results [maxLimits]refundResult
	n := len(r.limits)
	args := append(make([]any, 0, 3+3*n), b.id, b.cost, b.slot())
	for i := range r.limits {
		args = append(args, r.limitArgs[3*i], r.limitArgs[3*i+1], b.finishes[i])
	}
	var reply [1 + maxLimits]int64
	err := int64Reply(r.calls.run(ctx, refundScript, r.keys(key, true), args...), reply[:1+n])
	for i, res := range reply[1 : 1+n] {
		if err == nil && (res < int64(refundNothing) || res > int64(refundGap)) {
			err = fmt.Errorf("replied %v, want [now result...] with results 0, 1 or 2", append([]int64(nil), reply[:1+n]...))
		}
		results[i] = refundResult(res)
	}
	if err != nil {
		return results, 0, fmt.Errorf("pace: key %q: refund script: %w", key, err)
	}
	return results, reply[0], nil
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

// keys are the Redis keys of key's limits, each followed by its gaps key when
// withGaps. They share one hash tag: one Redis Cluster slot.
func (r *Redis) keys(key string, withGaps bool) []string {
	base := r.config.prefix + "{" + key + "}"
	if len(r.suffixes) == 1 && !withGaps {
		return []string{base + r.suffixes[0]}
	}
	keys := make([]string, 0, 2*len(r.suffixes))
	for _, suffix := range r.suffixes {
		keys = append(keys, base+suffix)
		if withGaps {
			keys = append(keys, base+suffix+":gaps")
		}
	}
	return keys
}

// bucketKey is the Redis key of key's first limit.
func (r *Redis) bucketKey(key string) string { return r.keys(key, false)[0] }
