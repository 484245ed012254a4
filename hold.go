package pace

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A Hold is the upstream's word that a key's quota is spent: no request for
// the key should reach it for For.
type Hold struct {
	For    time.Duration
	Reason string        // the status and header that said so, such as "429 Retry-After: 2"
	Asked  time.Duration // when the hold was capped: what the upstream asked for; else 0
}

// A Holder is a Limiter that can pause a key: Hold makes every wait for key,
// in every process that shares the limiter, end no sooner than h.For from now,
// after which the key resumes at its rate without a burst. A hold never
// shortens a longer one already in place. Local and Redis are Holders; a
// Transport holds a key whenever a response says its quota is spent.
type Holder interface {
	Limiter
	Hold(ctx context.Context, key string, h Hold) error
}

// DefaultMaxHold caps the holds a Transport sets when its MaxHold is zero.
const DefaultMaxHold = time.Hour

// ParseHold reads what a response says of the quota and returns the hold it
// asks for, capped at max, or false when it asks for none. now is when the
// response arrived. It reads the status and headers only, never the body:
//
//   - 429, 503 or 403 with Retry-After, in seconds (whole or decimal) or as
//     an HTTP-date, or with Azure's retry-after-ms or x-ms-retry-after-ms;
//   - RateLimit with a quota whose remaining count is 0, in the IETF draft's
//     structured form (`"default";r=0;t=30`: hold t seconds) or the older
//     `limit=100, remaining=0, reset=30`, and RateLimit-Remaining with
//     RateLimit-Reset in seconds;
//   - X-RateLimit-Remaining (or X-Rate-Limit-Remaining) of 0 with the
//     matching Reset, on any status, as GitHub sends with its 403s. A Reset
//     above 1,000,000,000 is a Unix time (GitHub, X); a smaller one, seconds
//     from now.
//
// When several say so, the longest hold wins. A value that is malformed,
// negative, in the past, or contradicted by its own headers (a remaining
// count above the limit) is ignored.
func ParseHold(resp *http.Response, now time.Time, max time.Duration) (Hold, bool) {
	var best Hold
	consider := func(seconds float64, reason string) {
		if !(seconds > 0) || math.IsInf(seconds, 0) {
			return
		}
		h := Hold{For: max, Reason: reason, Asked: time.Duration(math.MaxInt64)}
		if seconds < max.Seconds() {
			h = Hold{For: time.Duration(math.Ceil(seconds*1e3)) * time.Millisecond, Reason: reason}
		} else if seconds < float64(math.MaxInt64/int64(time.Second)) {
			h.Asked = time.Duration(seconds * float64(time.Second))
		}
		if h.For > best.For {
			best = h
		}
	}
	status := strconv.Itoa(resp.StatusCode) + " "
	header := resp.Header

	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
		if v := header.Get("Retry-After"); v != "" {
			consider(retryAfterSeconds(v, now), status+"Retry-After: "+v)
		}
		for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} { // Azure's, in milliseconds
			if v := header.Get(name); v != "" {
				ms, _ := strconv.ParseFloat(v, 64)
				consider(ms/1000, status+name+": "+v)
			}
		}
	}
	if v := header.Get("RateLimit"); v != "" {
		consider(rateLimitFieldSeconds(v), status+"RateLimit: "+v)
	}
	for _, prefix := range []string{"RateLimit-", "X-RateLimit-", "X-Rate-Limit-"} {
		remaining, reset := header.Get(prefix+"Remaining"), header.Get(prefix+"Reset")
		if seconds, ok := exhaustedUntil(header.Get(prefix+"Limit"), remaining, reset, now, prefix != "RateLimit-"); ok {
			consider(seconds, status+prefix+"Remaining: "+remaining+", "+prefix+"Reset: "+reset)
		}
	}
	return best, best.For > 0
}

// retryAfterSeconds reads a Retry-After value: seconds, or an HTTP-date.
func retryAfterSeconds(v string, now time.Time) float64 {
	if seconds, err := strconv.ParseFloat(v, 64); err == nil {
		return seconds
	}
	if at, err := http.ParseTime(v); err == nil {
		return at.Sub(now).Seconds()
	}
	return 0
}

// rateLimitFieldSeconds reads the IETF RateLimit field and returns how long
// the longest exhausted quota in it lasts, or 0.
func rateLimitFieldSeconds(v string) float64 {
	var longest float64
	items, dictionary := structuredField(v) // the draft's list, or the older dictionary: limit=100, remaining=0, reset=30
	for _, item := range items {
		remaining, errR := strconv.ParseInt(item.params["r"], 10, 64)
		reset, errT := strconv.ParseInt(item.params["t"], 10, 64)
		if errR == nil && errT == nil && remaining == 0 && reset > 0 {
			longest = max(longest, float64(reset))
		}
	}
	if seconds, ok := exhaustedUntil(dictionary["limit"], dictionary["remaining"], dictionary["reset"], time.Time{}, false); ok {
		longest = max(longest, seconds)
	}
	return longest
}

// exhaustedUntil reads a remaining count and its reset, and returns the
// seconds until the reset when the count is 0. With epochs, a reset above
// 1,000,000,000 is a Unix time. A limit below the remaining count
// contradicts it, and nothing is returned.
func exhaustedUntil(limit, remaining, reset string, now time.Time, epochs bool) (float64, bool) {
	left, err := strconv.ParseInt(strings.TrimSpace(remaining), 10, 64)
	if err != nil || left != 0 {
		return 0, false
	}
	if limit != "" {
		if n, err := strconv.ParseInt(strings.TrimSpace(limit), 10, 64); err != nil || n < left {
			return 0, false
		}
	}
	seconds, err := strconv.ParseFloat(strings.TrimSpace(reset), 64)
	if err != nil || seconds <= 0 || math.IsInf(seconds, 0) || math.IsNaN(seconds) {
		return 0, false
	}
	if epochs && seconds > 1e9 {
		seconds -= float64(now.UnixNano()) / 1e9
	}
	return seconds, seconds > 0
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

// checkHold reports a hold that cannot be set: on an empty key, or not
// positive, or longer than MaxDelay.
func checkHold(key string, h Hold) error {
	switch {
	case key == "":
		return fmt.Errorf("pace: Hold: empty key (%s)", h.Reason)
	case h.For <= 0 || h.For > MaxDelay:
		return fmt.Errorf("pace: key %s: Hold for %v (%s): want a positive time of at most MaxDelay", quoteKey(key), h.For, h.Reason)
	}
	return nil
}
