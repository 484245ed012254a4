package fleetsim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fleetpace/pace"
)

// result counts the run and checks every invariant pace promises.
func (s *sim) result() Result {
	r := Result{Case: s.c, PerSecond: make([]int, int(math.Ceil(s.c.Duration.Seconds())))}
	for _, a := range s.up.arrivals {
		if !a.at.Before(s.end) {
			continue
		}
		switch {
		case a.ok:
			r.Served += a.cost
			r.PerSecond[int(a.at.Sub(s.start)/time.Second)] += a.cost
		case a.at.Sub(s.start) >= time.Second:
			r.Refused++
			r.RefusedAfter1s++
		default:
			r.Refused++
		}
	}
	for _, a := range s.up.others {
		if a.ok && a.at.Before(s.end) {
			r.OthersServed++
		} else if a.at.Before(s.end) {
			r.OthersRefused++
		}
	}
	r.Trace = s.trace()
	paceAllows := float64(s.limit.Burst()) + s.limit.Rate()*s.c.Duration.Seconds()
	r.Allowed = min(s.up.model.allowed(s.start, s.end)-float64(r.OthersServed), paceAllows)
	r.Demand = s.demand()
	r.Errors = s.unsent
	r.RedisCalls = s.calls.n
	for _, w := range s.waits {
		r.LongestWait = max(r.LongestWait, w.until.Sub(w.from))
	}
	if holds := s.holds(); len(holds) > 0 {
		first := slices.MinFunc(holds, func(a, b span) int { return a.from.Compare(b.from) })
		until := first.until
		if s.end.Before(until) {
			until = s.end
		}
		r.FirstHold = max(until.Sub(first.from), 0)
	}
	r.Violations = append(r.Violations, s.failures...)
	r.Violations = append(r.Violations, s.checkBound()...)
	r.Violations = append(r.Violations, s.checkBookings()...)
	r.Violations = append(r.Violations, s.checkHolds()...)
	r.Violations = append(r.Violations, s.checkWaits()...)
	return r
}

// trace is the run's story: every arrival and every limiter's event, in
// the order of their times, for a replay to compare and a reader to follow.
func (s *sim) trace() []string {
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, a := range s.up.arrivals {
		lines = append(lines, line{a.at, fmt.Sprintf("%-14v p%-2d arrival sent %v ok=%v", s.since(a.at), a.proc, s.since(a.sent), a.ok)})
	}
	for _, a := range s.up.others {
		lines = append(lines, line{a.at, fmt.Sprintf("%-14v others arrival sent %v ok=%v", s.since(a.at), s.since(a.sent), a.ok)})
	}
	for _, e := range s.events {
		text := fmt.Sprintf("%-14v p%-2d %s delay=%v by=%s", s.since(e.at), e.proc, e.Kind, e.Delay, e.Limiter)
		if e.Reason != "" {
			text += " reason=" + e.Reason
		}
		if e.Kind == pace.EventRate {
			text += fmt.Sprintf(" rate=%.3f", e.Rate)
		}
		if e.Err != nil {
			text += " err=" + e.Err.Error()
		}
		lines = append(lines, line{e.at, text})
	}
	slices.SortFunc(lines, func(a, b line) int { return cmp.Or(a.at.Compare(b.at), strings.Compare(a.text, b.text)) })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return out
}

// checkBound holds the fleet's arrivals at the upstream to pace's limit:
// over every span t, at most b + r*t units, plus a burst at each switch
// between Redis and the fallback (failures.md), and at a restart that
// empties the store a burst and the bookings it forgot (one a worker at
// most). The limit binds the grants, on Redis's clock; an arrival comes
// its answer's way back from Redis and a trip to the upstream after its
// grant, so arrivals may bunch by as much as those vary: the jitter of the
// two trips, a connection's opening, the stagger, and what the slowest
// answer took beyond a round trip (a slow link, a frozen Redis, an answer
// lost and asked for again), and what a pause holds back. The span counted
// is t plus that. A leaky bucket of the limit, drained by each arrival,
// must never go below empty.
func (s *sim) checkBound() []string {
	arrivals := slices.Clone(s.up.arrivals)
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return a.at.Compare(b.at) })
	burst, rate := float64(s.limit.Burst()), s.limit.Rate()
	switches := s.count(pace.EventFallback) + s.count(pace.EventRecover)
	forgotten := 0.0 // a store that lost its data forgot the bookings ahead, which still go
	if s.c.Faults == "kill" || s.c.Faults == "flush" {
		switches++
		forgotten = float64(s.c.Procs * s.c.Workers * s.c.Cost)
	}
	roundTrip := 2*(s.c.RedisLatency+s.c.RedisJitter) + staggerRange
	spread := s.c.RedisJitter + s.c.Jitter + s.c.Connect + staggerRange + max(s.calls.longest-roundTrip, 0) + s.faults.bunching() + time.Microsecond // a microsecond: the schedule's rounding
	size := burst*float64(1+switches) + forgotten + rate*spread.Seconds()
	tokens, last := size, s.start
	for i, a := range arrivals {
		tokens = min(size, tokens+a.at.Sub(last).Seconds()*rate)
		last = a.at
		if tokens -= float64(a.cost); tokens < -1e-9 {
			return []string{fmt.Sprintf("bound: the arrival at %v (process %d, the %dth) found %.3f units where %v allows none (b=%v r=%v, %d switches, %v of spread); the arrivals before it: %s",
				s.since(a.at), a.proc, i+1, tokens+float64(a.cost), s.limit, burst, rate, switches, spread, s.recent(arrivals[:i], a.at))}
		}
	}
	return nil
}

