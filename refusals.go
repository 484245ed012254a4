package pace

import (
	"context"
	"math"
	"strconv"
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
//     to already. Any other cuts the rate to rateCut (70%) of what it is
//     now, and remembers where the upstream refused, the edge: the rate
//     the refused request was booked at. The first refusal sets the edge;
//     a later one lowers it to that rate, by rateKeep (30%) at most, once a
//     request booked since the last cut has succeeded. Until then the
//     upstream accepts nothing at all, and the rate says nothing of its
//     limit: it is counting past refusals (HAProxy's http_req_rate) or is
//     closed; the cut deepens, so that it can recover, and the edge stands.
//   - From the cut, the rate climbs back to rateMargin (3%) below the edge
//     within rateClimb (500 ms), fast at first and slowly near the edge,
//     then probes above it, slowly at first (2% after a second, 16% after
//     two), until it is back at the configured rate, which it never passes:
//     then the key's rate is gone.
//   - The rate is never below rateFloor (1%) of the configured rate.
//
// Requests booked before a cut and still asleep wake and book anew, at the
// new rate. The observer hears each cut and the recovery (EventRate).
const (
	rateFull   = 1_000_000 // the configured rate, in parts per million
	rateCut    = 700_000
	rateKeep   = 700_000
	rateMargin = 30_000
	rateFloor  = 10_000
	rateClimb  = 500_000   // µs
	rateProbe  = 3_700_000 // µs: beyond the edge, the rate doubles in this long
	rateBurst  = 50_000    // µs: the most the key's rate lets go at once
)

// keyRate is a key's rate after refusals, in whole microseconds and parts
// per million: internal/store/lua/rate.lua keeps the same in Redis, and the property
// tests hold the two to each other. The zero keyRate is no rate: the
// configured one.
type keyRate struct {
	on     bool
	edge   int64 // the rate at which the upstream refused
	bottom int64 // the rate the last cut left
	cut    int64 // when the last cut was
	heard  bool  // a request booked since the cut succeeded
	tat    int64 // the schedule of the rate's bucket
}

// share returns the share of the configured rate the key goes at, at now.
func (k *keyRate) share(now int64) int64 {
	if !k.on {
		return rateFull
	}
	top := k.edge - floorDiv(k.edge*rateMargin, rateFull)
	s := now - k.cut
	if s < rateClimb {
		d, x := top-k.bottom, rateClimb-s
		d = cube(d, x, rateClimb)
		return min(top-d, rateFull)
	}
	return min(top+cube(top, min(s-rateClimb, 5*rateProbe), rateProbe), rateFull)
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

// rateInterval is the time the rate's bucket takes for a request that
// takes unit µs at the configured rate, at share s, a year at most.
func rateInterval(unit, s int64) int64 {
	return min(int64(math.Ceil(float64(unit)*rateFull/float64(s))), store.MaxRefill.Microseconds())
}

// allow returns the earliest time, at or after at, that the key's rate
// lets a request that takes unit µs go, booked at now; burst is the time
// the quota's fastest limit takes to refill its burst. During the climb
// there is no burst, and the first request after the cut waits an
// interval: the upstream has just refused, and has none to give; and in a
// storm of refusals, each cut would otherwise let one go at once.
func (k *keyRate) allow(now, at, unit, burst int64) int64 {
	s := k.share(now)
	if s >= rateFull || unit <= 0 {
		return at
	}
	i := rateInterval(unit, s)
	tat, b := k.tat, int64(math.Max(float64(i), math.Min(math.Ceil(float64(burst)*rateFull/float64(s)), rateBurst)))
	if now-k.cut < rateClimb {
		tat, b = max(tat, k.cut+i), i
	}
	return max(at, tat+i-b)
}

// book books a request that takes unit µs, booked at now, at slot.
func (k *keyRate) book(now, slot, unit int64) {
	if s := k.share(now); s < rateFull && unit > 0 {
		k.tat = max(k.tat, slot) + rateInterval(unit, s)
	}
}

// recovered reports whether the key is back at its configured rate at now,
// and if so forgets its rate.
func (k *keyRate) recovered(now int64) bool {
	if !k.on || k.share(now) < rateFull {
		return false
	}
	*k = keyRate{}
	return true
}

// refused takes the refusal of a request booked at decided, at now, and
// reports whether it cut the rate.
func (k *keyRate) refused(now, decided int64) bool {
	if k.on && decided < k.cut {
		return false
	}
	at, current := k.share(decided), k.share(now)
	switch {
	case !k.on:
		k.edge = at
	case k.heard:
		k.edge = max(at, floorDiv(k.edge*rateKeep, rateFull))
	}
	k.edge = max(k.edge, rateFloor)
	top := k.edge - floorDiv(k.edge*rateMargin, rateFull)
	k.bottom = max(min(floorDiv(current*rateCut, rateFull), top), rateFloor)
	k.on, k.cut, k.heard, k.tat = true, now, false, now
	return true
}

// served takes the success of a request booked at decided.
func (k *keyRate) served(decided int64) {
	if k.on && decided >= k.cut {
		k.heard = true
	}
}

// listening reports whether a success would be news: the key is under a
// rate, and no request booked since its last cut has succeeded.
func (k *keyRate) listening() bool { return k.on && !k.heard }

// reportRate tells o that limiter cut key's rate, after the refusal the
// response's status says, to share, or that it is back at its configured
// rate (share rateFull).
func reportRate(ctx context.Context, o Observer, limiter, key string, share int64, status int) {
	reason := "recovered"
	if share < rateFull {
		reason = strconv.Itoa(status) + " without Retry-After or counters"
	}
	e := Event{Kind: EventRate, Limiter: limiter, Key: key, Rate: float64(share) / rateFull, Reason: reason}
	if share < rateFull {
		e.Delay = ratePeriod
	}
	o.emit(ctx, e)
}

// rateUnits returns, for a request of costs under limits, the time the
// fastest limit it costs anything under takes to refill its cost (unit; 0
// for a request that costs nothing), and the time the fastest limit takes
// to refill its burst (burst), in µs: what a key's rate measures against.
// per gives a limit's interval, by index: the one a bucket books at
// (learned or steered), a window's length over its count.
func rateUnits(limits []Limit, costs *store.LimitCosts, per func(i int) int64) (unit, burst int64) {
	unit, burst = math.MaxInt64, math.MaxInt64
	for i, l := range limits {
		p := per(i)
		if costs[i] > 0 {
			unit = min(unit, int64(costs[i])*p)
		}
		burst = min(burst, int64(l.burst)*p)
	}
	if unit == math.MaxInt64 {
		unit = 0
	}
	return unit, burst
}

// ratePeriod is how long a key's rate lasts after its cut at most: it is
// back at the configured rate by then.
var ratePeriod = time.Duration(rateClimb+5*rateProbe) * time.Microsecond
