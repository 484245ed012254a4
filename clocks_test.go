package pace

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// skewedUpstream answers as an upstream whose clock runs offset ahead of
// ours, after a round trip of rtt: its Date, and what answer writes.
func skewedUpstream(offset, rtt time.Duration, answer func(theirs time.Time, h http.Header) int) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		time.Sleep(rtt / 2)
		theirs := time.Now().Add(offset)
		h := http.Header{"Date": {theirs.UTC().Format(http.TimeFormat)}}
		status := answer(theirs, h)
		time.Sleep(rtt / 2)
		return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: req}, nil
	})
}

// presentDay is how far the present is ahead of a synctest bubble's
// clock, which starts in 2000: an upstream's Unix times are above
// 1,000,000,000, as pace expects of them.
var presentDay = time.Date(2026, time.December, 5, 0, 0, 0, 0, time.UTC).Sub(time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC))

// getThrough sends a GET through transport and closes its response.
func getThrough(t *testing.T, transport *Transport) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://api.example/", nil)
	resp, err := transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// heldFor returns an observer that sends the length of each hold to holds.
func heldFor(holds chan<- time.Duration) Observer {
	return func(_ context.Context, e Event) {
		if e.Kind == EventHold {
			holds <- e.Delay
		}
	}
}

// TestTransportLearnsTheUpstreamsClock: against an upstream whose clock
// runs 0.6 s ahead of the present (a synctest bubble starts in 2000), a Retry-After date is taken against its
// Date at first (a second coarse: the hold 0.6 s too long), then, once the
// Transport heard responses either side of the turn of one of its seconds
// (each with a reset in a Unix time, which needs the clock),
// against ours moved by the offset learned: the hold within the time
// between two responses of what the upstream asked.
func TestTransportLearnsTheUpstreamsClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		offset, rtt := presentDay+600*time.Millisecond, 4*time.Millisecond
		var mu sync.Mutex
		var asked time.Duration
		refuse := false
		upstream := skewedUpstream(offset, rtt, func(theirs time.Time, h http.Header) int {
			mu.Lock()
			defer mu.Unlock()
			if !refuse {
				h.Set("X-RateLimit-Remaining", "100")
				h.Set("X-RateLimit-Reset", strconv.FormatInt(theirs.Add(time.Hour).Unix(), 10))
				return http.StatusOK
			}
			at := theirs.Truncate(time.Second).Add(3 * time.Second)
			h.Set("Retry-After", at.UTC().Format(http.TimeFormat))
			asked = at.Sub(theirs)
			return http.StatusTooManyRequests
		})
		holds := make(chan time.Duration, 10)
		transport := &Transport{Base: upstream, Limiter: mustLocal(t, PerSecond(1000), WithObserver(heldFor(holds)))}
		get := func() { getThrough(t, transport) }
		refusal := func() (hold, want time.Duration) {
			mu.Lock()
			refuse = true
			mu.Unlock()
			get()
			mu.Lock()
			defer mu.Unlock()
			refuse = false
			return <-holds, asked
		}
		if hold, want := refusal(); hold-want < 500*time.Millisecond {
			t.Errorf("first hold %v, asked %v: want it taken against the Date, up to a second longer", hold, want)
		}
		time.Sleep(3 * time.Second) // the hold
		for range 15 {
			get()
			time.Sleep(100 * time.Millisecond)
		}
		if hold, want := refusal(); hold < want-rtt || hold > want+100*time.Millisecond+2*rtt {
			t.Errorf("hold %v once the clock was learned, asked %v: want it within the time between two responses", hold, want)
		}
	})
}

// TestEmptyBucketInAUnixTimeHoldsNothing: a token bucket of 20 stated in
// GitHub's fields (its clock learned), empty, says it is full at the upstream's next second
// but one, 1.3 s away at 0.7 s past one; full in less than a second of
// the limit's rate, it holds nothing. A count an hour's or a burst's
// worth, or none, said the same way, holds the key until the reset.
func TestEmptyBucketInAUnixTimeHoldsNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		limit  string
		bucket bool
	}{
		"a bucket of 20 at 50/s":          {"20", true},
		"GitHub's hourly 5,000":           {"5000", false},
		"no limit said":                   {"", false},
		"60, more than the limit's burst": {"60", false},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				empty := false
				upstream := skewedUpstream(presentDay, 2*time.Millisecond, func(theirs time.Time, h http.Header) int {
					h.Set("X-RateLimit-Remaining", "10")
					if empty {
						h.Set("X-RateLimit-Remaining", "0")
					}
					h.Set("X-RateLimit-Reset", strconv.FormatInt(theirs.Truncate(time.Second).Add(2*time.Second).Unix(), 10))
					if tc.limit != "" {
						h.Set("X-RateLimit-Limit", tc.limit)
					}
					return http.StatusOK
				})
				holds := make(chan time.Duration, 20)
				transport := &Transport{Base: upstream, Limiter: mustLocal(t, PerSecond(50).WithBurst(20), WithObserver(heldFor(holds)))}
				get := func() { getThrough(t, transport) }
				for range 12 { // the upstream's clock, learned
					get()
					time.Sleep(100 * time.Millisecond)
				}
				time.Sleep(1700*time.Millisecond - time.Since(time.Unix(0, 0))%time.Second)
				empty = true
				get()
				select {
				case hold := <-holds:
					if tc.bucket {
						t.Errorf("held %v, want no hold: a bucket's level alone", hold)
					}
				default:
					if !tc.bucket {
						t.Error("no hold, want one until the reset")
					}
				}
			})
		})
	}
}
