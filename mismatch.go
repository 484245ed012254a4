package pace

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
	"github.com/fleetpace/pace/internal/store"
)

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
	r.config.observer.emit(ctx, Event{Kind: EventMismatch, Limiter: "redis", Key: key,
		Reason: fmt.Sprintf("this process paces the key at %s, another at %s: the fleet keeps %s until all agree", own, other, stricter)})
}
