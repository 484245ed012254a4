package pace

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

// holdNow is the time the sample responses arrive: 2023-11-14 22:13:20 UTC.
var holdNow = time.Unix(1_700_000_000, 0)

func response(status int, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Add(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: http.NoBody}
}

// TestParseHold: samples of what real APIs send when their quota is spent,
// and when it is not.
func TestParseHold(t *testing.T) {
	for name, tc := range map[string]struct {
		resp *http.Response
		want time.Duration // 0: no hold
	}{
		"GitHub primary limit, 403": {response(403,
			"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0", "X-RateLimit-Used", "5000",
			"X-RateLimit-Reset", "1700000600", "X-RateLimit-Resource", "core"), 10 * time.Minute},
		"GitHub secondary limit, 403 Retry-After": {response(403, "Retry-After", "60"), time.Minute},
		"GitHub quota left": {response(200,
			"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999", "X-RateLimit-Reset", "1700000600"), 0},
		"X 429": {response(429,
			"X-Rate-Limit-Limit", "900", "X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "1700000900"), 15 * time.Minute},
		"Shopify 429":                          {response(429, "X-Shopify-Shop-Api-Call-Limit", "40/40", "Retry-After", "2.0"), 2 * time.Second},
		"Stripe-style 429 without Retry-After": {response(429, "Stripe-Should-Retry", "true", "Request-Id", "req_1"), 0},
		"Stripe-style 429 with Retry-After":    {response(429, "Retry-After", "1"), time.Second},
		"IETF RateLimit, spent": {response(200,
			"RateLimit-Policy", `"burst";q=100;w=60,"daily";q=1000;w=86400`, "RateLimit", `"burst";r=0;t=30`), 30 * time.Second},
		"IETF RateLimit, two quotas spent": {response(429,
			"RateLimit", `"burst";r=0;t=30, "daily";r=0;t=3600`), time.Hour},
		"IETF RateLimit, left":             {response(200, "RateLimit", `"default";r=50;t=30`), 0},
		"IETF older fields":                {response(429, "RateLimit-Limit", "100", "RateLimit-Remaining", "0", "RateLimit-Reset", "50"), 50 * time.Second},
		"IETF older dictionary":            {response(200, "RateLimit", "limit=100, remaining=0, reset=50"), 50 * time.Second},
		"503 HTTP-date":                    {response(503, "Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT"), 2 * time.Minute},
		"Azure 429 retry-after-ms":         {response(429, "retry-after-ms", "1500", "x-ratelimit-remaining-requests", "0"), 1500 * time.Millisecond},
		"Azure 429 x-ms-retry-after-ms":    {response(429, "x-ms-retry-after-ms", "250.5"), 251 * time.Millisecond},
		"Azure retry-after-ms on a 200":    {response(200, "retry-after-ms", "1500"), 0},
		"Azure retry-after-ms garbage":     {response(429, "retry-after-ms", "NaN"), 0},
		"several say so: the longest wins": {response(429, "Retry-After", "2", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5"), 5 * time.Second},
		"Retry-After on a 200 is no hold":  {response(200, "Retry-After", "30"), 0},
		"small reset is seconds from now":  {response(429, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20"), 20 * time.Second},
		"garbage Retry-After":              {response(429, "Retry-After", "soon"), 0},
		"negative Retry-After":             {response(429, "Retry-After", "-5"), 0},
		"Retry-After in the past":          {response(503, "Retry-After", "Tue, 14 Nov 2023 22:00:00 GMT"), 0},
		"infinite Retry-After":             {response(429, "Retry-After", "Inf"), 0},
		"reset in the past":                {response(403, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1699999000"), 0},
		"remaining above the limit":        {response(403, "X-RateLimit-Limit", "-1", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "60"), 0},
		"remaining not a number":           {response(403, "X-RateLimit-Remaining", "none", "X-RateLimit-Reset", "60"), 0},
		"garbage RateLimit":                {response(200, "RateLimit", `;;,=,"x";r=;t=-3,"y";r=0;t=abc`), 0},
		"no headers at all":                {response(429), 0},
	} {
		t.Run(name, func(t *testing.T) {
			h, ok := ParseHold(tc.resp, holdNow, 24*time.Hour)
			if ok != (tc.want > 0) || h.For != tc.want {
				t.Errorf("ParseHold = %v (%q), %v; want %v", h.For, h.Reason, ok, tc.want)
			}
			if ok && (h.Reason == "" || h.Asked != 0) {
				t.Errorf("hold %+v: want a reason and no cap", h)
			}
		})
	}
}

// TestParseHoldCaps: a server once asked a client to wait 484,289 hours.
// The hold stops at the cap and says what was asked.
func TestParseHoldCaps(t *testing.T) {
	for _, v := range []string{"1743440400", "1e300"} {
		h, ok := ParseHold(response(429, "Retry-After", v), holdNow, time.Hour)
		if !ok || h.For != time.Hour || h.Asked <= time.Hour {
			t.Errorf("Retry-After: %s: %+v, %v; want a hold of 1h and the larger ask", v, h, ok)
		}
	}
}

// FuzzParseHold: whatever the headers, ParseHold never panics and never
// holds beyond the cap, and says ok exactly when it holds.
func FuzzParseHold(f *testing.F) {
	f.Add(429, "2", `"default";r=0;t=30`, "0", "1700000600", "5000")
	f.Add(503, "Tue, 14 Nov 2023 22:15:20 GMT", "limit=100, remaining=0, reset=50", "", "", "")
	f.Add(403, "", "", "0", "20", "-1")
	f.Fuzz(func(t *testing.T, status int, retryAfter, rateLimit, remaining, reset, limit string) {
		resp := response(status, "Retry-After", retryAfter, "RateLimit", rateLimit,
			"X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset, "X-RateLimit-Limit", limit,
			"RateLimit-Remaining", remaining, "RateLimit-Reset", reset)
		const max = time.Hour
		h, ok := ParseHold(resp, holdNow, max)
		if h.For > max || h.For < 0 || ok != (h.For > 0) || (h.Asked != 0 && h.For != max) {
			t.Fatalf("ParseHold = %+v, %v with a cap of %v", h, ok, max)
		}
	})
}

// TestParseHoldMessage: what the hold script publishes (hold.lua), and
// what else may reach the channel, which is no hold; a hold of no length
// holds nothing.
func TestParseHoldMessage(t *testing.T) {
	for _, tc := range []struct {
		payload string
		key     string
		end     int64
		d       time.Duration
		ok      bool
	}{
		{"RULE|api.github.com:443|9f2c\n1700000060000000 60000000", "RULE|api.github.com:443|9f2c", 1700000060000000, time.Minute, true},
		{"k\n5 1", "k", 5, time.Microsecond, true},
		{"k\n5 0", "", 0, 0, false},
		{"k\n5 -1", "", 0, 0, false},
		{"k\n5 9223372036854776", "", 0, 0, false}, // beyond a Duration
		{"k\nretime 5", "", 0, 0, false},
		{"k\n5", "", 0, 0, false},
		{"k 5 1", "", 0, 0, false},
		{"k\n99999999999999999999 1", "", 0, 0, false},
		{"", "", 0, 0, false},
	} {
		key, end, d, ok := parseHoldMessage(tc.payload)
		if key != tc.key || end != tc.end || d != tc.d || ok != tc.ok {
			t.Errorf("parseHoldMessage(%q) = %q, %d, %v, %v; want %q, %d, %v, %v", tc.payload, key, end, d, ok, tc.key, tc.end, tc.d, tc.ok)
		}
	}
}

// FuzzParseHoldMessage: any payload parses or not, without a panic, and a
// hold parsed lasts a while.
func FuzzParseHoldMessage(f *testing.F) {
	f.Add("k\n5 1")
	f.Add("k\nrate 5")
	f.Fuzz(func(t *testing.T, payload string) {
		if _, _, d, ok := parseHoldMessage(payload); ok && d <= 0 {
			t.Errorf("%q: a hold of %v", payload, d)
		}
	})
}

// TestHoldStopsSleepers: callers already booked and asleep when a hold
// comes do not go during the hold, on Local as on Redis.
func TestHoldStopsSleepers(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for name, newLimiter := range map[string]func(Observer) pacer{
		"redis": func(o Observer) pacer { return mustRedis(t, c, PerSecond(20).WithBurst(1), WithObserver(o)) },
		"local": func(o Observer) pacer { return mustLocal(t, PerSecond(20).WithBurst(1), WithObserver(o)) },
	} {
		t.Run(name, func(t *testing.T) {
			booked := make(chan time.Duration, 8)
			lim := newLimiter(func(_ context.Context, e Event) {
				if e.Kind == EventWait {
					booked <- e.Delay
				}
			})
			lim.Wait(ctx, "k", 1) // empty the bucket
			<-booked
			done := make(chan time.Time, 3)
			for range 3 { // asleep for 50, 100 and 150 ms
				go func() {
					lim.Wait(ctx, "k", 1)
					done <- time.Now()
				}()
			}
			for range 3 {
				if d := <-booked; d == 0 {
					t.Fatal("a caller was not put to sleep")
				}
			}
			held := time.Now()
			if err := lim.Hold(ctx, "k", Hold{For: 400 * time.Millisecond, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if at := <-done; at.Sub(held) < 400*time.Millisecond {
					t.Errorf("a caller booked before the hold went %v after it, within the 400ms hold", at.Sub(held))
				}
			}
		})
	}
}

// TestHoldPausesKey: a hold makes the next wait for its key last the hold,
// on Redis for every limiter that shares it and on Local; a shorter hold
// does not shorten it; and the observer hears of it.
func TestHoldPausesKey(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	for name, newLimiter := range map[string]func(Observer) pacer{
		"redis": func(o Observer) pacer { return mustRedis(t, c, PerSecond(100).WithBurst(5), WithObserver(o)) },
		"local": func(o Observer) pacer { return mustLocal(t, PerSecond(100).WithBurst(5), WithObserver(o)) },
	} {
		t.Run(name, func(t *testing.T) {
			log := &eventLog{}
			lim := newLimiter(log.observe)
			h := Hold{For: 300 * time.Millisecond, Reason: "429 Retry-After: 0.3"}
			if err := lim.Hold(ctx, "k", h); err != nil {
				t.Fatal(err)
			}
			if err := lim.Hold(ctx, "k", Hold{For: 100 * time.Millisecond, Reason: "shorter"}); err != nil {
				t.Fatal(err)
			}
			if e, ok := log.last(EventHold); !ok || e.Reason != h.Reason || e.Delay != h.For {
				t.Errorf("last hold event %+v, want the 300ms hold alone (the shorter one changes nothing)", e)
			}
			var de *DeadlineError
			dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			if err := lim.Wait(dctx, "k", 1); !errors.As(err, &de) || de.Delay < 250*time.Millisecond || de.Delay > 300*time.Millisecond {
				t.Fatalf("Wait during the hold: %v, want a refusal of a wait of about 300ms", err)
			}
			if err := lim.Wait(ctx, "other", 1); err != nil {
				t.Fatalf("another key: %v", err)
			}
			if e, _ := log.last(EventWait); e.Key != "other" || e.Delay != 0 {
				t.Errorf("another key waited %v: a hold is for its own key alone", e.Delay)
			}
			start := time.Now()
			for range 3 { // the first at the hold's end, then one every 10 ms
				if err := lim.Wait(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
			}
			if took := time.Since(start); took < 250*time.Millisecond+20*time.Millisecond {
				t.Errorf("three waits after a hold of 300ms took %v, want the hold and then the rate, no burst", took)
			}
			for deadline := time.Now().Add(time.Second); ; { // the end is told by a timer of its own
				if e, ok := log.last(EventHoldEnd); ok {
					if e.Key != "k" || e.Reason != h.Reason {
						t.Errorf("hold end %+v, want key k and the hold's reason", e)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no EventHoldEnd within a second after the hold ended")
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}
