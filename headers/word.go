package headers

import (
	"net/http"
	"strconv"
	"time"
)

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
	clock := readingClock{header: resp.Header, now: now}
	w := Word{Readings: readAll(resp.Header, &clock), At: now, Status: resp.StatusCode,
		Refused: resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable}
	status := strconv.Itoa(resp.StatusCode) + " "
	if h, ok := retryAfter(resp, &clock, max, status); ok {
		w.Holds = append(w.Holds, h)
	}
	for _, r := range w.Readings {
		if r.Remaining == 0 && !r.Refills {
			h := Hold{Reason: status + r.Header, Quota: r.Name, OnlyReading: len(w.Readings) == 1, OwnQuota: r.OwnQuota}
			w.Holds = append(w.Holds, capHold(r.Reset.Seconds(), max, h))
		}
	}
	return w
}
