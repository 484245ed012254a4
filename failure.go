package pace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A FailurePolicy says what a Redis limiter does while Redis fails.
type FailurePolicy uint8

const (
	// FallbackLocal paces each key in this process at its share of the
	// limit: the rate and burst divided by the fleet's size. It is the default.
	FallbackLocal FailurePolicy = iota
	// FailOpen lets every request through at once, unpaced.
	FailOpen
	// FailClosed fails every request with an error that wraps ErrUnavailable.
	FailClosed
)

// String returns the policy's name, such as "FallbackLocal".
func (p FailurePolicy) String() string {
	switch p {
	case FallbackLocal:
		return "FallbackLocal"
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", uint8(p))
}

// ErrUnavailable is wrapped by the errors of a FailClosed limiter while Redis
// fails.
var ErrUnavailable = errors.New("pace: Redis unavailable")

// isRedisFailure tells a failure of Redis, which the failure policy handles,
// from an error about one key's data (a foreign value or type at the key),
// which the caller gets as it is: another Redis would not help.
func isRedisFailure(err error) bool {
	var redisErr redis.Error
	if errors.As(err, &redisErr) {
		msg := redisErr.Error()
		return !strings.HasPrefix(msg, "WRONGTYPE") && !strings.Contains(msg, "pace: bucket")
	}
	return true
}

// A breaker keeps a failing Redis from being asked on every request. After a
// failure, requests go without Redis for a cool-down that doubles with each
// failed probe, with jitter, up to a cap; then one request at a time probes
// Redis, and the first that succeeds brings the shared limit back.
type breaker struct {
	minCooldown, maxCooldown time.Duration

	open atomic.Bool // the fast path: false while Redis answers

	mu       sync.Mutex
	failures int       // in a row
	since    time.Time // when the outage began
	retryAt  time.Time // when the next probe may go
	probing  bool      // a probe is under way
	cause    error     // the last failure
	fallback *Local    // this outage's local pacing, under FallbackLocal
}

// route says how a request is decided: by Redis, by Redis as the probe, or
// without Redis. Without Redis, it also returns why, and the outage's local
// limiter (nil unless the policy is FallbackLocal).
type route uint8

const (
	viaRedis route = iota
	viaProbe
	withoutRedis
)

func (b *breaker) route(now time.Time) (route, error, *Local) {
	if !b.open.Load() {
		return viaRedis, nil, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.open.Load():
		return viaRedis, nil, nil
	case b.probing || now.Before(b.retryAt):
		return withoutRedis, b.cause, b.fallback
	}
	b.probing = true
	return viaProbe, nil, nil
}

// fail records a failed Redis call and returns the limiter's state: whether
// this failure began the outage, and the local limiter and cause to use.
// fallback makes the outage's local limiter when it begins.
func (b *breaker) fail(now time.Time, probe bool, err error, fallback func() *Local) (began bool, local *Local) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	b.cause = err
	b.failures++
	cooldown := b.minCooldown << min(b.failures-1, 30)
	if cooldown > b.maxCooldown || cooldown <= 0 {
		cooldown = b.maxCooldown
	}
	cooldown = min(time.Duration(float64(cooldown)*(0.8+0.4*rand.Float64())), b.maxCooldown)
	b.retryAt = now.Add(cooldown)
	if !b.open.Load() {
		b.since = now
		b.fallback = fallback()
		b.open.Store(true)
		return true, b.fallback
	}
	return false, b.fallback
}

// local returns the current outage's local limiter, or nil.
func (b *breaker) local() *Local {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fallback
}

// recover records a successful probe and returns how long Redis was away
// and the outage's local limiter (nil unless the policy is FallbackLocal).
func (b *breaker) recover(now time.Time) (time.Duration, *Local) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fallback := b.fallback
	b.open.Store(false)
	b.failures, b.probing, b.cause, b.fallback = 0, false, nil, nil
	return now.Sub(b.since), fallback
}
