package steer

import (
	"sync"
	"time"

	"github.com/fleetpace/pace/headers"
)

// Phases bounds, per key and quota, the reset of a window that states it
// as a Unix time in whole seconds (GitHub's), by the window's length: a
// window counted every response that states its reset, so it began no
// later than the first of them arrived, and resets no later than its
// length after that. Rounded up to the upstream's next second, the reset
// said may be a second later (a GitHub window of 100/s, 4 x 1, in the
// simulator: 66.7% served; windows of 2 s lost a second of each two). The
// window is the limit's period, unless a response says its reset may come
// later than a period after it arrived: then the window is longer. A
// quota whose units come back within a window, or not at its turn, is no
// window: a token bucket's, or a sliding window's as HAProxy counts it. A
// key's quota is forgotten a minute after its last reading. The zero
// Phases is ready.
type Phases struct {
	mu   sync.Mutex
	keys keyQuotas[phase]
}

// phase is what a process heard of the window a quota is in: the reset
// its readings say (the latest it may come), the first arrival of a
// response that said it, and the fewest units left one said. It is no
// window of the period (other) when units came back within it, more than
// a sixteenth of the quota (beyond the order in which responses sent
// together come back), as a bucket's do. Its readings are levels alone
// (level) when most of its units did not come back at its turn, as a
// sliding window's or a bucket's do (HAProxy's count of its last period,
// in GitHub's fields, said one left at the turn: held until the rounded
// reset, a fleet lost the last two seconds of three). The quota's windows
// are longer than the period (longer, kept from window to window) once
// one said its reset may come later than a period after it arrived, or
// one lasted longer.
type phase struct {
	latest, first        time.Time
	least                int64
	other, level, longer bool
}

// Bound returns r, of key, heard at at, for a limit of count a period,
// when its reset is a Unix time in whole seconds (Dated, Early a second or
// more): the reset of a window of the period that comes later than a
// period after the window's first response is said to come then, exactly
// (Early 0); one of a quota that does not give its units back at its
// turn, a level alone (Early its Reset), unless the limit is faster than
// the quota's count over the period: its level would refill faster than
// the quota's, and only the reset holds the fleet (HAProxy counts its
// refusals: a fleet at twice its count, unheld, was refused 442 times in
// 3 s). Any other reading is returned as it is.
func (p *Phases) Bound(key string, r headers.Reading, at time.Time, period time.Duration, count float64) headers.Reading {
	if !r.Dated || r.Refills || r.Early < time.Second || period <= 0 || r.Reset <= 0 {
		return r
	}
	latest := at.Add(r.Reset)
	q, ok := p.note(key, r.Name, latest, at, r.Reset-r.Early >= period, r.Remaining, r.Limit, period)
	switch {
	case ok && q.level && count <= float64(r.Limit):
		r.Early = r.Reset
		return r
	case !ok || q.other || q.level || q.longer:
		return r
	}
	if end := q.first.Add(period); end.Before(latest) && end.After(at) {
		r.Reset, r.Early = end.Sub(at), 0
	}
	return r
}

// note notes a reading of key's quota named name, heard at at, with left
// of limit units, whose window resets at latest at the latest, and said
// to reset further than a period away when far. It returns what the
// process heard of the window, or false for a reading of an older one. A
// reset less than half a period from the last is the same window's, as
// the upstream's clock, learned, moves it.
func (p *Phases) note(key, name string, latest, at time.Time, far bool, left, limit int64, period time.Duration) (phase, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	quotas := p.keys.of(key, at)
	q := quotas[name]
	switch {
	case q == nil || latest.Sub(q.latest) >= period/2: // a new window
		low, longer := 2*left < limit, q != nil && q.longer
		q = &phase{latest: latest, first: at, least: left, other: low, level: low && q != nil, longer: longer}
		quotas[name] = q
	case q.latest.Sub(latest) >= period/2: // an older window's, come late
		return phase{}, false
	default:
		q.latest = latest
		if at.Before(q.first) {
			q.first = at
		}
	}
	q.longer = q.longer || far || at.After(q.first.Add(period))
	q.other = q.other || left > q.least+max(1, limit/16)
	q.least = min(q.least, left)
	return *q, true
}
