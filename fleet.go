package pace

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/store"
	"github.com/redis/go-redis/v9"
)

// fleet keeps count of the processes that share a limiter, so that when
// Redis fails each can pace at its share of the limit. While Redis answers,
// every process that is making requests adds itself to a sorted set in Redis
// once per heartbeat, scored by Redis's clock, and reads how many others did
// within the last heartbeatTTL. An idle process drops out, leaving its share
// to the busy ones.
type fleet struct {
	key      string // prefix{fleet}#name
	member   string // this process (Process.member)
	pinned   int    // a size the user set, or 0
	size     atomic.Int64
	nextBeat atomic.Int64 // time.Now().UnixNano() of the next heartbeat
	gap      atomic.Int64 // the time to the heartbeat after it; 0 before the first
}

const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 3 * heartbeatEvery
	// firstBeatGap is the time from a process's first heartbeat to its
	// second; each gap after it doubles, up to heartbeatEvery.
	firstBeatGap = 5 * time.Millisecond
)

func newFleet(prefix, name string, pinned int, p *Process) *fleet {
	return &fleet{key: prefix + "{" + store.FleetTag + "}#" + name, member: p.member, pinned: pinned}
}

// Size returns the fleet's size: the pinned one, else the last one counted,
// else 1 (before any heartbeat, a process knows of no other).
func (f *fleet) Size() int {
	if f.pinned > 0 {
		return f.pinned
	}
	return max(int(f.size.Load()), 1)
}

// beatDue reports whether this process should send its heartbeat now; only
// one caller a gap gets true. The first heartbeat goes with the first
// reservation, and the gaps after it double from firstBeatGap, so that
// processes started together count one another within a few round trips of
// the last one's start, not at a second heartbeat a tenth of a period on.
func (f *fleet) beatDue(now time.Time) bool {
	next := f.nextBeat.Load()
	gap := time.Duration(f.gap.Load())
	if now.UnixNano() < next || !f.nextBeat.CompareAndSwap(next, now.Add(gap).UnixNano()) {
		return false
	}
	f.gap.Store(int64(min(max(2*gap, firstBeatGap), heartbeatEvery)))
	return true
}

// beat sends the heartbeat through p in one round trip, at redisNow (Redis's
// clock, in microseconds, from the reservation just made), and counts the
// fleet.
func (f *fleet) beat(ctx context.Context, c *store.Caller, p redis.Pipeliner, redisNow int64) error {
	ttl := heartbeatTTL.Microseconds()
	p.ZRemRangeByScore(ctx, f.key, "-inf", strconv.FormatInt(redisNow-ttl, 10))
	p.ZAdd(ctx, f.key, redis.Z{Score: float64(redisNow), Member: f.member})
	count := p.ZCard(ctx, f.key)
	p.PExpire(ctx, f.key, heartbeatTTL)
	if _, err := c.Pipeline(ctx, p); err != nil {
		f.nextBeat.Store(time.Now().Add(firstBeatGap).UnixNano()) // soon again: the count may be stale
		return err
	}
	f.size.Store(count.Val())
	return nil
}
