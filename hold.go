package pace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
	"github.com/fleetpace/pace/internal/store"
)

// A Hold is the upstream's word that a key's quota is spent: no request for
// the key should reach it for For. Local.Hold and Redis.Hold pause a key so
// (a Transport does whenever a response says its quota is spent): the hold
// spends nothing, and afterwards the key resumes at its rate, with the
// burst its buckets had and refilled meanwhile. A hold never shortens a
// longer one already in place.
type Hold struct {
	For    time.Duration
	Reason string        // the status and header that said so, such as "429 Retry-After: 2"
	Asked  time.Duration // when the hold was capped: what the upstream asked for; else 0
	// Quota names the upstream's quota that is spent, as a Reading names it
	// (a GitHub resource, an IETF policy); "" for the whole key, as a
	// Retry-After says. A limiter holds a key for a named quota only when
	// the quota is about one of its limits (see ParseReadings).
	Quota string

	only, own bool // its reading was the response's only one; names a quota of its own
}

// DefaultMaxHold is the longest that anything a response says can delay a
// key, unless a limiter is told otherwise (WithMaxHold).
const DefaultMaxHold = time.Hour

// ParseHold reads what a response says of the quota and returns the hold it
// asks for, capped at max, or false when it asks for none. now is when the
// response arrived. It reads the status and headers only, never the body,
// on the clock of ParseReadings:
//
//   - 429, 503 or 403 with Retry-After, in seconds (whole or decimal) or as
//     an HTTP-date, or with Azure's retry-after-ms or x-ms-retry-after-ms:
//     a hold of the whole key;
//   - on any status, a reading (ParseReadings) of a window with no unit
//     left: a hold of its quota until the window resets, as GitHub says
//     with its 403s (X-RateLimit-Remaining: 0) and the IETF draft with
//     "default";r=0;t=30, or RateLimit-Remaining: 0 with RateLimit-Reset.
//
// When several say so, the longest hold wins. A value that is malformed,
// negative, in the past, or contradicted by its own headers (a remaining
// count above the limit) is ignored.
func ParseHold(resp *http.Response, now time.Time, max time.Duration) (Hold, bool) {
	var longest Hold
	for _, h := range hear(resp, now, max).holds {
		if h.For > longest.For {
			longest = h
		}
	}
	return longest, longest.For > 0
}

// retryAfter reads the Retry-After of a 429, 503 or 403 (or Azure's
// retry-after-ms or x-ms-retry-after-ms), on clock, as a hold of the whole
// key capped at max, with status (such as "429 ") in its reason.
func retryAfter(resp *http.Response, clock *readingClock, max time.Duration, status string) (Hold, bool) {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
	default:
		return Hold{}, false
	}
	var longest Hold
	if v := resp.Header.Get("Retry-After"); v != "" {
		longest = capHold(retryAfterSeconds(v, clock), max, Hold{Reason: status + "Retry-After: " + v})
	}
	for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} { // Azure's, in milliseconds
		if v := resp.Header.Get(name); v != "" {
			ms, _ := strconv.ParseFloat(v, 64)
			if h := capHold(ms/1000, max, Hold{Reason: status + name + ": " + v}); h.For > longest.For {
				longest = h
			}
		}
	}
	return longest, longest.For > 0
}

// capHold is h, for seconds capped at max (with what was asked, when
// capped); For is 0 when seconds is not a positive finite number.
func capHold(seconds float64, max time.Duration, h Hold) Hold {
	switch {
	case !(seconds > 0) || math.IsInf(seconds, 0):
		return Hold{}
	case seconds < max.Seconds():
		h.For = time.Duration(math.Ceil(seconds*1e3)) * time.Millisecond
	default:
		h.For, h.Asked = max, time.Duration(math.MaxInt64)
		if seconds < float64(math.MaxInt64/int64(time.Second)) {
			h.Asked = time.Duration(seconds * float64(time.Second))
		}
	}
	return h
}

