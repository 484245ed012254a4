package pace

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
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

// counted reports whether the fleet's size is known: pinned, or counted
// by a heartbeat.
func (f *fleet) counted() bool { return f.pinned > 0 || f.size.Load() > 0 }

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

// While a deploy rolls out a new limit, the processes of a fleet pace one
// key at different limits. A key of one bucket then books at the
// strictest standing in Redis, whichever process books it, until all
// agree (see lua/limits.lua), and each process that sees the disagreement
// in a booking's reply tells its observer (EventMismatch), once a second
// per key at most.

// Announce tells the fleet that this limiter paces key at its limit, as
// its bookings do, without booking anything: while processes disagree, a
// key of one bucket goes at the stricter limit (see EventMismatch), and a
// stricter one than the fleet's takes the place of the fleet's at once:
// the requests booked before it, asleep in any process, book anew, at it.
// A program that replaces a limiter (a reload of its configuration) calls
// it on the keys it knows, so that a lowered limit holds from then on,
// not once the old one's bookings have gone. It does nothing for a quota
// of several limits, or while Redis is away.
func (r *Redis) Announce(ctx context.Context, key string) error {
	if key == "" {
		return &requestError{"pace: Announce: empty key"}
	}
	r.listen()
	return r.shared(ctx, key, false, func() error { return r.store.Announce(ctx, key) }, nil)
}

// mismatchEvery is how often, at most, a process reports one key's
// disagreement.
const mismatchEvery = time.Second

// mismatches remembers, per key, when this process last reported a
// disagreement. The zero value is ready.
type mismatches struct {
	mu   sync.Mutex
	told expiring.Map[struct{}]
}

// due reports whether key's disagreement is to be reported at now, and if
// so notes it.
func (m *mismatches) due(key string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, told := m.told.Get(key); told {
		return false
	}
	m.told.Put(key, struct{}{}, now.Add(mismatchEvery), now)
	return true
}

// mismatch reports that b, a booking of key, found another process pacing
// key at another limit, unless reported within the last second.
func (r *Redis) mismatch(ctx context.Context, key string, b store.Booking) {
	if b.Other.Interval == 0 || r.config.observer == nil || !r.mismatches.due(key, r.now()) {
		return
	}
	own, other := r.limits[0], Per(float64(time.Second/time.Microsecond)/float64(b.Other.Interval), time.Second).WithBurst(int(b.Other.Burst))
	stricter := own
	if b.Other.Interval > own.intervalMicros() || b.Other.Interval == own.intervalMicros() && int(b.Other.Burst) < own.burst {
		stricter = other
	}
	r.config.observer.emit(ctx, Event{Kind: EventMismatch, Limiter: redisLimiter, Key: key,
		Reason: fmt.Sprintf("this process paces the key at %s, another at %s: the fleet keeps %s until all agree", own, other, stricter)})
}
