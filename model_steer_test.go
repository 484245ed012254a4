package pace

import (
	"cmp"
	"math"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// steerModel is a steered bucket's state in the Go model, as lua/common.lua
// keeps it after the TAT: all whole microseconds or units.
type steerModel struct {
	seen, till, spread, learned, left, base, synced, booked, foreign, order, ceiling int64

	believed int64 // what spend takes of foreign, in one sync alone (see estimate_foreign)
	faded    bool  // the last sync faded foreign (see fade in sync.lua)

	probing bool // the window's spread is a probe (for the model check's counts)
}

// fleetInterval is fleet_interval: the upstream's interval (the learned one,
// or a), slowed by the share others spend (90% at most), no slower than
// refills a burst of b in a year.
func (s *steerModel) fleetInterval(a, b int64) int64 {
	i := s.interval(a)
	if s == nil || s.foreign <= 0 {
		return i
	}
	i = int64(math.Ceil(float64(i) / (1 - math.Min(float64(s.foreign)*float64(i)/1e12, 0.9))))
	return min(i, max(s.interval(a), int64(math.Floor(float64(store.MaxRefill.Microseconds())/float64(b)))))
}

// interval is interval: the learned one, or a.
func (s *steerModel) interval(a int64) int64 {
	if s != nil && s.learned > 0 {
		return s.learned
	}
	return a
}

// step is bucket_step: the TAT a booking at due books from, the
// microseconds a unit takes, whether units are spread, and the time no
// booking goes before (0: none).
func (s *steerModel) step(tat, a, b, due, now int64) (int64, int64, bool, int64) {
	i := s.fleetInterval(a, b)
	if s != nil && s.till > now {
		if s.spread > 0 && max(tat, due) < s.till {
			return tat, max(s.spread, i), true, 0
		}
		return tat, i, false, s.till
	}
	return tat, i, false, 0
}

// allow is bucket_allow.
func (s *steerModel) allow(tat, a, b, cost, arrival, now int64) int64 {
	if cost == 0 && s == nil {
		return arrival
	}
	base, i, spread, after := s.step(tat, a, b, arrival, now)
	t := max(arrival, base)
	if !spread {
		t = max(t+cost*i-b*i, after)
	}
	if s != nil {
		t = max(t, s.ceiling+(cost-b)*s.interval(a))
	}
	return t
}

// finish is bucket_finish.
func (s *steerModel) finish(tat, a, b, cost, due, now int64, free bool) int64 {
	base, i, _, _ := s.step(tat, a, b, due, now)
	finish := max(base, due) + cost*i
	if s == nil && free && cost > 0 && b >= 2 && finish > due+(b-1)*i {
		return finish + min(i, 100*time.Millisecond.Microseconds()) // emptied in common.lua
	}
	return finish
}

// movedBack is moved_back.
func (s *steerModel) movedBack(free int64) {
	if s != nil {
		s.order = max(s.order, free)
	}
}

// moveCeiling is move_ceiling.
func (s *steerModel) moveCeiling(a, units, due, now int64) {
	if s != nil {
		s.ceiling = min(max(max(s.ceiling, due)+units*s.interval(a), now), now+store.Horizon.Microseconds())
	}
}

// countBooked is count_booked.
func (s *steerModel) countBooked(units int64) int64 {
	if s == nil {
		return 0
	}
	s.booked = min(max(s.booked+units, 0), 1<<53)
	return s.booked
}

// syncTau and syncProbe are sync.lua's tau and probe.
const (
	syncTau   = 500000.0
	syncProbe = 1000000
)

// sync is sync.lua for one bucket stored as tat and s (nil when not
// steered): it returns the bucket's new TAT and steering, and 0 (stale), 1
// (applied) or 2 (applied, and learned anew).
func (s *steerModel) sync(tat, a, b, finish, booked, due int64, burst bool, cost int64, refused bool, st store.Steer, held, now int64) (int64, *steerModel, int64) {
	left, reset, early, learned := st.Remaining, st.Reset.Microseconds(), st.Early.Microseconds(), st.Learned
	full := st.Size > 0 && left+cost >= st.Size // the quota was full when the request came
	refills, level := st.Refills || st.Rounded, st.Rounded
	if level && s != nil && s.till > now { // a window's last seconds; its last, spread until halfway through its rounding
		refills, level = false, false
		if reset <= early {
			early /= 2
		}
	}
	fresh := s == nil || (booked > s.synced && due >= s.order)
	slower := learned > s.interval(a)
	_, unit, spreading, _ := s.step(tat, a, b, now, now)
	waiting := s.queued(tat, a, b, now)
	free := max(s.allow(tat, a, b, 1, now, now), now)
	if refused && s != nil {
		s.refuse(booked, cost)
	}
	if !fresh && !slower {
		return tat, s, 0
	}
	old, result, ahead, since := tat, int64(1), int64(0), int64(0)
	if fresh {
		s, left = s.takeIn(tat, a, b, finish, booked, due, burst, cost, left, reset, refills, level, full, held, now)
		if !level || st.Refills { // a bucket's level alone: see spend
			since = max(st.Remaining-left, 0)
		}
	}
	if learned > 0 && learned != s.learned {
		before := s.interval(a)
		s.learned, s.seen, result, ahead = learned, 0, 2, waiting
		if s.ceiling > now {
			s.ceiling = now + max(int64(math.Ceil(float64(s.ceiling-now)/float64(before)))-ahead, 0)*learned
		}
	}
	switch {
	case fresh:
		// The units booked go before free or, while spreading, at last at
		// most (0: not spreading).
		last, booked := int64(0), free-1
		if spreading && tat > 0 && ahead == 0 {
			last, booked = tat-unit, tat-unit
		}
		if refills && (!level || st.Refills) { // what the quota refilled since the request went
			left += int64(math.Floor(float64(max(now-due, 0)) / s.refillInterval(a, b, cost, st.Reset.Microseconds(), full)))
		}
		tat = s.spend(tat, free, last, a, b, cost, left+ahead, since, reset, early, refills, level, now)
		if ahead == 0 && max(s.allow(tat, a, b, 1, now, now), now) <= booked {
			s.movedBack(free)
		}
	case ahead > 0:
		tat = now + max(int64(math.Ceil(float64(old-now)/float64(unit)))-ahead, 0)*s.fleetInterval(a, b)
	}
	return tat, s, result
}

// takeIn is take_in: it returns the steering and the units left. held is
// when the key's latest hold ends (0: none); level, the reading is a level
// alone; full, the quota was full when the request came.
func (s *steerModel) takeIn(tat, a, b, finish, booked, due int64, burst bool, cost, left, reset int64, refills, level, full bool, held, now int64) (*steerModel, int64) {
	switch {
	case s != nil:
		left -= max(s.booked-booked, 0)
	case tat > finish:
		left -= int64(math.Ceil(float64(tat-finish) / float64(a)))
	}
	if s == nil && burst {
		left -= max(int64(math.Ceil(float64(finish-cost*a-due)/float64(a))), 0)
	}
	first := s == nil
	if first {
		s = &steerModel{ceiling: cmp.Or(tat, now)} // the bucket alone: its TAT, or now for an empty one
	}
	if level {
		s.foreign = 0
	}
	s.believed = s.foreign
	if !first && !burst && !level && held <= s.seen {
		s.estimateForeign(a, b, left, due, refills, full, reset, now)
	}
	s.seen, s.left, s.base, s.synced = due, max(left, -1<<53), booked, s.booked
	if first || burst {
		s.seen = 0
	}
	return s, left
}

// refuse is refuse.
func (s *steerModel) refuse(booked, cost int64) {
	if booked > s.synced {
		s.synced += cost
	} else if booked > s.base {
		s.left += cost
	}
}

// refillInterval is refill_interval, for a reading of a request of cost
// whose quota is full again in reset microseconds; full, it was full when
// the request came.
func (s *steerModel) refillInterval(a, b, cost, reset int64, full bool) float64 {
	i := float64(s.fleetInterval(a, b))
	if reset <= 0 || !full {
		return i
	}
	rate := float64(cost)/float64(reset) - float64(max(s.foreign, 0))/1e12
	if rate <= 0 {
		return i
	}
	return min(i, 1/rate)
}

// spend is spend.
func (s *steerModel) spend(tat, free, last, a, b, cost, left, since, reset, early int64, refills, level bool, now int64) int64 {
	others := float64(max(s.believed, 0))
	s.probing = false
	if refills {
		i := s.fleetInterval(a, b)
		spare := int64(math.Ceil(50000 / float64(i)))
		if s.foreign != 0 {
			spare = int64(math.Ceil(others / 2e7))
		}
		mine := left - cost - min(spare, b/2)
		full := now + (b-min(mine, b))*i
		if level {
			full = min(full, now+reset+since*i)
		}
		s.till, s.spread = 0, 0
		return max(s.ceiling, full)
	}
	mine := left - int64(math.Ceil(others*float64(reset)/1e12))
	s.till, s.spread = now+reset, 0
	switch {
	case left <= 0 || free >= s.till:
		if tat == 0 {
			return now
		}
		return tat
	case mine > 0:
		s.spread = max(int64(math.Ceil(float64(s.till-early-free)/float64(mine))), 1)
	default:
		s.probing = true
		s.spread = min(max(syncProbe, int64(math.Ceil(float64(s.till-free)/float64(left)))), s.till-free)
	}
	if last > 0 {
		return max(last+s.spread, now)
	}
	return free
}

// queued is queued: the units booked to go after now (of a bucket stored
// as tat and s, nil when not steered).
func (s *steerModel) queued(tat, a, b, now int64) int64 {
	if tat <= now {
		return 0
	}
	_, unit, _, _ := s.step(tat, a, b, now, now)
	return max(int64(math.Ceil(float64(tat-now)/float64(unit)))-b, 0)
}

// estimateForeign is estimate_foreign; full, the quota was full when the
// request came; reset, it is full again in as many microseconds.
func (s *steerModel) estimateForeign(a, b, left, due int64, refills, full bool, reset, now int64) {
	dt := due - s.seen
	s.faded = false
	if s.seen == 0 || dt <= 0 || (refills && s.till > 0) || (!refills && s.till <= now) {
		return
	}
	expected := float64(s.left)
	if refills {
		expected += float64(dt) / float64(s.interval(a))
	}
	units := expected - float64(s.booked-s.synced) - float64(left)
	if units > 0 && refills && (full || reset < s.fleetInterval(a, b)) {
		if s.foreign > 0 { // fade
			f := max(math.Floor(float64(s.foreign)-min(float64(b)*1e12/syncTau, float64(s.foreign)/5)*float64(dt)/syncTau), 0)
			s.foreign, s.believed, s.faded = int64(f), int64(f), true
		}
		return
	}
	var f float64
	if float64(dt) >= syncTau || (refills && s.foreign == 0) {
		f = units * 1e12 / float64(dt)
	} else {
		f = float64(s.foreign) - float64(s.foreign)*float64(dt)/syncTau + units*1e12/syncTau
	}
	implied := int64(max(min(math.Floor(f), 1e15), -1e15))
	s.believed = implied
	if !refills {
		s.believed = min(s.foreign, implied)
	}
	s.foreign = implied
}

// written is write_bucket's effect on a steering: a spread that has ended
// is forgotten.
func (s *steerModel) written(now int64) {
	if s != nil && s.till <= now {
		s.till, s.spread = 0, 0
	}
}
