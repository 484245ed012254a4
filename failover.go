package pace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/store"
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

// failover decides, for one Redis limiter, who decides each request, and
// keeps everything an outage needs. Its modes:
//
//   - shared: Redis decides. The failover notes, per key, how far ahead
//     Redis has booked it (scheduleTable).
//   - outage: Redis calls failed, as the breaker confirmed. Requests are decided by the policy, under
//     FallbackLocal by the outage's local limiter: this process's share of
//     the limit, each key's bucket empty from the outage's start or, for a
//     key booked ahead, from the end of its schedule. Redis is left alone for a
//     cool-down that doubles (with jitter) after each failed probe, up to a
//     cap; then one request at a time probes it.
//   - returning: a probe succeeded. Until every other process of the fleet
//     can have probed too (returnWindow), the outage's local limiter decides each
//     request first, and Redis books it for the time it will go: so the
//     processes back on Redis and those still away do not both spend the
//     whole limit. A Redis answer that arrives once an outage has begun is
//     booked on the outage's local limiter too, at its slot.
//
// Time enters as a parameter of every method. A failover is safe for
// concurrent use.
type failover struct {
	policy                   FailurePolicy
	minCooldown, maxCooldown time.Duration
	// newLocal returns the local limiter of an outage that begins at since:
	// each key's bucket empty at since, or at its time in floors if later.
	newLocal func(since time.Time, floors map[string]time.Time) *Local

	current atomic.Uint32 // the mode, read without the lock on every request

	mu         sync.Mutex
	breaker    breaker
	failures   int       // in a row
	since      time.Time // when the outage began
	retryAt    time.Time // when the next probe may go
	returnEnds time.Time // when returning ends
	probing    bool      // a probe is under way
	cause      error     // the last failure
	local      *Local    // the outage's local limiter, from the outage to the end of returning
	schedules  scheduleTable
	// debts are what the outage's local limiter granted alone, owed (see
	// repay.go) once returning ends.
	debts outageDebts
	owed  atomic.Pointer[map[string]store.LimitCosts]
}

type mode uint32

const (
	shared mode = iota
	outage
	returning
)

// route says how a request is decided: by Redis, by Redis as the probe, or
// without Redis.
type route uint8

const (
	viaRedis route = iota
	viaProbe
	withoutRedis
)

func (f *failover) mode() mode { return mode(f.current.Load()) }

// route says how a request that begins at now is decided. It also returns
// the outage's local limiter (nil unless the policy is FallbackLocal):
// without Redis, it decides; while returning, it decides first, and Redis
// books the request for the time it will go. Without Redis, it returns the
// failure that began the outage too.
func (f *failover) route(now time.Time) (route, *Local, error) {
	if f.mode() == shared {
		return viaRedis, nil, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.mode() == returning && !now.Before(f.returnEnds):
		f.current.Store(uint32(shared))
		f.local = nil
		if owed := f.debts.close(); len(owed) > 0 {
			f.owed.Store(&owed)
		}
		return viaRedis, nil, nil
	case f.mode() != outage:
		return viaRedis, f.local, nil
	case f.probing || now.Before(f.retryAt):
		return withoutRedis, f.local, f.cause
	}
	f.probing = true
	return viaProbe, nil, nil
}

// granted notes that Redis gave key the slot (by this process's clock, at
// or after now). Unless a local limiter decided the request first (decided),
// it returns the local limiter that must book the grant too: none in shared
// mode; else the outage's: for the probe, and for an answer that arrives once
// an outage has begun.
func (f *failover) granted(key string, slot, now time.Time, decided bool) *Local {
	f.schedules.note(key, slot, slot.Sub(now), now)
	if decided || f.mode() == shared {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local
}

// held notes that key is held until the given time, by this process's
// clock: an outage's local pacing of the key begins after it.
func (f *failover) held(key string, until, now time.Time) { f.schedules.note(key, until, 0, now) }

// failedCall is a Redis call that failed: when it began, whether it was
// the probe, its caller's failed calls in a row (it included), and why.
type failedCall struct {
	began    time.Time
	probe    bool
	failures int
	err      error
}

// fail records call, which failed at now, and returns whether it began an
// outage, whether the process is in one (a failure its breaker does not
// confirm leaves it on Redis), and the outage's local limiter (nil unless
// the policy is FallbackLocal); timeout is the call timeout now.
func (f *failover) fail(now time.Time, call failedCall, timeout time.Duration) (began, down bool, local *Local) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if call.probe {
		f.probing = false
	}
	if f.mode() != outage && !f.breaker.confirms(now, call.began, timeout, call.failures) {
		return false, false, nil
	}
	f.cause = call.err
	f.failures++
	cooldown := f.minCooldown << min(f.failures-1, 30)
	if cooldown > f.maxCooldown || cooldown <= 0 {
		cooldown = f.maxCooldown
	}
	f.retryAt = now.Add(min(time.Duration(float64(cooldown)*(0.8+0.4*rand.Float64())), f.maxCooldown))
	if f.mode() == outage {
		return false, true, f.local
	}
	// Each outage, also one that begins while returning from the last, has
	// a limiter of its own, at the share of the fleet's size now.
	f.since, f.local = now, nil
	if f.policy == FallbackLocal {
		f.local = f.newLocal(now, f.schedules.floors(now))
		f.debts.open()
	}
	f.current.Store(uint32(outage))
	return true, true, f.local
}

// recover records the probe that succeeded at now, when a call's timeout
// is timeout, and returns how long Redis was away.
func (f *failover) recover(now time.Time, timeout time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures, f.probing, f.cause = 0, false, nil
	f.returnEnds = now.Add(returnWindow(f.maxCooldown, timeout))
	next := returning
	if f.local == nil {
		next = shared // nothing to gate: the policy paced no one
	}
	f.current.Store(uint32(next))
	return now.Sub(f.since)
}

// takeOwed returns the debts of the last outage, once: nil until its return
// has ended, and after the first call since.
func (f *failover) takeOwed() map[string]store.LimitCosts {
	if f.owed.Load() == nil {
		return nil
	}
	if owed := f.owed.Swap(nil); owed != nil {
		return *owed
	}
	return nil
}

// down reports whether Redis is taken to be away (an outage), and returns
// the outage's local limiter.
func (f *failover) down() (bool, *Local) {
	if f.mode() != outage {
		return false, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode() == outage, f.local
}