// retryAfterSeconds reads a Retry-After value: seconds, or an HTTP-date
// taken against clock.
func retryAfterSeconds(v string, clock *readingClock) float64 {
	if seconds, err := strconv.ParseFloat(v, 64); err == nil {
		return seconds
	}
	if at, err := http.ParseTime(v); err == nil {
		return at.Sub(clock.at()).Seconds()
	}
	return 0
}

// reportHold tells o that limiter held key as h says: a cap when there was
// one, and, when changed (the hold outlasts what was in place), the hold and
// later its end.
func reportHold(ctx context.Context, o Observer, limiter, key string, h Hold, changed bool) {
	if o == nil {
		return
	}
	if h.Asked > 0 {
		o(ctx, Event{Kind: EventHoldCapped, Limiter: limiter, Key: key, Delay: h.Asked, Reason: h.Reason})
	}
	if !changed {
		return
	}
	o(ctx, Event{Kind: EventHold, Limiter: limiter, Key: key, Delay: h.For, Reason: h.Reason})
	ctx = context.WithoutCancel(ctx)
	time.AfterFunc(h.For, func() {
		o(ctx, Event{Kind: EventHoldEnd, Limiter: limiter, Key: key, Reason: h.Reason})
	})
}

// hold returns h as the limiter sets it for key: capped at the limiter's
// bound (and saying what was asked), and whether it holds the key at all
// (a hold of a quota none of limits is holds nothing); or why it cannot be
// set: an empty key, or a hold that is not positive.
func (c commonConfig) hold(limits namedLimits, key string, h Hold) (Hold, bool, error) {
	switch {
	case key == "":
		return h, false, fmt.Errorf("pace: Hold: empty key (%s)", h.Reason)
	case h.For <= 0:
		return h, false, fmt.Errorf("pace: key %s: Hold for %v (%s): want a positive time", store.QuoteKey(key), h.For, h.Reason)
	}
	if bound := c.holdBound(); h.For > bound {
		h.For, h.Asked = bound, max(h.Asked, h.For)
	}
	return h, limits.holds(h), nil
}

// Hold pauses key: in Redis, for every process of the fleet, no
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
		changed, end, err = r.store.Hold(ctx, key, h.For, r.holdChannel())
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

// replacedByHold reports whether a hold replaced the time of ticket t while
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
	if !t.booking.Granted {
		return false
	}
	due := t.booking.Due()
	if r.held.before(key, due) {
		return true
	}
	if !r.missedHolds(t.start) {
		return false
	}
	end, err := r.store.HeldUntil(ctx, key)
	return err == nil && due < end
}

// Hold pauses key: no wait for key ends sooner than h.For from now,
// capped at the limiter's MaxHold (see WithMaxHold); a hold of a quota that
// none of the limits is (see Hold.Quota) holds nothing.
func (loc *Local) Hold(ctx context.Context, key string, h Hold) error {
	h, holds, err := loc.config.hold(loc.namedLimits, key, h)
	if err != nil || !holds {
		return err
	}
	now := loc.now()
	until := now.Add(h.For)
	shard := loc.shard(key)
	shard.mu.Lock()
	changed := !shard.holds[key].After(until)
	if changed {
		shard.holds[key] = until
	}
	shard.mu.Unlock()
	reportHold(ctx, loc.config.observer, "local", key, h, changed)
	return nil
}

// A hold must stop every request of the fleet, also those already booked
// and asleep, in every process. So the hold script publishes each hold, and
// every Redis limiter listens: a caller that wakes to find that its time lies
// before the end of a hold (both by Redis's clock) books again, after the
// hold, instead of going.

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
}

// missedHolds reports whether a caller booked at start may have missed a
// hold's message: the subscription broke after it.
func (r *Redis) missedHolds(start time.Time) bool {
	return r.resubscribed.Load() > start.UnixNano()
}
