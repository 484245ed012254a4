package pace

import (
	"net/http"
	"strconv"
	"time"
)

// A word is what one response said of its key's quota, read once: the
// readings of its counters (ParseReadings), the holds they and its
// Retry-After ask for (ParseHold), all on one clock, and whether the
// upstream refused the request.
type word struct {
	readings []Reading
	holds    []Hold
	status   int
	refused  bool      // a 429 or a 503
	at       time.Time // when the response arrived
}

// hear reads what resp, which arrived at now, says: its readings, and the
// holds they and its Retry-After ask for, each capped at max.
func hear(resp *http.Response, now time.Time, max time.Duration) word {
	clock := readingClock{header: resp.Header, now: now}
	w := word{readings: readAll(resp.Header, &clock), at: now, status: resp.StatusCode,
		refused: resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable}
	status := strconv.Itoa(resp.StatusCode) + " "
	if h, ok := retryAfter(resp, &clock, max, status); ok {
		w.holds = append(w.holds, h)
	}
	for _, r := range w.readings {
		if r.Remaining == 0 && !r.Refills {
			h := Hold{Reason: status + r.Header, Quota: r.Name, only: len(w.readings) == 1, own: r.own}
			w.holds = append(w.holds, capHold(r.Reset.Seconds(), max, h))
		}
	}
	return w
}

// explained reports whether w explains its refusal for limits: a hold of
// the key, or a reading of one of the limits with no unit left. A refusal
// nothing explains steers the key's rate (see refusals.go).
func (w word) explained(limits namedLimits) bool {
	for _, h := range w.holds {
		if limits.holds(h) {
			return true
		}
	}
	for _, r := range w.readings {
		if r.Remaining == 0 && limits.limitOf(r.Name, r.own, len(w.readings) == 1) >= 0 {
			return true
		}
	}
	return false
}

// limitOf returns the index of the limit that a reading of the upstream's
// quota name is about, or -1: the limit named like it; or, for a response's
// only reading (only), the quota's only limit, unless the reading names a
// quota of its own (own: a GitHub resource other than core).
func (n namedLimits) limitOf(name string, own, only bool) int {
	for i, known := range n.names {
		if known == name {
			return i
		}
	}
	if only && !own && len(n.limits) == 1 {
		return 0
	}
	return -1
}

// holds reports whether h holds a key of these limits: a hold of the whole
// key, or of a quota one of them is.
func (n namedLimits) holds(h Hold) bool {
	return h.Quota == "" || n.limitOf(h.Quota, h.own, h.only) >= 0
}
