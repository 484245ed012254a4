// Package outage keeps what a Redis limiter knows of Redis's failures:
// the breaker that confirms an outage, the modes the limiter goes through,
// how far ahead Redis had booked each key (where an outage's local pacing
// begins), and the debts of what the outage granted alone. Time enters as a
// parameter of every method; the outage's local limiter is the type
// parameter L, which this package makes (Config.NewLocal) and hands out but
// never calls.
package outage

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// Config is what a Failover is made of.
type Config[L comparable] struct {
	// PacesLocally says that the limiter paces locally while Redis is
	// away (pace.FallbackLocal): an outage then has a local limiter.
	PacesLocally bool
	// MinCooldown and MaxCooldown bound how long Redis is left alone
	// between probes.
	MinCooldown, MaxCooldown time.Duration
	// NewLocal returns the local limiter of an outage that begins at
	// since: each key's bucket empty at since, or at its time in floors if
	// later.
	NewLocal func(since time.Time, floors map[string]time.Time) L
	// Release, if set, is told of each local limiter NewLocal returned once
	// the failover no longer uses it.
	Release func(L)
	// Jitter, if set, draws the spread of each cool-down, from 0 to 1, so
	// that a fleet's processes do not probe together; else math/rand's.
	Jitter func() float64
}

// ReturnWindow is how long a process that is back on Redis keeps its outage's
// share: until every other busy process of the fleet, whose cool-down is at
// most maxCooldown, can have probed too, its probe a call of timeout (at
// most 1.25 times it) long, with as much again to spare.
func ReturnWindow(maxCooldown, timeout time.Duration) time.Duration { return maxCooldown + 2*timeout }

// A Failover decides, for one Redis limiter, who decides each request, and
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
//     can have probed too (ReturnWindow), the outage's local limiter decides each
//     request first, and Redis books it for the time it will go: so the
//     processes back on Redis and those still away do not both spend the
//     whole limit. A Redis answer that arrives once an outage has begun is
//     booked on the outage's local limiter too, at its time.
//
// The zero L is no local limiter. A Failover is safe for concurrent use.
type Failover[L comparable] struct {
	config Config[L]

	current atomic.Uint32 // the mode, read without the lock on every request

	mu         sync.Mutex
	breaker    breaker
	failures   int       // in a row
	since      time.Time // when the outage began
	retryAt    time.Time // when the next probe may go
	returnEnds time.Time // when returning ends
	probing    bool      // a probe is under way
	cause      error     // the last failure
	local      L         // the outage's local limiter, from the outage to the end of returning
	released   bool      // Config.Release was told of local
	schedules  scheduleTable
	// debts are what the outage's local limiter granted alone, owed (see
	// pace.Redis.repay) once returning ends.
	debts debts
	owed  atomic.Pointer[map[string]store.LimitCosts]
}

// New returns a Failover in the shared mode.
func New[L comparable](config Config[L]) *Failover[L] { return &Failover[L]{config: config} }

// CountAnswers tells the breaker how many calls Redis answered without an
// error: a row of failures ends at an answer.
func (f *Failover[L]) CountAnswers(answers *atomic.Uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.breaker.answers = answers
}

// Owe adds costs (fewer, for a settlement's credit) to what key owes, while
// an outage is under way or being returned from: what its local limiter
// granted alone, which TakeOwed hands back once the return has ended.
func (f *Failover[L]) Owe(key string, costs, less store.LimitCosts) { f.debts.owe(key, costs, less) }

// Last returns when the last outage began (zero for none), and, while it
// lasts, its latest failure.
func (f *Failover[L]) Last() (since time.Time, cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.since, f.cause
}

// A Mode is one of a Failover's modes.
type Mode uint32

// The modes.
const (
	Shared Mode = iota
	Outage
	Returning
)

// A Route says how a request is decided: by Redis, by Redis as the probe,
// or without Redis.
type Route uint8

// The routes.
const (
	ViaRedis Route = iota
	ViaProbe
	WithoutRedis
)

// Mode returns the mode now.
func (f *Failover[L]) Mode() Mode { return Mode(f.current.Load()) }

// Route says how a request that begins at now is decided. It also returns
// the outage's local limiter (none unless the policy paces locally):
// without Redis, it decides; while returning, it decides first, and Redis
// books the request for the time it will go. Without Redis, it returns the
// failure that began the outage too.
func (f *Failover[L]) Route(now time.Time) (Route, L, error) {
	if f.Mode() == Shared {
		return ViaRedis, zero[L](), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.Mode() == Returning && !now.Before(f.returnEnds):
		f.current.Store(uint32(Shared))
		f.drop()
		if owed := f.debts.close(); len(owed) > 0 {
			f.owed.Store(&owed)
		}
		return ViaRedis, zero[L](), nil
	case f.Mode() != Outage:
		return ViaRedis, f.local, nil
	case f.probing || now.Before(f.retryAt):
		return WithoutRedis, f.local, f.cause
	}
	f.probing = true
	return ViaProbe, zero[L](), nil
}

