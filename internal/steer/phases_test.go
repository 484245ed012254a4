package steer

import (
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
)

// unixReading is a GitHub reading of a window of limit heard at at, left
// units left, its reset the Unix second after reset: rounded up, a second
// early at most.
func unixReading(at, reset time.Time, left, limit int64) headers.Reading {
	said := reset.Truncate(time.Second).Add(time.Second)
	return headers.Reading{Name: "core", Limit: limit, Remaining: left, Reset: said.Sub(at), Early: time.Second, Dated: true}
}

// TestPhasesBoundAWindow: a window of a second that began 0.1 s past a
// second says its reset 0.9 s late; every response of it is bounded to a
// second after the first, exactly, and the next window starts anew.
func TestPhasesBoundAWindow(t *testing.T) {
	var p Phases
	base := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	start := base.Add(100 * time.Millisecond)
	first := start.Add(5 * time.Millisecond)
	for i, at := range []time.Time{first, first.Add(300 * time.Millisecond), first.Add(900 * time.Millisecond)} {
		r := p.Bound("k", unixReading(at, start.Add(time.Second), 99-int64(i)*30, 100), at, time.Second, 100)
		if want := first.Add(time.Second).Sub(at); r.Reset != want || r.Early != 0 {
			t.Errorf("reading %d: reset %v, early %v; want %v, 0", i, r.Reset, r.Early, want)
		}
	}
	next := first.Add(time.Second + 2*time.Millisecond)
	r := p.Bound("k", unixReading(next, next.Add(time.Second), 99, 100), next, time.Second, 100)
	if want := time.Second; r.Reset != want || r.Early != 0 {
		t.Errorf("the next window's first reading: reset %v, early %v; want %v, 0", r.Reset, r.Early, want)
	}
	late := first.Add(950 * time.Millisecond) // the first window's, heard after the next began
	if r, said := p.Bound("k", unixReading(late, start.Add(time.Second), 1, 100), late, time.Second, 100), unixReading(late, start.Add(time.Second), 1, 100); r != said {
		t.Errorf("an older window's reading, come late: %+v, want it as said, %+v", r, said)
	}
	at := next.Add(400 * time.Millisecond)
	r = p.Bound("k", unixReading(at, next.Add(time.Second), 60, 100), at, time.Second, 100)
	if want := next.Add(time.Second).Sub(at); r.Reset != want || r.Early != 0 {
		t.Errorf("the next window, after the older reading: reset %v, early %v; want %v, 0", r.Reset, r.Early, want)
	}
}

// TestPhasesLeaveOthers: readings that are not of a window of the period,
// or not dated, are left as they are.
func TestPhasesLeaveOthers(t *testing.T) {
	base := time.Date(2026, 12, 6, 10, 0, 0, 100_000_000, time.UTC)
	t.Run("seconds from now", func(t *testing.T) {
		var p Phases
		r := unixReading(base, base.Add(time.Second), 99, 100)
		r.Dated = false
		if got := p.Bound("k", r, base, time.Second, 100); got != r {
			t.Errorf("got %+v, want %+v", got, r)
		}
	})
	t.Run("a longer window", func(t *testing.T) {
		var p Phases
		r := unixReading(base, base.Add(time.Hour), 4999, 5000)
		if got := p.Bound("k", r, base, time.Second, 5000); got != r {
			t.Errorf("a window of an hour under a limit of a second: got %+v, want %+v", got, r)
		}
		// Windows of 1.3 s under a limit of a second: the first one's
		// reading 1.1 s on tells it, and the next one's are left.
		p = Phases{}
		p.Bound("k", unixReading(base, base.Add(1300*time.Millisecond), 4000, 5000), base, time.Second, 5000)
		at := base.Add(1100 * time.Millisecond)
		p.Bound("k", unixReading(at, base.Add(1300*time.Millisecond), 3000, 5000), at, time.Second, 5000)
		next := base.Add(1310 * time.Millisecond)
		r = unixReading(next, next.Add(1300*time.Millisecond), 4999, 5000)
		if got := p.Bound("k", r, next, time.Second, 5000); got != r {
			t.Errorf("the next window of a quota whose window outlasted the period: got %+v, want %+v", got, r)
		}
	})
	t.Run("units come back", func(t *testing.T) {
		var p Phases
		p.Bound("k", unixReading(base, base.Add(time.Second), 60, 100), base, time.Second, 100)
		at := base.Add(200 * time.Millisecond)
		r := unixReading(at, base.Add(time.Second), 70, 100)
		if got := p.Bound("k", r, at, time.Second, 100); got != r {
			t.Errorf("a bucket's refill: got %+v, want %+v", got, r)
		}
	})
}

// TestPhasesSlidingLevel: HAProxy's count of its last period, in GitHub's
// fields, leaves few units at its turn: a level alone (Early its Reset),
// holding nothing, unless the limit is faster than the count, whose level
// would refill too fast.
func TestPhasesSlidingLevel(t *testing.T) {
	base := time.Date(2026, 12, 6, 10, 0, 0, 100_000_000, time.UTC)
	turn := base.Add(time.Second)
	for _, c := range []struct {
		count float64
		level bool
	}{{100, true}, {200, false}} {
		var p Phases
		p.Bound("k", unixReading(base, base.Add(time.Second), 99, 100), base, time.Second, c.count)
		r := unixReading(turn, turn.Add(time.Second), 1, 100)
		got := p.Bound("k", r, turn, time.Second, c.count)
		if level := got.Reset == got.Early; level != c.level || got.Reset != r.Reset {
			t.Errorf("a limit of %v a second: %+v, a level alone %v; want %v, its reset as said", c.count, got, level, c.level)
		}
	}
}
