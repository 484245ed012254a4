package fleetsim

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// upstreamClock is how far the upstream's clock is ahead of the
// simulation's, which starts in 2000 (synctest's epoch): a service's
// clock reads the present, and Unix times in headers (GitHub's reset)
// are above 10^9, as pace expects of them; its Date header tells pace
// its clock.
var upstreamClock = time.Date(2026, time.December, 5, 0, 0, 0, 0, time.UTC).Sub(time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC))

// answer is the response of c's upstream to a request it judged v at now:
// 200 or 429 (Shopify answers both 200, with THROTTLED in the body), with
// c's Retry-After on a refusal, its counters on every answer, and its
// body, as the real services write them.
func answer(c Case, v verdict, now time.Time, req *http.Request) *http.Response {
	status, body := http.StatusOK, "ok\n"
	now = now.Add(upstreamClock)
	h := http.Header{"Date": {now.UTC().Format(http.TimeFormat)}}
	if !v.ok {
		status, body = http.StatusTooManyRequests, "Too Many Requests\n"
		if ra, _ := c.retryAfter(v.wait); ra != "" && c.Body != "shopify" {
			h.Set("Retry-After", ra)
		}
	}
	writeCounters(h, c.Counters, v, now)
	switch c.Body {
	case "retryinfo":
		if !v.ok {
			h.Set("Content-Type", "application/json; charset=UTF-8")
			body = retryInfo(v.wait)
		}
	case "shopify":
		status = http.StatusOK
		h.Set("Content-Type", "application/json")
		body = shopify(c, v)
	}
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
}

// writeCounters states v in the dialect named.
func writeCounters(h http.Header, dialect string, v verdict, now time.Time) {
	resetSeconds := int64(math.Ceil(v.reset.Seconds()))
	switch dialect {
	case "openai":
		h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(v.limit))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(v.left))
		h.Set("X-Ratelimit-Reset-Requests", v.reset.Round(time.Millisecond).String())
	case "github":
		h.Set("X-RateLimit-Limit", strconv.Itoa(v.limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(v.left))
		h.Set("X-RateLimit-Used", strconv.Itoa(v.limit-v.left))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(now.Add(v.reset).UnixNano())/1e9)), 10))
		h.Set("X-RateLimit-Resource", "core")
	case "ietf":
		w := max(resetSeconds, 1)
		if v.window > 0 {
			w = int64(math.Ceil(v.window.Seconds())) // express-rate-limit's: its window's length
		}
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, v.limit, w))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, v.left, resetSeconds))
	}
}

// retryInfo is a Gemini refusal that says when to retry in its body.
func retryInfo(wait time.Duration) string {
	return fmt.Sprintf(`{
  "error": {
    "code": 429,
    "message": "Resource has been exhausted (e.g. check quota).",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": "%gs"
      }
    ]
  }
}
`, math.Ceil(wait.Seconds()*1000)/1000)
}

// shopify is the GraphQL Admin API's answer: the data or THROTTLED, and
// the cost bucket in extensions.
func shopify(c Case, v verdict) string {
	data := `"data": {"shop": {"name": "fleetsim"}}`
	if !v.ok {
		data = `"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED", "documentation": "https://shopify.dev/api/usage/rate-limits"}}]`
	}
	return fmt.Sprintf(`{%s, "extensions": {"cost": {"requestedQueryCost": %d, "actualQueryCost": %d, "throttleStatus": {"maximumAvailable": %d.0, "currentlyAvailable": %d, "restoreRate": %g}}}}`,
		data, c.Cost, c.Cost, v.limit, v.left, c.Rate)
}
