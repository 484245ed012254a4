// Package steer holds what steers a key in one process beyond its
// configured limits, apart from Redis: the key's rate after refusals (Rate,
// which internal/store/lua/rate.lua keeps in Redis), when a process may
// sync a key with the upstream's counters next (Throttle), and the retimes
// that void the bookings of a key whose pace changed (Retimes).
package steer

import (
	"math"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// When the upstream refuses a request (a 429 or a 503) and neither a
// Retry-After nor its counters say why, the configured limit is above what
// the upstream accepts, whatever it says. Such a refusal steers the key's
// rate for the whole fleet: in the script, on Redis's clock, beside the key
// (its #rate), or in Local. A key's rate is a share of its configured rate,
// in parts per million, which an extra bucket enforces on top of the
// limits: it holds a request for the time the quota's fastest limit takes
// to refill its cost, divided by the share, with a burst of that limit's,
// 50 ms at most, and none while the rate climbs back after a cut.
//
// The controller is CUBIC's, with what the upstream's memory asks for:
//
//   - A refusal of a request booked before the last cut has been reacted
//     to already. Any other cuts the rate to cutTo (70%) of what it is
//     now, and remembers where the upstream refused, the edge: the rate
//     the refused request was booked at. The first refusal sets the edge;
//     a later one lowers it to that rate, by keepAtLeast (30%) at most, once a
//     request booked since the last cut has succeeded. Until then the
//     upstream accepts nothing at all, and the rate says nothing of its
//     limit: it is counting past refusals (HAProxy's http_req_rate) or is
//     closed; the cut deepens, so that it can recover, and the edge stands.
//   - From the cut, the rate climbs back to margin (3%) below the edge
//     within Climb (500 ms), fast at first and slowly near the edge,
//     then probes above it, slowly at first (2% after a second, 16% after
//     two), until it is back at the configured rate, which it never passes:
//     then the key's rate is gone.
//   - The rate is never below Floor (1%) of the configured rate.
//
// Requests booked before a cut and still asleep wake and book anew, at the
// new rate. The observer hears each cut and the recovery (EventRate).
const (
	Full        = 1_000_000 // the configured rate, in parts per million
	cutTo       = 700_000
	keepAtLeast = 700_000
	margin      = 30_000
	Floor       = 10_000
	Climb       = 500_000   // µs
	probe       = 3_700_000 // µs: beyond the edge, the rate doubles in this long
	maxBurst    = 50_000    // µs: the most the key's rate lets go at once
)

// Rate is a key's rate after refusals, in whole microseconds and parts
// per million: internal/store/lua/rate.lua keeps the same in Redis, and the property
// tests hold the two to each other. The zero Rate is no rate: the
// configured one.
type Rate struct {
	on     bool
	edge   int64 // the rate at which the upstream refused
	bottom int64 // the rate the last cut left
	cut    int64 // when the last cut was
	heard  bool  // a request booked since the cut succeeded
	tat    int64 // the schedule of the rate's bucket
}

// On reports whether the key is under a rate: a refusal cut it, and it has
// not recovered.
func (k *Rate) On() bool { return k.on }

// Bottom returns the share the last cut left, in parts per million.
func (k *Rate) Bottom() int64 { return k.bottom }

// Share returns the share of the configured rate the key goes at, at now.
func (k *Rate) Share(now int64) int64 {
	if !k.on {
		return Full
	}
	top := k.edge - floorDiv(k.edge*margin, Full)
	s := now - k.cut
	if s < Climb {
		d, x := top-k.bottom, Climb-s
		d = cube(d, x, Climb)
		return min(top-d, Full)
	}
	return min(top+cube(top, min(s-Climb, 5*probe), probe), Full)
}

// cube is v*(x/y)^3, rounded down at each of three steps, each exact in
// Lua's doubles as in Go's, so that the script and Go agree.
func cube(v, x, y int64) int64 {
	for range 3 {
		v = floorDiv(v*x, y)
	}
	return v
}

func floorDiv(a, b int64) int64 { return int64(math.Floor(float64(a) / float64(b))) }

// interval is the time the rate's bucket takes for a request that
// takes unit µs at the configured rate, at share s, a year at most.
func interval(unit, s int64) int64 {
	return min(int64(math.Ceil(float64(unit)*Full/float64(s))), store.MaxRefill.Microseconds())
}

// Allow returns the earliest time, at or after at, that the key's rate
// lets a request that takes unit µs go, booked at now; burst is the time
// the quota's fastest limit takes to refill its burst. During the climb
// there is no burst, and the first request after the cut waits an
// interval: the upstream has just refused, and has none to give; and in a
// storm of refusals, each cut would otherwise let one go at once.
func (k *Rate) Allow(now, at, unit, burst int64) int64 {
	s := k.Share(now)
	if s >= Full || unit <= 0 {
		return at
	}
	i := interval(unit, s)
	tat, b := k.tat, int64(math.Max(float64(i), math.Min(math.Ceil(float64(burst)*Full/float64(s)), maxBurst)))
	if now-k.cut < Climb {
		tat, b = max(tat, k.cut+i), i
	}
	return max(at, tat+i-b)
}

// Book books a request that takes unit µs, booked at now, at due.
func (k *Rate) Book(now, due, unit int64) {
	if s := k.Share(now); s < Full && unit > 0 {
		k.tat = max(k.tat, due) + interval(unit, s)
	}
}

// Recovered reports whether the key is back at its configured rate at now,
// and if so forgets its rate.
func (k *Rate) Recovered(now int64) bool {
	if !k.on || k.Share(now) < Full {
		return false
	}
	*k = Rate{}
	return true
}

// Refused takes the refusal of a request booked at decided, at now, and
// reports whether it cut the rate.
func (k *Rate) Refused(now, decided int64) bool {
	if k.on && decided < k.cut {
		return false
	}
	at, current := k.Share(decided), k.Share(now)
	switch {
	case !k.on:
		k.edge = at
	case k.heard:
		k.edge = max(at, floorDiv(k.edge*keepAtLeast, Full))
	}
	k.edge = max(k.edge, Floor)
	top := k.edge - floorDiv(k.edge*margin, Full)
	k.bottom = max(min(floorDiv(current*cutTo, Full), top), Floor)
	k.on, k.cut, k.heard, k.tat = true, now, false, now
	return true
}

// Served takes the success of a request booked at decided.
func (k *Rate) Served(decided int64) {
	if k.on && decided >= k.cut {
		k.heard = true
	}
}

// Listening reports whether a success would be news: the key is under a
// rate, and no request booked since its last cut has succeeded.
func (k *Rate) Listening() bool { return k.on && !k.heard }

// Period is how long a key's rate lasts after its cut at most: it is
// back at the configured rate by then.
var Period = time.Duration(Climb+5*probe) * time.Microsecond
