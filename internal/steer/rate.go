// Package steer holds what steers a key in one process beyond its
// configured limits, apart from Redis: the key's rate after refusals (Rate,
// which lua/rate.lua keeps in Redis), when a process may
// sync a key with the upstream's counters next (Throttle), and the retimes
// that void the bookings of a key whose pace changed (Retimes).
package steer

import (
	"math"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// When the upstream refuses a request (a 429 or a 503) and its counters do
// not say why (a Retry-After only says how long to wait), the configured
// limit may be above what the upstream accepts, or the refusal may be
// noise: the jitter
// between a grant and its arrival upstream, a burst at a limit that is
// right. The key's rate weighs each refusal by the requests that went
// without one, as DCTCP (RFC 8257) weighs its marks by the share of the
// data they mark: in the script, on Redis's clock, beside the key (its
// #rate), or in Local. A key's rate is a share of its configured rate, in
// parts per million, which an extra bucket enforces on top of the limits,
// without a burst: it holds a request for the time the quota's fastest
// limit takes to refill its cost, divided by the share.
//
//   - The first refusal opens the key's rate, at the configured rate, and
//     cuts nothing: from then on the requests go evenly, without the
//     bursts the limits allow (the requests asleep in their bookings wake
//     and book anew), and each is counted.
//   - Any later refusal cuts the rate at once, by its weight: the share
//     refused of the requests gone since the last refusal weighed (this
//     one among them), half at most. Near the edge, a refusal among fewer
//     than 8 requests gone since the last one weighed waits, and is
//     weighed with the next (see waits): there the upstream refuses one
//     request in many, in bunches that its burst and the jitter of
//     arrivals make, and a bunch's second refusal, weighed alone, cut
//     below the limit (nginx at half pace's rate: 56% of it to 45%). A
//     refusal that holds the key (a Retry-After), after a hold that came
//     since the last cut ended, weighs at least what the upstream's burst
//     was of what the fleet sent since that hold at its rate (see
//     heldWeight): it costs the fleet the hold, so it must not come again
//     soon. A request is gone once the rate's bucket no longer holds it: a
//     fleet that waits its turns has a queue booked ahead, not yet sent.
//     One refusal after 150 requests at the right limit costs 0.7% of the
//     rate, for a second or two; refusals one request apart (a limit twice
//     too high) halve it. A refusal of a request booked before the last
//     cut does not cut again: it is weighed with the next, unless they
//     storm: two or more, and three in four of what went since (see
//     storm). As many refusals of requests booked before the rate opened
//     as the quota's buckets' burst weigh nothing: they went in a burst
//     the limits allow (the fleet's start, a process the machine stalled,
//     whose overdue requests arrive at once), which the even rate ends;
//     more, and the limit is wrong.
//   - The edge is what the upstream was found to accept: the rate the
//     refused request was booked at, less the refusal's weight; for a
//     refusal in a climb, halfway from where the climb began, which the
//     upstream accepted. Until a request booked since the last cut has
//     succeeded, the upstream may accept nothing at all (HAProxy's
//     http_req_rate counts past refusals, or it is closed): a refusal then
//     only lowers the edge, and not when half or more were refused.
//   - From a cut, the rate climbs back to the edge within Climb (500 ms),
//     fast at first and slowly near the edge, then probes above it until
//     it is back at the configured rate, which it never passes: slowly
//     above an edge set after a success (2% after 2.7 s, 16% after 5.4 s),
//     faster above one set before (2% after 1.1 s, doubled after 4 s),
//     which the upstream's memory of a burst may have lowered; four times
//     slower either way when the key was held since the cut, since a
//     refusal there would likely hold it again. Quiet (5 s)
//     after its last refusal, with nothing booked ahead, the key's rate
//     is gone, and with it the evenness: the limits' burst returns once
//     the key is quiet, never into a queue.
//   - The rate is never below Floor (1%) of the configured rate.
//
// Requests booked before a cut of wakeCut (1/8) or more, and still asleep,
// wake and book anew, at the new rate; a smaller cut leaves them be. The
// wake takes their queue out of the key's buckets, all but the burst or a
// second of it (the opening's: twice the burst at most; see Kept), so
// that they do not book behind their own old bookings; a smaller cut
// wakes the requests booked beyond the burst or a tenth of a second (a
// second, in a bucket the upstream's counters steer), whose bookings it
// takes out too (see Trim). The observer hears each cut and the recovery
// (EventRate).
const (
	Full    = 1_000_000 // the configured rate, in parts per million
	maxCut  = 500_000
	wakeCut = 125_000
	Floor   = 10_000
	Climb   = 500_000    // µs
	probe   = 10_000_000 // µs: beyond an edge set after a success, the rate doubles in this long
	guess   = 4_000_000  // µs: beyond another, in this long
	quiet   = 5_000_000  // µs
	slower  = 4          // the probe of a key held since its cut is this much slower
	// stormRefusals is how many refusals of requests booked before a cut
	// show it was too small, when they are three in four of what went since.
	stormRefusals = 2
	keep          = 1_000_000 // µs: see Kept
	keepSmaller   = 100_000   // µs: see Kept
)

// Kept is how much of a bucket's schedule ahead of now a refusal that cut
// the rate (cut) or woke the sleepers (wake) keeps, for a bucket whose
// burst takes burst µs to refill: the burst, or a second, whichever is
// longer, after a cut that wakes them. It is the brake of a wake: the
// upstream still counts what the fleet sent too fast (HAProxy's sliding
// window, refusals too; a window, until its end), and the fleet going on
// at once at its new rate would be refused again. A queue deeper than that
// is left by sleepers who book anew: kept, it would stall a deep fleet at
// a slow limit for as long as the queue was, seconds. The opening, which
// wakes them and cuts nothing, keeps twice the burst, never more than a
// cut's wake: the sleepers book anew a burst's refill later, for the
// burst the fleet may have sent beyond what the upstream allows (HAProxy
// counts it for a second); nothing else it sent is known to have been too
// fast, and behind a second of its queue the fleet sent nothing for as
// long as the queue was beyond the burst (a single refusal of 8 x 8 at
// 200/s burst 10 cost 3.6% of an 8 s run, at 50/s burst 5 11.4%). A smaller
// cut, which wakes no one, keeps the burst or a tenth of a second: the
// queue it keeps goes at the old rate, and the refusals of its requests,
// booked before the cut, do not weigh (nginx at half pace's rate refused
// every other request of a second's queue, 8 in 160 ms, before a refusal
// weighed them). A bucket the upstream's counters steer (steered) keeps a
// second: its schedule is also the level they set.
func Kept(burst int64, wake, cut, steered bool) int64 {
	switch {
	case steered || wake && cut:
		return max(burst, keep)
	case wake:
		return min(2*burst, max(burst, keep))
	}
	return max(burst, keepSmaller)
}

// Rate is a key's rate after refusals, in whole microseconds and parts
// per million: lua/rate.lua keeps the same in Redis, and the property
// tests hold the two to each other. The zero Rate is no rate: the
// configured one.
type Rate struct {
	on      bool
	edge    int64 // the rate the upstream was found to accept
	bottom  int64 // the rate the last cut left
	cut     int64 // when the last refusal was weighed, or opened the rate
	heard   bool  // a request booked since the cut succeeded
	sure    bool  // the edge was set after a success
	tat     int64 // the schedule of the rate's bucket
	step    int64 // what the last request booked added to it
	booked  int64 // the requests booked since the rate opened
	gone    int64 // of them, those gone when the last refusal was weighed
	refused int64 // the refusals heard since that wait for the next: of requests booked before it, or among few (see waits); less the burst before the first cut
	hold    int64 // when the key's latest hold ends, 0 for none (see Held)
}

// Held tells the rate when its key's latest hold ends, as lua/rate.lua
// reads the key's hold at every call: a key held since its last cut probes
// slower (see Share).
func (k *Rate) Held(end int64) { k.hold = end }

// On reports whether the key is under a rate: a refusal opened it, and it
// is not gone.
func (k *Rate) On() bool { return k.on }

// Bottom returns the share the last cut left, in parts per million.
func (k *Rate) Bottom() int64 { return k.bottom }

// Share returns the share of the configured rate the key goes at, at now.
func (k *Rate) Share(now int64) int64 {
	if !k.on {
		return Full
	}
	s := now - k.cut
	if s < Climb {
		return min(k.edge-cube(k.edge-k.bottom, Climb-s, Climb), Full)
	}
	p := int64(guess)
	if k.sure {
		p = probe
	}
	if k.hold > k.cut {
		p *= slower
	}
	return min(k.edge+cube(k.edge, min(s-Climb, 5*p), p), Full)
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
// lets a request that takes unit µs go, booked at now. The rate's bucket
// has no burst: a burst after a spell below the rate, or the bursts the
// limits allow, is what a strict upstream refuses first. During the climb
// the first request after the cut waits an interval: the upstream has just
// refused, and has none to give; and in a storm of refusals, each cut
// would otherwise let one go at once.
func (k *Rate) Allow(now, at, unit int64) int64 {
	if !k.on || unit <= 0 {
		return at
	}
	tat := k.tat
	if now-k.cut < Climb {
		tat = max(tat, k.cut+interval(unit, k.Share(now)))
	}
	return max(at, tat)
}

// Book books a request that takes unit µs, booked at now, at due, and
// counts it, unless again: a request booked anew, whose booking a hold or
// a retime displaced, is one request, which its first booking counted.
func (k *Rate) Book(now, due, unit int64, again bool) {
	if !k.on || unit <= 0 {
		return
	}
	if !again {
		k.booked++
	}
	k.step = interval(unit, k.Share(now))
	k.tat = max(k.tat, due) + k.step
}

// Recovered reports whether the key's rate is gone at now, and if so
// forgets it: back at the configured rate, quiet after its last refusal,
// and nothing booked ahead (a fleet that waits its turns keeps it, so that
// the limits' burst returns once the key is quiet, not into a queue); or
// its time is up, as its key's in Redis.
func (k *Rate) Recovered(now int64) bool {
	if !k.on || now < max(k.cut+Climb+5*probe, k.tat) && (k.Share(now) < Full || now-k.cut < quiet || now < k.tat) {
		return false
	}
	*k = Rate{hold: k.hold}
	return true
}

// Refused takes the refusal of a request booked at decided, at now, and
// reports whether it cut the rate, and whether the requests asleep in
// their bookings wake to book anew: after a cut deep enough, or when the
// refusal opens the rate. burst is the smallest of the quota's buckets (0 for none): as many refusals
// of requests booked before the rate opened weigh nothing. before, for a
// refusal that brought a hold of the key, is when the hold before it ended
// (0 for none: see heldWeight).
func (k *Rate) Refused(now, decided, burst, before int64) (cut, wake bool) {
	if !k.on {
		*k = Rate{on: true, edge: Full, bottom: Full, cut: now, tat: now, refused: -burst, hold: k.hold}
		return false, true // the sleepers book anew, evenly, and their refusals are weighed
	}
	if decided < k.cut {
		k.refused++ // weighed with the next refusal, unless they storm
		return k.storm(now)
	}
	gone := k.goneBy(now)
	if k.waits(gone, before) {
		k.refused++ // weighed with the next
		return false, false
	}
	at, current := k.Share(decided), k.Share(now)
	refused := max(k.refused, 0)
	weight := floorDiv((refused+1)*Full, max(gone-k.gone, refused)+1)
	if before > 0 {
		weight = max(weight, k.heldWeight(now, burst, before))
	}
	weight = min(weight, maxCut)
	if k.heard || weight < maxCut {
		edge := at - floorDiv(at*weight, Full)
		k.sure = k.heard
		switch {
		case !k.heard:
			edge = min(edge, k.edge)
		case decided-k.cut < Climb && edge > k.bottom:
			edge = k.bottom + (edge-k.bottom)/2 // the climb went past the upstream's limit
		}
		k.edge = max(edge, Floor)
	}
	k.bottom = max(min(current-floorDiv(current*weight, Full), k.edge), Floor)
	k.cut, k.heard, k.refused = now, false, 0
	if wake = current-k.bottom >= floorDiv(current*wakeCut, Full); wake {
		k.tat = now // the sleepers book anew from now, counted anew
	}
	k.gone = k.goneBy(now)
	return true, wake
}

// Trim takes the requests due after after out of the rate's bucket, at
// now, as a cut too small to wake every sleeper does when their queue was
// deeper than a wake keeps (see Kept): those requests are gone, and book
// anew, counted anew.
func (k *Rate) Trim(after, now int64) {
	k.tat = min(k.tat, after)
	k.gone = k.goneBy(now)
}

// waits reports whether a refusal, with gone requests gone by now, waits
// to be weighed with the next: near the edge (set after a success, and a
// success heard since the cut), a refusal that weighs no hold (before is
// 0: see heldWeight) among fewer than 8 gone since the last one weighed,
// which alone would cut an eighth or more.
func (k *Rate) waits(gone, before int64) bool {
	return k.sure && k.heard && before == 0 && gone-k.gone < Full/wakeCut-1
}

// storm cuts the rate to half the edge, and wakes the sleepers, when the
// refusals of requests booked before the last cut are stormRefusals or
// more, and three in four or more of the requests gone since it: the cut
// was too small (a first refusal after a long run weighs little), and an
// upstream that refuses nearly all while over its limit (HAProxy's
// http_req_rate counts its refusals) would refuse each request asleep in
// its booking at the old rate. Fewer, as a bucket twice too fast refuses
// half, are weighed with the next refusal. The edge stays, and a storm
// never takes the rate below half of it: the refusals still on their way
// are the same storm's. The opening is no cut (its refusals beyond the
// burst are weighed with the next), and a held key has no storm: its
// sleepers book anew after the hold.
func (k *Rate) storm(now int64) (cut, wake bool) {
	half, current := max(k.edge/2, Floor), k.Share(now)
	few := k.refused < stormRefusals || 4*k.refused < 3*(k.goneBy(now)-k.gone)
	if k.bottom == Full || k.hold > now || few || current-half < floorDiv(current*wakeCut, Full) {
		return false, false
	}
	k.bottom = half
	k.cut, k.heard, k.refused, k.tat = now, false, 0, now
	k.gone = k.goneBy(now)
	return true, true
}

// heldWeight is the least weight of a refusal that brought a hold, at now,
// after a hold that came since the last cut and ended at before: the
// upstream's bucket was full then, so of what the fleet sent since at the
// rate, the burst and one more went unpaid (at least: more, and the fleet
// went further above the upstream's rate). 0 when there was no such hold.
// In float64, as Lua reckons it.
func (k *Rate) heldWeight(now, burst, before int64) int64 {
	if before <= k.cut || before >= now || k.step <= 0 {
		return 0
	}
	unpaid := float64(burst+1) * float64(k.step)
	if 2*unpaid >= float64(now-before) {
		return maxCut
	}
	return int64(math.Floor(unpaid * Full / float64(now-before)))
}

// goneBy is how many of the requests booked have gone by now: all but
// those due after now, which the rate's bucket holds (the last one due
// ends its schedule a step later).
func (k *Rate) goneBy(now int64) int64 {
	if k.tat <= now+k.step || k.step <= 0 {
		return k.booked
	}
	return max(k.booked-int64(math.Ceil(float64(k.tat-now)/float64(k.step)))+1, 0)
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
