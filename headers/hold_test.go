package headers

import (
	"net/http"
	"strconv"
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
		"Atlassian's Beta-RateLimit, spent": {response(429,
			"Beta-Ratelimit", `"tenant-app-quota";r=0;t=2788`, "X-Beta-Ratelimit-Reason", "jira-quota-tenant-based"), 2788 * time.Second},
		"IETF RateLimit, two quotas spent": {response(429,
			"RateLimit", `"burst";r=0;t=30, "daily";r=0;t=3600`), time.Hour},
		"IETF RateLimit, left": {response(200, "RateLimit", `"default";r=50;t=30`), 0},
		// A second or less, in whole seconds: perhaps a token bucket's time
		// until it is full (see Reading.Rounded).
		"IETF spent for 1 s, 200":          {response(200, "RateLimit", `"default";r=0;t=1`), 0},
		"IETF spent for 1 s, 429":          {response(429, "RateLimit", `"default";r=0;t=1`), 0},
		"IETF spent for 2 s, 429":          {response(429, "RateLimit", `"default";r=0;t=2`), 2 * time.Second},
		"a gateway's, spent for 1 s":       {response(200, "X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1"), 0},
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

// TestOneClock: ParseHold and ParseReadings take a reset on one clock: a
// 403 whose Date is 30 s behind ours, resetting 60 s after its Date, holds
// for 60 s, as its reading resets in 60 s.
func TestOneClock(t *testing.T) {
	now := time.Now()
	resp := response(403, "Date", now.Add(-30*time.Second).UTC().Format(http.TimeFormat),
		"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", strconv.FormatInt(now.Add(30*time.Second).Unix(), 10))
	h, _ := ParseHold(resp, now, time.Hour)
	readings := ParseReadings(resp, now)
	if len(readings) != 1 || h.For != readings[0].Reset.Truncate(time.Millisecond)+time.Millisecond && h.For != readings[0].Reset {
		t.Fatalf("hold %v, readings %+v; want one reading, and a hold as long as it resets", h.For, readings)
	}
	if h.For < 59*time.Second || h.For > 61*time.Second {
		t.Errorf("hold %v, want 60 s: the Date's clock", h.For)
	}
}
