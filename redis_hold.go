package pace

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/expiring"
)

// headers.Hold pauses key: in Redis, for every process of the fleet, no
// wait for key ends sooner than h.For from now (by Redis's clock), capped
// at the limiter's MaxHold (see WithMaxHold); a hold of a quota that none
// of the limits is (see Hold.Quota) holds nothing. While Redis is away, the
// hold goes to this process's outage limiter alone.
func (r *Redis) Hold(ctx context.Context, key string, h headers.Hold) error {
	_, err := r.hold(ctx, key, h)
	return err
}

// hold is Hold; it also returns when key's hold before this one ended (0
// for none, or not held here), which a refusal's weight looks back at (see
// internal/steer's Rate.Refused).
func (r *Redis) hold(ctx context.Context, key string, h headers.Hold) (before int64, err error) {
	h, holds, err := r.config.hold(r.namedLimits, key, h)
	if err != nil || !holds {
		return 0, err
	}
	r.listen()
	err = r.shared(ctx, key, true, func() error {
		changed, end, was, err := r.store.Hold(ctx, key, h.For, r.holdChannel())
		if err == nil {
			before = was
			r.heard(key, end, h.For)
			reportHold(ctx, r.config.observer, redisLimiter, key, h, changed)
		}
		return err
	}, func(local *Local) error { return holdLocally(ctx, local, key, h) })
	return before, err
}

// holdLocally holds key on an outage's local limiter, if there is one.
func holdLocally(ctx context.Context, local *Local, key string, h headers.Hold) error {
	if local == nil {
		return nil
	}
	return local.Hold(ctx, key, h)
}

// replacedByHold reports whether a hold replaced the time of booking t while
// its caller slept (for t's delay, not 0). A caller booked before the hold
// channel's subscription last stood may have missed the hold's message, and
// reads the key's hold from Redis.
func (r *Redis) replacedByHold(ctx context.Context, key string, t booking) bool {
	if t.local != nil && t.local.heldPast(key, t.start.Add(t.delay)) {
		return true
	}
	if !t.redis.Granted {
		return false
	}
	due := t.redis.Due()
	if r.held.before(key, due) {
		return true
	}
	if !r.missedHolds(t.start) {
		return false
	}
	end, err := r.store.HeldUntil(ctx, key)
	return err == nil && due < end
}

// heldKeys are the holds a process has heard of: when each ends, by
// Redis's clock.
type heldKeys struct {
	n  atomic.Int32 // how many, read without the lock on every wake
	mu sync.Mutex
	m  expiring.Latest
}

// add notes that key is held until end (Redis's clock, in microseconds), a
// hold of d from now.
func (h *heldKeys) add(key string, end int64, d time.Duration, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.Note(key, end, now.Add(d+time.Second), now)
	h.n.Store(int32(h.m.Len()))
}

// before reports whether a time for key (Redis's clock, in microseconds)
// falls before the end of a hold: the booking predates the hold.
func (h *heldKeys) before(key string, due int64) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	end, ok := h.m.Get(key)
	return ok && due < end
}

// parseHoldMessage reads what the hold script publishes: the key, a
// newline, the hold's end and its length, in microseconds of Redis's clock.
func parseHoldMessage(payload string) (key string, end int64, d time.Duration, ok bool) {
	key, rest, ok := strings.Cut(payload, "\n")
	endText, lengthText, ok2 := strings.Cut(rest, " ")
	end, err1 := strconv.ParseInt(endText, 10, 64)
	length, err2 := strconv.ParseInt(lengthText, 10, 64)
	if !ok || !ok2 || err1 != nil || err2 != nil || length <= 0 || length > math.MaxInt64/int64(time.Microsecond) {
		return "", 0, 0, false
	}
	return key, end, time.Duration(length) * time.Microsecond, true
}

// heard notes a hold of key that ends at end (Redis's clock, in
// microseconds), a hold of d from now.
func (r *Redis) heard(key string, end int64, d time.Duration) {
	now := r.now()
	r.held.add(key, end, d, now)
	r.failover.Held(key, now.Add(d), now)
	r.voidLeases(key)
}

// missedHolds reports whether a caller booked at start may have missed a
// hold's message: the subscription broke after it.
func (r *Redis) missedHolds(start time.Time) bool {
	return r.resubscribed.Load() > start.UnixNano()
}
