package pace

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
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
// A Redis is safe for concurrent use. Create it with NewRedis.
type Redis struct {
	client   redis.Scripter
	limit    Limit
	interval int64 // microseconds one token adds to the schedule
	config   redisConfig

	// The script arguments that never change, boxed once rather than on
	// every call.
	intervalArg, burstArg any
}

var _ Limiter = (*Redis)(nil)

var (
	//go:embed lua/reserve.lua
	reserveSource string
	reserveScript = redis.NewScript(reserveSource)

	//go:embed lua/refund.lua
	refundSource string
	refundScript = redis.NewScript(refundSource)
)

// refundTimeout bounds the call that gives a cancelled booking back, which
// runs after the caller's own context has ended.
const refundTimeout = time.Second

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
	r := &Redis{client: client, limit: l, interval: l.intervalMicros(), config: redisConfig{prefix: DefaultPrefix}}
	r.intervalArg, r.burstArg = r.interval, int64(l.burst)
	for _, o := range opts {
		o.applyRedis(&r.config)
	}
	if err := r.config.validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Wait implements Limiter. It books cost tokens for key in Redis and sleeps
// until they are due; if ctx ends first, the tokens go back to the bucket,
// so that the next callers get them sooner.
func (r *Redis) Wait(ctx context.Context, key string, cost int) error {
	if err := checkWait(ctx, r.limit, key, cost); err != nil {
		return err
	}
	budget := waitBudget(ctx, r.config.maxWait, time.Now())
	b, err := r.reserve(ctx, key, cost, budget)
	if err != nil {
		return err
	}
	if !b.granted {
		return refuse(r.config.observer, "redis", key, cost, b.delay, budget)
	}
	r.config.observer.emit(Event{Kind: EventWait, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay})
	if err := sleep(ctx, key, b.delay); err != nil {
		if _, _, refundErr := r.refund(ctx, key, cost, b.finish); refundErr != nil {
			err = errors.Join(err, refundErr)
		}
		r.config.observer.emit(Event{Kind: EventCancel, Limiter: "redis", Key: key, Cost: cost, Delay: b.delay, Err: err})
		return err
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
	err := int64Reply(reserveScript.Run(ctx, r.client, []string{r.bucketKey(key)},
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
// microseconds. It runs on a context of its own, since ctx has usually ended.
func (r *Redis) refund(ctx context.Context, key string, cost int, finish int64) (refundResult, int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	defer cancel()
	base := r.bucketKey(key)
	var reply [2]int64
	err := int64Reply(refundScript.Run(ctx, r.client, []string{base, base + ":gaps"},
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
