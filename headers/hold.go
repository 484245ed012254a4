package headers

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// A Hold is the upstream's word that a key's quota is spent: no request for
// the key should reach it for For. pace's Local.Hold and Redis.Hold pause a
// key so (a Transport does whenever a response says its quota is spent): the hold
// spends nothing, and afterwards the key resumes at its rate, with the
// burst its buckets had and refilled meanwhile. A hold never shortens a
// longer one already in place.
type Hold struct {
	For    time.Duration
	Reason string        // the status and header that said so, such as "429 Retry-After: 2"
	Asked  time.Duration // when the hold was capped: what the upstream asked for; else 0
	// Quota names the upstream's quota that is spent, as a Reading names it
	// (a GitHub resource, an IETF policy); "" for the whole key, as a
	// Retry-After says. A limiter holds a key for a named quota only when
	// the quota is about one of its limits (see ParseReadings).
	Quota string

	// Repeats: the upstream asks for a wait that grows while it goes on
	// refusing (GitHub's secondary limit, which said no time): a Transport
	// doubles it for each such refusal that comes within the last one's
	// length of its end, until a success (see HearBody).
	Repeats bool

	// OnlyReading: the reading that said so was the response's only one,
	// so it is about a quota's only rate limit too, unless OwnQuota: it
	// names a quota of its own (see Reading.OwnQuota).
	OnlyReading, OwnQuota bool

	// Reading is the reading that said so, or nil: a Rounded one may be a
	// token bucket's, empty for a moment, which a limiter whose limit
	// refills the reading's Limit within a second holds nothing for.
	Reading *Reading
}

// ParseHold reads what a response says of the quota and returns the hold it
// asks for, capped at max, or false when it asks for none. now is when the
// response arrived. It reads the status and headers only, never the body,
// on the clock of ParseReadings:
//
//   - 429, 503 or 403 with Retry-After, in seconds (whole or decimal) or as
//     an HTTP-date, or with Azure's retry-after-ms or x-ms-retry-after-ms:
//     a hold of the whole key;
//   - on any status, a reading (ParseReadings) of a window with no unit
//     left: a hold of its quota until the window resets, as GitHub says
//     with its 403s (X-RateLimit-Remaining: 0) and the IETF draft with
//     "default";r=0;t=30, or RateLimit-Remaining: 0 with RateLimit-Reset;
//     not a reset a second away or less, said in whole seconds (t=1): the
//     quota may be a token bucket's, whose next unit comes long before the
//     second ends (see Reading.Rounded).
//
// When several say so, the longest hold wins. A value that is malformed,
// negative, in the past, or contradicted by its own headers (a remaining
// count above the limit) is ignored.
func ParseHold(resp *http.Response, now time.Time, max time.Duration) (Hold, bool) {
	var longest Hold
	for _, h := range Hear(resp, now, max).Holds {
		if h.For > longest.For {
			longest = h
		}
	}
	return longest, longest.For > 0
}

// retryAfter reads the Retry-After of a 429, 503 or 403 (or Azure's
// retry-after-ms or x-ms-retry-after-ms), on clock, as a hold of the whole
// key capped at max, with status (such as "429 ") in its reason.
func retryAfter(resp *http.Response, clock *readingClock, max time.Duration, status string) (Hold, bool) {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
	default:
		return Hold{}, false
	}
	var longest Hold
	if v := resp.Header.Get("Retry-After"); v != "" {
		longest = capHold(retryAfterSeconds(v, clock), max, Hold{Reason: status + "Retry-After: " + v})
	}
	for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} { // Azure's, in milliseconds
		if v := resp.Header.Get(name); v != "" {
			ms, _ := strconv.ParseFloat(v, 64)
			if h := capHold(ms/1000, max, Hold{Reason: status + name + ": " + v}); h.For > longest.For {
				longest = h
			}
		}
	}
	return longest, longest.For > 0
}

// capHold is h, for seconds capped at max (with what was asked, when
// capped); For is 0 when seconds is not a positive finite number.
func capHold(seconds float64, max time.Duration, h Hold) Hold {
	switch {
	case !(seconds > 0) || math.IsInf(seconds, 0):
		return Hold{}
	case seconds < max.Seconds():
		h.For = time.Duration(math.Ceil(seconds*1e3)) * time.Millisecond
	default:
		h.For, h.Asked = max, time.Duration(math.MaxInt64)
		if seconds < float64(math.MaxInt64/int64(time.Second)) {
			h.Asked = time.Duration(seconds * float64(time.Second))
		}
	}
	return h
}

// retryAfterSeconds reads a Retry-After value: seconds, or an HTTP-date
// taken against clock.
func retryAfterSeconds(v string, clock *readingClock) float64 {
	if seconds, err := strconv.ParseFloat(v, 64); err == nil {
		return seconds
	}
	if at, err := http.ParseTime(v); err == nil {
		return at.Sub(clock.at()).Seconds()
	}
	return 0
}

// A Word is what one response said of its key's quota, read once: the
// readings of its counters (ParseReadings), the holds they and its
// Retry-After ask for (ParseHold), all on one clock, and whether the
// upstream refused the request.
type Word struct {
	Readings []Reading
	Holds    []Hold
	Status   int
	Refused  bool      // a 429 or a 503
	At       time.Time // when the response arrived
}

// Hear reads what resp, which arrived at now, says: its readings, and the
// holds they and its Retry-After ask for, each capped at max.
func Hear(resp *http.Response, now time.Time, max time.Duration) Word {
	return hear(resp, readingClock{header: resp.Header, now: now}, max)
}

// hear is Hear on clock.
func hear(resp *http.Response, clock readingClock, max time.Duration) Word {
	now := clock.now
	w := Word{Readings: readAll(resp.Header, &clock), At: now, Status: resp.StatusCode,
		Refused: resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable}
	status := strconv.Itoa(resp.StatusCode) + " "
	if h, ok := retryAfter(resp, &clock, max, status); ok {
		w.Holds = append(w.Holds, h)
	}
	for _, r := range w.Readings {
		if r.Remaining == 0 && !r.Refills && r.Reset > r.Early { // else it may be now
			said := r // on the heap for the holds alone
			h := Hold{Reason: status + r.Header, Quota: r.Name, OnlyReading: len(w.Readings) == 1, OwnQuota: r.OwnQuota, Reading: &said}
			w.Holds = append(w.Holds, capHold(r.Reset.Seconds(), max, h))
		}
	}
	return w
}
