package steer

import (
	"sync"
	"time"

	"github.com/fleetpace/pace/headers"
)

// Windows tells, per key and quota, whether a quota whose readings say it
// refills (OpenAI's fields: the units left, and the time until the quota
// is full) is the token bucket they describe or a window, as Azure's and
// some gateways' are. A bucket's time until full is its missing units over
// its rate: the moment it is full moves later by at least the time between
// two readings, unless units came back between them. A window is full at
// its reset, which stays put while its units are spent. Read as refilling,
// a window refilled nothing until its reset, and others seemed to spend
// all of it (22% to 40% served in the simulator). Two readings in a row,
// each windowGap or more after the one before, with no unit back, that
// count as a window's tell a window; two that count as a bucket's turn it
// back (one reading whose response was heard late, on a busy machine,
// does not). A key's quota is forgotten a minute after its last reading.
// The zero Windows is ready.
type Windows struct {
	mu   sync.Mutex
	keys keyQuotas[quotaClock]
}

// windowGap is the least time between two readings that Windows compares:
// the moment a reading says the quota is full is as late as its response
// was heard, whose jitter must be well below half of it.
const windowGap = 50 * time.Millisecond

// turnReadings is how many readings in a row, counting as the kind the
// quota is not told to be, turn it.
const turnReadings = 2

// quotaClock is what a process heard of one quota that says it refills:
// the reading it compares the next with, heard at at, left units, the
// quota full at full; whether it is told a window, since when, and how
// many readings in a row counted as the other kind; and the longest time
// until full any reading said.
type quotaClock struct {
	at, full, told time.Time
	left           int64
	window         bool
	count          int
	longest        time.Duration
}

// Read returns readings of key, heard at at, as the quotas they are about
// are (see Windows): a window's says it does not refill; and, for a
// window of a second or less (no reading said more), or in the second
// after it was told, that its reset may be now, a level alone, as one that
// states its reset in whole seconds (see headers.Reading.Rounded: HAProxy's
// sliding window gives its units back before its period ends). A level
// alone tells no rate of others and drops the estimate the readings read
// as refilling made, which slowed the fleet for good. The others are as
// they were. readings is not changed.
func (w *Windows) Read(key string, readings []headers.Reading, at time.Time) []headers.Reading {
	out, copied := readings, false
	for i, r := range readings {
		if !r.Refills || r.Rounded() {
			continue
		}
		window, level := w.tell(key, r.Name, r.Remaining, r.Reset, at)
		if !window {
			continue
		}
		if !copied {
			out, copied = append([]headers.Reading(nil), readings...), true
		}
		out[i].Refills = false
		if level {
			out[i].Early = r.Reset
		}
	}
	return out
}

// tell notes a reading of key's quota named name, heard at at, that says
// it refills: left units, full again in reset. It reports whether the
// readings so far tell a window, and whether it is read as a level alone
// (see Read).
func (w *Windows) tell(key, name string, left int64, reset time.Duration, at time.Time) (window, level bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	quotas := w.keys.of(key, at)
	q := quotas[name]
	if q == nil {
		q = &quotaClock{}
		quotas[name] = q
	}
	q.longest = max(q.longest, reset)
	gap, full := at.Sub(q.at), at.Add(reset)
	switch {
	case !q.at.IsZero() && gap < windowGap: // or an older reading come late
		return q.window, q.level(at)
	case !q.at.IsZero() && left <= q.left: // else units came back: a bucket's refill, or a window's reset
		q.counted(full.Sub(q.full) < gap/2, at)
	}
	q.at, q.full, q.left = at, full, left
	return q.window, q.level(at)
}

// level reports whether a window's reading heard at at is read as a level
// alone: of a window of a second or less, or in the second after the
// readings told the window.
func (q *quotaClock) level(at time.Time) bool {
	return q.window && (q.longest <= time.Second || at.Sub(q.told) < time.Second)
}

// counted notes a reading heard at at that counted as a window's, or as a
// bucket's.
func (q *quotaClock) counted(window bool, at time.Time) {
	if window == q.window {
		q.count = 0
		return
	}
	if q.count++; q.count >= turnReadings {
		q.window, q.count, q.told = window, 0, at
	}
}
