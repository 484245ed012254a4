package pace

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/redistest"
)

// runFleetHold: 4 processes of 4 goroutines share an upstream at 50/s
// burst 5 through one real Redis; once, the upstream answers with the given
// status and header, which ask for hold. From the moment that response is
// read, no request reaches the upstream for hold but those granted before
// their process heard of the hold (its Pub/Sub message, which a loaded
// machine can leave unread for a while after the hold is set), at most one
// a goroutine; afterwards the fleet resumes at the limit: after a refusal
// evenly (it opened the key's rate), after a spent reading with the burst
// the bucket refilled during the hold, which paused it and spent nothing.
func runFleetHold(t *testing.T, status int, header, value string, hold time.Duration) {
	srv := redistest.Start(t)
	warmScript(t, srv)
	start := time.Now().Add(time.Second)
	up := &upstream{speakAt: start.Add(time.Second), status: status, header: header, value: value}
	api := httptest.NewServer(up)
	defer api.Close()

	reports, _ := runFleet(t, 4, fleetWorker{
		Addr: srv.Addr, Limit: "50/s burst 5", Goroutines: 4, URL: api.URL,
		Start: start, End: up.speakAt.Add(hold + 1500*time.Millisecond),
	})
	checkNoErrors(t, reports)

	var holds []time.Time
	for _, r := range reports {
		holds = append(holds, r.Holds...)
	}
	if len(holds) != 1 {
		t.Fatalf("%d holds set across the fleet, want 1: %v", len(holds), holds)
	}
	held := holds[0]
	end := up.spoke.Add(hold)
	var inFlight, during int
	var after []time.Time
	for _, a := range up.arrivals {
		switch {
		case a.at.After(up.spoke) && a.at.Before(end) && !a.heardHold:
			inFlight++
		case a.at.After(up.spoke) && a.at.Before(end):
			during++
		case !a.at.Before(end):
			after = append(after, a.at)
		}
	}
	t.Logf("hold set %v after the response was sent; %d requests granted before their process heard of it arrived during the hold, %d others",
		held.Sub(up.spoke), inFlight, during)
	if inFlight > 4*4 {
		t.Errorf("%d requests granted before their process heard of the hold arrived during it, want at most one per goroutine: a booking made after the hold was set goes after it", inFlight)
	}
	if during != 0 {
		t.Errorf("%d requests granted after their process heard of the hold reached the upstream during the %v hold", during, hold)
	}
	slices.SortFunc(after, time.Time.Compare)
	if len(after) < 2 {
		t.Fatalf("%d arrivals after the hold", len(after))
	}
	span := after[len(after)-1].Sub(end).Seconds()
	rate := float64(len(after)) / span
	t.Logf("after the hold: %d arrivals in %.2fs, %.1f/s (limit 50/s)", len(after), span, rate)
	if rate < 45 || float64(len(after)) > 5+50*span+1 {
		t.Errorf("after the hold the fleet sent %d in %.2fs, want the limit's 50/s (at least 45/s, at most 5 + 50*t + 1: the burst, the rate, and the first arrival)", len(after), span)
	}
}

// TestFleetHoldsOnRetryAfter: a 429 with Retry-After: 2 pauses the fleet.
func TestFleetHoldsOnRetryAfter(t *testing.T) {
	besideOthers(t)
	runFleetHold(t, http.StatusTooManyRequests, "Retry-After", "2", 2*time.Second)
}

// TestFleetHoldsOnRateLimitField: a 200 whose RateLimit field says the
// quota is spent for two seconds pauses the fleet (a second or less, said
// on a success, may be a token bucket's: see headers.Reading.Rounded).
func TestFleetHoldsOnRateLimitField(t *testing.T) {
	besideOthers(t)
	runFleetHold(t, http.StatusOK, "RateLimit", `"default";r=0;t=2`, 2*time.Second)
}
