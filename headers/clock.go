package headers

import (
	"net/http"
	"sync"
	"time"
)

// A Clock is how far an upstream's clock runs ahead of ours, as the Date
// of its responses tells it, for the Unix times and HTTP-dates they state
// (GitHub's resets, a Retry-After date). A Date is the second the upstream
// answered in, and it answered between the request's sending and the
// response's arrival: one response bounds the offset within a second and
// its round trip; responses either side of the turn of one of the
// upstream's seconds, within the time between them. Clocks the bounds
// allow to agree are taken to agree, as by ParseReadings. Else, once the
// offset is known within a second, times are taken against ours moved by
// it, its uncertainty added to a whole-second reset's Early, rather than
// against a Date of a coarse second (against which a reset said in whole
// seconds may come two seconds sooner than said). Bounds that
// contradict the last ones (the upstream's clock stepped, or servers under
// one name disagree) start anew. The zero Clock knows nothing; a Clock is
// safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	lo, hi time.Duration // the offset lies within [lo, hi], when known
	known  bool
}

// Hear is Hear, for a request sent at sent, with the times resp states
// taken against c, which resp's Date first narrows.
func (c *Clock) Hear(resp *http.Response, sent, now time.Time, max time.Duration) Word {
	return hear(resp, readingClock{header: resp.Header, now: now, sent: sent, upstream: c}, max)
}

// learn narrows c by a response whose Date says date, to a request sent at
// sent, arrived at arrived on our clock. It returns the least offset c
// allows and how much more it may be, and whether the clocks disagree
// (the offset cannot be 0) and the offset is known within a second. A nil
// Clock learns nothing.
func (c *Clock) learn(date, sent, arrived time.Time) (lo, width time.Duration, ok bool) {
	if c == nil || arrived.Before(sent) {
		return 0, 0, false
	}
	lo, hi := date.Sub(arrived), date.Add(time.Second).Sub(sent)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known && max(lo, c.lo) <= min(hi, c.hi) {
		lo, hi = max(lo, c.lo), min(hi, c.hi)
	}
	c.lo, c.hi, c.known = lo, hi, true
	return lo, hi - lo, (lo > 0 || hi < 0) && hi-lo < time.Second
}
