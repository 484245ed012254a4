package pace

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fleetpace/pace/internal/outage"
	"github.com/redis/go-redis/v9"
)

// Check asks Redis, once, whether this limiter can work there: that it
// answers within ctx (a first connection may take as long as ctx allows,
// not a call timeout), that the connection's set-up passes (its password,
// its DB index) and that Redis runs pace's scripts. It then counts the
// fleet, as a heartbeat does, so that an outage that comes before the
// first request paces at this process's share. It books nothing and
// changes no key.
//
// A Check that fails confirms an outage (EventFallback, whose Reason says
// when Redis has never answered): the requests that follow are decided by
// the FailurePolicy at once, and one probes Redis after the cool-down.
//
// It returns nil, or an error that names the Redis and the cause, such as
// "dial tcp 10.0.0.7:6379: connect: connection refused" or "ERR DB index is
// out of range". A program can call it at start and refuse to start
// without Redis, or log it and go on: the limiter then decides by its
// FailurePolicy until Redis answers. A process that Redis has never
// answered has never counted its fleet, and takes itself to be alone: under
// FallbackLocal it paces at the whole limit, unless WithFleetSize says the
// fleet's size.
func (r *Redis) Check(ctx context.Context) error {
	began := r.now()
	now, err := r.store.Check(ctx)
	if err != nil {
		// Redis did not answer within the caller's whole deadline, or
		// refused the connection: that confirms an outage, which the next
		// requests need not find out again, a call timeout each.
		r.outcome(ctx, redisCall{route: outage.ViaRedis, began: began, failures: outage.ConfirmRow - 1}, err)
		return fmt.Errorf("pace: Check: Redis %s: %w", describeClient(r.client), err)
	}
	r.calls.Answers.Add(1) // the breaker's row of failures ends
	if err := r.checkCommands(ctx); err != nil {
		return fmt.Errorf("pace: Check: Redis %s: %w", describeClient(r.client), err)
	}
	if p, ok := r.client.(pipeliner); ok && r.fleet.pinned == 0 {
		if err := r.fleet.beat(ctx, r.calls, p.Pipeline(), now); err != nil {
			return fmt.Errorf("pace: Check: Redis %s: counting the fleet: %w", describeClient(r.client), err)
		}
	}
	return nil
}

// minRedis is the oldest Redis that runs pace's scripts: they keep keys'
// expiries with PEXPIRETIME, which Redis 7.0 brought.
const minRedis = "7.0"

// asker is a client that can send any command, and ask for INFO: every
// client go-redis makes.
type asker interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
	Info(ctx context.Context, sections ...string) *redis.StringCmd
}

// checkCommands asks Redis for what pace's scripts need beyond Lua, when
// the client can ask (an asker): PEXPIRETIME, on a key of the limiter's
// that is never there. A Redis that lacks it is named by its version
// (INFO server), as is what it lacks.
func (r *Redis) checkCommands(ctx context.Context) error {
	c, ok := r.client.(asker)
	if !ok {
		return nil
	}
	err := c.Do(ctx, "PEXPIRETIME", r.config.prefix+"{check}#never").Err()
	if err == nil {
		return nil
	}
	var redisErr redis.Error
	if !errors.As(err, &redisErr) {
		return err // no answer: not what it lacks
	}
	return fmt.Errorf("Redis %s lacks PEXPIRETIME (%w), which pace's scripts need: Redis %s or later", redisVersion(ctx, c), err, minRedis)
}

// redisVersion is the version INFO server states, or "of an unknown
// version".
func redisVersion(ctx context.Context, c asker) string {
	info, err := c.Info(ctx, "server").Result()
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if ok && err == nil && v != "" && len(v) <= 32 && strings.Trim(v, "0123456789.") == "" {
			return v
		}
	}
	return "of an unknown version"
}

// describeClient names the Redis a client reaches, for a message: its
// address, or addresses, and DB.
func describeClient(c redis.Scripter) string {
	switch c := c.(type) {
	case *redis.Client:
		return fmt.Sprintf("at %s (DB %d)", c.Options().Addr, c.Options().DB)
	case *redis.ClusterClient:
		return "cluster at " + strings.Join(c.Options().Addrs, ", ")
	}
	return fmt.Sprintf("(a %T)", c)
}