// recent lists the arrivals in the second before t.
func (s *sim) recent(sends []arrival, t time.Time) string {
	var out []string
	for _, a := range sends {
		if t.Sub(a.at) <= time.Second {
			out = append(out, fmt.Sprintf("%v(p%d)", s.since(a.at), a.proc))
		}
	}
	if len(out) > 20 {
		out = append(out[:10], append([]string{"..."}, out[len(out)-10:]...)...)
	}
	return fmt.Sprint(out)
}

func (s *sim) count(k pace.EventKind) int {
	n := 0
	for _, e := range s.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// checkBookings holds that nothing was lost or sent unbooked: every
// request a worker began was sent once or failed, and each sent was
// granted. (A grant may go unsent: its caller's deadline came first, or a
// retime voided it and it booked anew.)
func (s *sim) checkBookings() []string {
	var out []string
	if s.attempts != s.up.sends+s.unsent {
		out = append(out, fmt.Sprintf("bookings: %d requests begun, %d sent and %d failed before sending", s.attempts, s.up.sends, s.unsent))
	}
	if grants := s.count(pace.EventWait); grants < s.up.sends {
		out = append(out, fmt.Sprintf("bookings: %d grants reported, %d requests sent", grants, s.up.sends))
	}
	return out
}

// checkHolds holds that the fleet heeded every hold the upstream asked
// for, and sent nothing inside one once it could know of it (while Redis
// answers: no fault). A refusal that asks for a hold, heard at t, is
// covered by a hold reported within two round trips to Redis after t (the
// process's calls as it hears the answer), until the end it asked for
// (within MaxHold, and a trip).
// A hold's event comes a trip from Redis after the hold was set; a grant
// made just before it reaches its process a trip later, and the hold's
// message reaches a sleeping caller a trip after it was set: so no send
// counts from the event's time plus a trip's jitter, until a trip before
// the hold's end.
func (s *sim) checkHolds() []string {
	if s.c.Faults != "none" {
		return nil
	}
	trip := s.c.RedisLatency + s.c.RedisJitter + 2*time.Microsecond // Redis's clock and the hold's length, each in whole µs
	holds := s.holds()
	for _, h := range s.up.answers {
		asked := span{h.at, h.at.Add(min(h.hold, s.c.MaxHold) - trip)}
		if !slices.ContainsFunc(holds, func(held span) bool {
			return !held.from.After(asked.from.Add(4*trip+2*staggerRange)) && !held.until.Before(asked.until)
		}) {
			return []string{fmt.Sprintf("holds: a refusal heard at %v asked for %v, and no hold covers it", s.since(h.at), h.hold)}
		}
	}
	for _, h := range holds {
		from, until := h.from.Add(s.c.RedisJitter+time.Millisecond), h.until.Add(-trip)
		for _, a := range s.up.arrivals {
			if a.sent.After(from) && a.sent.Before(until) {
				return []string{fmt.Sprintf("holds: process %d sent at %v, inside the hold from %v to %v", a.proc, s.since(a.sent), s.since(h.from), s.since(h.until))}
			}
		}
	}
	return nil
}

// A span is a time from one instant to another.
type span struct{ from, until time.Time }

// holds are the holds the limiters reported, each from its event on.
func (s *sim) holds() []span {
	var out []span
	for _, e := range s.events {
		if e.Kind == pace.EventHold {
			out = append(out, span{e.at, e.at.Add(e.Delay)})
		}
	}
	return out
}

// checkWaits holds that nothing the upstream said delayed the key beyond
// MaxHold: no hold reported longer, and no request kept waiting by what
// the upstream said for longer: from the start of its wait, a hold or a
// reading of nothing left that began within it ends by MaxHold after, or
// the wait does (the rate a wait goes at once the hold ends is the
// loops', which the sweep's table shows: see Result.LongestWait).
func (s *sim) checkWaits() []string {
	for _, e := range s.events {
		if (e.Kind == pace.EventHold || e.Kind == pace.EventReading) && e.Delay > s.c.MaxHold {
			return []string{fmt.Sprintf("waits: process %d: %s of %v at %v, beyond max_hold", e.proc, e.Kind, e.Delay, s.since(e.at))}
		}
	}
	return nil
}
