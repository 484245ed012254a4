package pace

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/pace/headers"
)

// scriptedAPI is an upstream on loopback that answers its n-th request
// (from 1) with the status and headers answer gives, and counts them.
func scriptedAPI(t *testing.T, answer func(n int64, h http.Header) int) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(answer(n.Add(1), w.Header()))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// github sets GitHub's headers on h: of its core quota of 5000, left
// remain, resetting at reset.
func github(h http.Header, resource string, limit, left int64, reset time.Time) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(left, 10))
	h.Set("X-RateLimit-Used", strconv.FormatInt(limit-left, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	h.Set("X-RateLimit-Resource", resource)
}

// getWithin sends one request through client, under a deadline of d, and
// returns its status or error.
func getWithin(client *http.Client, url string, d time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestHoldOfASpreadWindow: a GitHub client as a README might write it
// (PerHour(5000)), whose responses say 20 are left in a window ending in
// 3 s, and whose sixth request is answered 429 with Retry-After: 1; 12
// goroutines send 2 requests each, each under a deadline of 10 s. The hold
// pauses the spread; none is refused by pace, the key lasts minutes in
// Redis at most, not a hundred hours, and a process that starts afterwards
// is not held either.
func TestHoldOfASpreadWindow(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	reset := time.Now().Add(3 * time.Second)
	api, _ := scriptedAPI(t, func(n int64, h http.Header) int {
		github(h, "core", 5000, max(20-n, 0), reset)
		if n == 6 {
			h.Set("Retry-After", "1")
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	})
	r := mustRedis(t, c, PerHour(5000), sharedOnly)
	client := &http.Client{Transport: &Transport{Limiter: r}}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 12 {
		wg.Go(func() {
			for range 2 {
				if _, err := getWithin(client, api.URL, 10*time.Second); err != nil {
					refused.Add(1)
					t.Errorf("a request: %v", err)
				}
			}
		})
	}
	wg.Wait()
	key := HostKey(httptest.NewRequest(http.MethodGet, api.URL, nil))
	ttl := c.PTTL(context.Background(), storeOf(r).BucketKey(key)).Val()
	later := mustRedis(t, c, PerHour(5000), sharedOnly)
	start := time.Now()
	err := later.Wait(context.Background(), key, 1)
	t.Logf("%d of 24 refused by pace; the key's TTL then %v; a later process waited %v (%v)", refused.Load(), ttl, time.Since(start), err)
	if ttl > 10*time.Minute || err != nil || time.Since(start) > time.Second {
		t.Errorf("the key lasts %v in Redis, and a later process waited %v (%v); want minutes at most, and no wait", ttl, time.Since(start), err)
	}
}

// TestHoldBeforeTheFirstSync: the first response is a 403 with
// Retry-After: 1 whose counters say 3,999 of 5,000 are left, for 40
// minutes. The hold is no booking: 1.5 s later, a request goes at once,
// rather than wait 40 minutes.
func TestHoldBeforeTheFirstSync(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	reset := time.Now().Add(40 * time.Minute)
	api, _ := scriptedAPI(t, func(n int64, h http.Header) int {
		github(h, "core", 5000, 4000-n, reset)
		if n == 1 {
			h.Set("Retry-After", "1")
			return http.StatusForbidden
		}
		return http.StatusOK
	})
	client := &http.Client{Transport: &Transport{Limiter: mustRedis(t, c, PerHour(5000), sharedOnly)}}
	if _, err := getWithin(client, api.URL, time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	start := time.Now()
	if _, err := getWithin(client, api.URL, 2*time.Second); err != nil || time.Since(start) > 200*time.Millisecond {
		t.Errorf("1.5 s after a hold of 1 s: %v after %v; want a request at once", err, time.Since(start))
	}
}

// TestSteeringBounded: what a response says of a window or a learned limit
// beyond the limiter's MaxHold is that response's foreign data, ignored
// with an event; a hold beyond it is capped. Neither stalls the key, nor
// makes its data foreign to pace (a *KeyError).
func TestSteeringBounded(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	for name, tc := range map[string]struct {
		limit   string
		maxHold time.Duration
		answer  func(h http.Header)
		want    EventKind // heard of the first response
	}{
		"a GitHub window spent for ten years, under a MaxHold of 1 s": {"10/s", time.Second, func(h http.Header) {
			github(h, "core", 5000, 0, time.Now().AddDate(10, 0, 0))
		}, EventIgnored},
		"a learned policy of one request per 95 years": {"10/s learn", 0, func(h http.Header) {
			h.Set("RateLimit-Policy", `"p";q=1;w=3000000000`)
			h.Set("RateLimit", `"p";r=1;t=1`)
		}, EventIgnored},
		"a learned limit of one a minute, below the floor": {"100/s burst 1 learn", 0, func(h http.Header) {
			h.Set("X-Ratelimit-Limit-Requests", "1")
			h.Set("X-Ratelimit-Remaining-Requests", "1")
			// A reading whose reset has passed when it is applied is no
			// news: a reset of 1 ms was, once, beside a CPU hog.
			h.Set("X-Ratelimit-Reset-Requests", "1s")
		}, EventLearned},
	} {
		t.Run(name, func(t *testing.T) {
			log := &eventLog{}
			first := true
			api, _ := scriptedAPI(t, func(_ int64, h http.Header) int {
				if first {
					first = false
					tc.answer(h)
				}
				return http.StatusOK
			})
			lim := mustParseLimit(t, tc.limit)
			r := mustRedis(t, c, lim, WithObserver(log.observe), WithMaxHold(tc.maxHold), sharedOnly)
			client := &http.Client{Transport: &Transport{Limiter: r, Key: func(*http.Request) string { return t.Name() }}}
			if _, err := getWithin(client, api.URL, time.Second); err != nil {
				t.Fatal(err)
			}
			if _, ok := log.last(tc.want); !ok {
				t.Errorf("the observer heard no %v", tc.want)
			}
			start := time.Now()
			for range 10 { // the last goes 1.2 s on at most: the hold (1 s), or 10 at the floor of 10/s
				var keyErr *KeyError
				if _, err := getWithin(client, api.URL, 3*time.Second); errors.As(err, &keyErr) || err != nil {
					t.Fatalf("a request after it: %v", err)
				}
			}
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("10 requests took %v, want 1.2 s at most", took)
			}
		})
	}
}

// TestReadingsNeverRefill: four processes' limiters of 10/s burst 10, 8
// goroutines each, for 3 s, before an upstream whose counters always say
// 599 of 600 requests a minute are left. No reading refills a bucket: the
// fleet gets at most b + r*t = 40, counted by the times its grants were
// booked for (see bookedSpans).
func TestReadingsNeverRefill(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	api, n := scriptedAPI(t, func(_ int64, h http.Header) int {
		h.Set("X-Ratelimit-Limit-Requests", "600")
		h.Set("X-Ratelimit-Remaining-Requests", "599")
		h.Set("X-Ratelimit-Reset-Requests", "100ms")
		return http.StatusOK
	})
	var wg sync.WaitGroup
	var booked bookedSpans
	start := time.Now()
	for range 4 {
		r := mustRedis(t, c, PerSecond(10), sharedOnly, booked.observer())
		wg.Go(func() { sendFor(t, r, api.URL, 8, 3*time.Second, false) })
	}
	wg.Wait()
	within := booked.within(start, 3*time.Second)
	t.Logf("%d requests served; %d of them booked within the 3 s", n.Load(), within)
	if within > 41 || within < 30 {
		t.Errorf("%d grants within 3 s, want at most b + r*t = 40 (and one at the edge), and 30 at least", within)
	}
}

// TestReadingsGiveBackEstimates: a client that reserves 20 tokens a request
// of a 100/s bucket of 100, and never settles, before an upstream whose
// counters say each request used 2. The readings give back what the
// estimates booked beyond that, so 30 requests go within 2 s (they take a
// loopback round trip each), where the bucket alone lets 100 + 100*t
// tokens go: 15 requests. The bound of TestReadingsNeverRefill is on what
// the fleet is known to spend; an estimate is the upstream's to correct.
func TestReadingsGiveBackEstimates(t *testing.T) {
	besideOthers(t)
	c := newTestRedis(t)
	api, n := scriptedAPI(t, func(_ int64, h http.Header) int {
		h.Set("X-Ratelimit-Limit-Tokens", "100")
		h.Set("X-Ratelimit-Remaining-Tokens", "98")
		h.Set("X-Ratelimit-Reset-Tokens", "20ms")
		return http.StatusOK
	})
	client := &http.Client{Transport: &Transport{
		Limiter:  mustRedis(t, c, PerSecond(100).WithBurst(100).Named("tokens"), sharedOnly),
		Estimate: func(*http.Request) Costs { return Costs{"tokens": 20} },
	}}
	start := time.Now()
	for end := start.Add(2 * time.Second); n.Load() < 30 && time.Now().Before(end); {
		if _, err := getWithin(client, api.URL, time.Until(end)); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			var de *DeadlineError
			if !errors.As(err, &de) {
				t.Fatal(err)
			}
			break
		}
	}
	t.Logf("%d requests in %v", n.Load(), time.Since(start).Round(time.Millisecond))
	if got := n.Load(); got < 30 {
		t.Errorf("%d requests in 2 s, want 30: the readings give back what estimates booked beyond what was spent", got)
	}
}

// TestResourcesHoldWhatMapsToThem: a spent GitHub search resource holds a
// limit named search, and not the core limit of a README's client, which
// the response is not about.
func TestResourcesHoldWhatMapsToThem(t *testing.T) {
	c := newTestRedis(t)
	reset := time.Now().Add(50 * time.Second)
	for _, tc := range []struct {
		name  string
		limit Limit
		held  bool
	}{
		{"core", PerHour(5000), false},
		{"search", PerMinute(30).Named("search"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, _ := scriptedAPI(t, func(n int64, h http.Header) int {
				if n == 1 {
					github(h, "search", 30, 0, reset)
					return http.StatusForbidden
				}
				github(h, "core", 5000, 4000, reset)
				return http.StatusOK
			})
			client := &http.Client{Transport: &Transport{Limiter: mustRedis(t, c, tc.limit, sharedOnly), Key: func(*http.Request) string { return t.Name() }}}
			if _, err := getWithin(client, api.URL, time.Second); err != nil {
				t.Fatal(err)
			}
			_, err := getWithin(client, api.URL, time.Second)
			resetIn := time.Until(reset.Truncate(time.Second)) // the header's Unix time has whole seconds
			var de *DeadlineError
			if held := errors.As(err, &de); held != tc.held || (held && de.Delay < resetIn-100*time.Millisecond) {
				t.Errorf("the next request: %v; want held until the reset, %v away: %v", err, resetIn, tc.held)
			}
		})
	}
}

// TestHoldKeepsTheBurst: a PerHour(5000) bucket that 100 requests have
// used, held for 2 s: the 60 requests after the hold go at once, with the
// burst the key had, not at the hourly rate, on Local and on Redis.
func TestHoldKeepsTheBurst(t *testing.T) {
	besideOthers(t)
	ctx := context.Background()
	for name, lim := range map[string]backend{
		"redis": mustRedis(t, newTestRedis(t), PerHour(5000), sharedOnly),
		"local": mustLocal(t, PerHour(5000)),
	} {
		t.Run(name, func(t *testing.T) {
			for range 100 {
				if err := lim.Wait(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
			}
			if err := lim.Hold(ctx, "k", headers.Hold{For: 2 * time.Second, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for range 60 {
				if err := lim.Wait(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("60 requests after the hold took %v", time.Since(start))
			if took := time.Since(start); took < 1900*time.Millisecond || took > 2300*time.Millisecond {
				t.Errorf("60 requests after a 2 s hold took %v, want the hold and no more", took)
			}
		})
	}
}

// TestLearnedLimitCeiling: a limit that learns, configured at 10/s burst
// 10, before an upstream that advertises 9e15 requests a minute: the
// configured rate is the ceiling of what it learns, and 8 goroutines get
// at most b + r*t in 2 s, not 40 in 11 ms. Each request served is
// counted in the window the whole span of its last booking lies in:
// between its sending plus its delay and the decision plus its delay, by
// this process's clock (a request in flight at the window's end, on a
// loaded machine, was booked for a time after it: counted by its arrival,
// 32 came in 2 s once; and a booking the key's retiming replaced is not
// a grant: counted as one, 32 were once).
func TestLearnedLimitCeiling(t *testing.T) {
	besideOthers(t)
	api, n := scriptedAPI(t, func(_ int64, h http.Header) int {
		h.Set("X-Ratelimit-Limit-Requests", "9000000000000000")
		h.Set("X-Ratelimit-Remaining-Requests", "8999999999999999")
		h.Set("X-Ratelimit-Reset-Requests", "1ms")
		return http.StatusOK
	})
	var booked bookedSpans
	start := time.Now()
	sendFor(t, mustRedis(t, newTestRedis(t), mustParseLimit(t, "10/s learn"), sharedOnly, booked.observer()), api.URL, 8, 2*time.Second, false)
	within := booked.within(start, 2*time.Second)
	t.Logf("%d requests served; %d of them booked within the 2 s", n.Load(), within)
	if within > 31 || within < 20 {
		t.Errorf("%d grants within 2 s, want at most b + r*t = 30 (and one at the edge), and 20 at least", within)
	}
}
