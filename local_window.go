package pace

import (
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// localWindows counts a key's units in the windows of a fixed window limit
// (FixedWindow, Daily, Monthly) on a Local, as quota.lua does on Redis: a
// request goes in the first window from its due time with room for its
// cost, at most maxWindowsAhead ahead. Only windows that have not ended
// are kept.
type localWindows struct {
	limit  Limit
	booked []windowCount // in the order they were first booked
}

// windowCount is what one window holds.
type windowCount struct {
	start, end time.Time
	used       int
}

// maxWindowsAhead is how far ahead of its due time a request may book, in
// windows (quota.lua's bound).
const maxWindowsAhead = 64

// room returns the start of the first of w's windows from at on with room
// for cost, or false when none of the next maxWindowsAhead has.
func (w *localWindows) room(at time.Time, cost int) (time.Time, bool) {
	start, end := w.limit.Window(at)
	for range maxWindowsAhead {
		if w.used(start)+cost <= w.limit.burst {
			return start, true
		}
		start, end = end, w.next(end)
	}
	return time.Time{}, false
}

// next is the end of w's window that starts at start.
func (w *localWindows) next(start time.Time) time.Time {
	_, end := w.limit.Window(start)
	return end
}

// used is what the window that starts at start holds.
func (w *localWindows) used(start time.Time) int {
	for _, c := range w.booked {
		if c.start.Equal(start) {
			return c.used
		}
	}
	return 0
}

// add counts units (a debt when positive, a credit when negative, never
// below zero) in w's window that holds at, and returns its start; first it
// drops the windows that ended by now.
func (w *localWindows) add(at time.Time, units int, now time.Time) time.Time {
	w.prune(now)
	start, end := w.limit.Window(at)
	for i := range w.booked {
		if w.booked[i].start.Equal(start) {
			w.booked[i].used = max(w.booked[i].used+units, 0)
			return start
		}
	}
	if units > 0 {
		w.booked = append(w.booked, windowCount{start: start, end: end, used: units})
	}
	return start
}

// giveBack takes units out of the window that starts at start, unless it
// has ended by now.
func (w *localWindows) giveBack(start time.Time, units int, now time.Time) {
	if start.IsZero() || !w.next(start).After(now) {
		return
	}
	w.add(start, -units, now)
}

// prune drops the windows that ended by now.
func (w *localWindows) prune(now time.Time) {
	kept := w.booked[:0]
	for _, c := range w.booked {
		if c.end.After(now) && c.used > 0 {
			kept = append(kept, c)
		}
	}
	w.booked = kept
}

// empty reports whether w holds nothing from now on.
func (w *localWindows) empty(now time.Time) bool {
	w.prune(now)
	return len(w.booked) == 0
}

// fitWindows moves due on until each of k's windows has room for its
// cost, and returns it; false when one has none within maxWindowsAhead.
// Buckets that allow due allow any time after it.
func (k *localKey) fitWindows(costs *store.LimitCosts, due time.Time) (time.Time, bool) {
	for moved := true; moved; {
		moved = false
		for i, w := range k.wins {
			if w == nil || costs[i] == 0 {
				continue
			}
			start, ok := w.room(due, costs[i])
			if !ok {
				return due, false
			}
			if start.After(due) {
				due, moved = start, true
			}
		}
	}
	return due, true
}

// start is the start of the window that limit i booked in w (zero when
// it booked none, or w is nil).
func (w *windowsBooked) start(i int) time.Time {
	if w == nil {
		return time.Time{}
	}
	return w.starts[i]
}