// Granted notes that Redis gave key the time (by this process's clock, at
// or after now). Unless a local limiter decided the request first (decided),
// it returns the local limiter that must book the grant too: none in shared
// mode; else the outage's: for the probe, and for an answer that arrives once
// an outage has begun.
func (f *Failover[L]) Granted(key string, due, now time.Time, decided bool) L {
	f.schedules.note(key, due, due.Sub(now), now)
	if decided || f.Mode() == Shared {
		return zero[L]()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local
}

// Ahead returns how far past now key's shared schedule reaches, as this
// process knows it: the last turn Redis gave it, or a hold's end.
func (f *Failover[L]) Ahead(key string, now time.Time) time.Duration {
	return f.schedules.ahead(key, now)
}

// Held notes that key is held until the given time, by this process's
// clock: an outage's local pacing of the key begins after it.
func (f *Failover[L]) Held(key string, until, now time.Time) { f.schedules.note(key, until, 0, now) }

// Failure is a Redis call that failed: when it began, whether it was
// the probe, its caller's failed calls in a row (it included), and why.
type Failure struct {
	Began    time.Time
	Probe    bool
	Failures int
	Err      error
}

// Fail records call, which failed at now, and returns whether it began an
// outage, whether the process is in one (a failure its breaker does not
// confirm leaves it on Redis), and the outage's local limiter (none unless
// the policy is FallbackLocal); timeout is the call timeout now.
func (f *Failover[L]) Fail(now time.Time, call Failure, timeout time.Duration) (began, down bool, local L) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if call.Probe {
		f.probing = false
	}
	if f.Mode() != Outage && !f.breaker.confirms(now, call.Began, timeout, call.Failures, store.IsExpiry(call.Err), store.AtCeiling(call.Err)) {
		return false, false, zero[L]()
	}
	f.cause = call.Err
	f.failures++
	cooldown := f.config.MinCooldown << min(f.failures-1, 30)
	if cooldown > f.config.MaxCooldown || cooldown <= 0 {
		cooldown = f.config.MaxCooldown
	}
	jitter := rand.Float64
	if f.config.Jitter != nil {
		jitter = f.config.Jitter
	}
	f.retryAt = now.Add(min(time.Duration(float64(cooldown)*(0.8+0.4*jitter())), f.config.MaxCooldown))
	if f.Mode() == Outage {
		return false, true, f.local
	}
	// Each outage, also one that begins while returning from the last, has
	// a limiter of its own, at the share of the fleet's size now.
	f.since = now
	f.drop()
	if f.config.PacesLocally {
		f.local = f.config.NewLocal(now, f.schedules.floors(now))
		f.debts.open()
	}
	f.current.Store(uint32(Outage))
	return true, true, f.local
}

// Close releases the outage's local limiter, if any (Config.Release): the
// limiter is done with. It goes on deciding by it, should it be asked.
func (f *Failover[L]) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.release()
}

// drop lets go of the outage's local limiter, if any.
func (f *Failover[L]) drop() {
	f.release()
	f.local, f.released = zero[L](), false
}

// release tells Config.Release of the outage's local limiter, once.
func (f *Failover[L]) release() {
	if f.local != zero[L]() && f.config.Release != nil && !f.released {
		f.config.Release(f.local)
		f.released = true
	}
}

// Recover records the probe that succeeded at now, when a call's timeout
// is timeout, and returns how long Redis was away.
func (f *Failover[L]) Recover(now time.Time, timeout time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures, f.probing, f.cause = 0, false, nil
	f.returnEnds = now.Add(ReturnWindow(f.config.MaxCooldown, timeout))
	next := Returning
	if f.local == zero[L]() {
		next = Shared // nothing to gate: the policy paced no one
	}
	f.current.Store(uint32(next))
	return now.Sub(f.since)
}

// TakeOwed returns the debts of the last outage, once: nil until its return
// has ended, and after the first call since.
func (f *Failover[L]) TakeOwed() map[string]store.LimitCosts {
	if f.owed.Load() == nil {
		return nil
	}
	if owed := f.owed.Swap(nil); owed != nil {
		return *owed
	}
	return nil
}

// Down reports whether Redis is taken to be away (an outage), and returns
// the outage's local limiter.
func (f *Failover[L]) Down() (bool, L) {
	if f.Mode() != Outage {
		return false, zero[L]()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Mode() == Outage, f.local
}

// zero is no local limiter.
func zero[L any]() (none L) { return none }
