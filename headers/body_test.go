package headers

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// geminiRefusal is what the Gemini API answers when a quota is spent, as
// its users report it: a google.rpc.Status with QuotaFailure, Help and
// RetryInfo details.
const geminiRefusal = `{
  "error": {
    "code": 429,
    "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
          {
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
            "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
            "quotaValue": "15"
          }
        ]
      },
      {
        "@type": "type.googleapis.com/google.rpc.Help",
        "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]
      },
      {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": "52s"
      }
    ]
  }
}`

// githubSecondary is GitHub's refusal of a secondary rate limit, as its
// REST API sends it.
const githubSecondary = `{
  "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID DBC8:2B57:1B9D9A6:37D5A1E:6564A1C1.",
  "documentation_url": "https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
  "status": "403"
}`

// TestHearBody: samples of refusals whose bodies say how long to wait,
// and of those that do not.
func TestHearBody(t *testing.T) {
	for name, tc := range map[string]struct {
		resp    *http.Response
		body    string
		want    time.Duration // 0: no hold
		repeats bool
	}{
		"Gemini 429 RetryInfo":         {response(429, "Content-Type", "application/json; charset=UTF-8"), geminiRefusal, 52 * time.Second, false},
		"Vertex AI, a list of one":     {response(429), "[" + strings.Replace(geminiRefusal, `"52s"`, `"1.5s"`, 1) + "]", 1500 * time.Millisecond, false},
		"Gemini 503 RetryInfo":         {response(503), strings.Replace(geminiRefusal, `"52s"`, `"0.250s"`, 1), 250 * time.Millisecond, false},
		"RetryInfo beyond the most":    {response(429), strings.Replace(geminiRefusal, `"52s"`, `"86400s"`, 1), time.Hour, false},
		"RetryInfo with a Retry-After": {response(429, "Retry-After", "7"), geminiRefusal, 7 * time.Second, false},
		"Gemini 429 without RetryInfo": {response(429), `{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}`, 0, false},
		"RetryInfo on a 400":           {response(400), geminiRefusal, 0, false},
		"RetryInfo negative":           {response(429), strings.Replace(geminiRefusal, `"52s"`, `"-5s"`, 1), 0, false},
		"RetryInfo not a duration":     {response(429), strings.Replace(geminiRefusal, `"52s"`, `"soon"`, 1), 0, false},
		"RetryInfo without its unit":   {response(429), strings.Replace(geminiRefusal, `"52s"`, `"52"`, 1), 0, false},
		"RetryInfo infinite":           {response(429), strings.Replace(geminiRefusal, `"52s"`, `"1e400s"`, 1), 0, false},
		"RetryInfo NaN":                {response(429), strings.Replace(geminiRefusal, `"52s"`, `"NaNs"`, 1), 0, false},
		"a body cut short":             {response(429), geminiRefusal[:len(geminiRefusal)/2], 0, false},
		"GitHub secondary 403":         {response(403, "Content-Type", "application/json; charset=utf-8", "X-GitHub-Request-Id", "DBC8:2B57"), githubSecondary, time.Minute, true},
		"GitHub secondary, 14 left": {response(403, "X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "14", "X-RateLimit-Reset", "1700000600"),
			githubSecondary, time.Minute, true},
		"GitHub secondary 429":          {response(429), githubSecondary, time.Minute, true},
		"GitHub abuse detection":        {response(403), `{"message": "You have triggered an abuse detection mechanism. Please wait a few minutes before you try again.", "documentation_url": "https://developer.github.com/v3/#abuse-rate-limits"}`, time.Minute, true},
		"GitHub secondary, Retry-After": {response(403, "Retry-After", "30"), githubSecondary, 30 * time.Second, false},
		"GitHub primary, remaining 0":   {response(403, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1700000600"), `{"message": "API rate limit exceeded for 1.2.3.4."}`, 10 * time.Minute, false},
		"GitHub 403 of a permission":    {response(403), `{"message": "Resource not accessible by integration", "documentation_url": "https://docs.github.com/rest"}`, 0, false},
		"GitHub secondary on a 503":     {response(503), githubSecondary, 0, false},
		"an HTML page":                  {response(503, "Content-Type", "text/html"), "<html><body>Service Unavailable</body></html>", 0, false},
		"empty":                         {response(429), "", 0, false},
		"a string":                      {response(429), `"secondary rate limit"`, 0, false},
		"an empty list":                 {response(429), `[]`, 0, false},
		"details of another shape":      {response(429), `{"error": {"details": "RetryInfo 52s"}}`, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			w := Hear(tc.resp, holdNow, time.Hour)
			HearBody(&w, []byte(tc.body), time.Hour)
			var longest Hold
			for _, h := range w.Holds {
				if h.For > longest.For {
					longest = h
				}
			}
			if longest.For != tc.want || longest.Repeats != tc.repeats {
				t.Errorf("hold %v (repeats %v, %q), want %v (repeats %v)", longest.For, longest.Repeats, longest.Reason, tc.want, tc.repeats)
			}
			if len(longest.Reason) > 120 {
				t.Errorf("a reason of %d bytes: %q", len(longest.Reason), longest.Reason)
			}
		})
	}
}

// FuzzHearBody: whatever the body, HearBody never panics, and any hold it
// adds is positive and at most the most asked.
func FuzzHearBody(f *testing.F) {
	for _, body := range []string{geminiRefusal, githubSecondary, "[" + geminiRefusal + "]", `{"error":{"details":[{"@type":"google.rpc.RetryInfo","retryDelay":"9e9s"}]}}`, "", "[", "null"} {
		f.Add(429, body)
		f.Add(403, body)
	}
	f.Fuzz(func(t *testing.T, status int, body string) {
		w := Word{Status: status}
		HearBody(&w, []byte(body), time.Hour)
		for _, h := range w.Holds {
			if h.For <= 0 || h.For > time.Hour {
				t.Errorf("status %d, body %q: a hold of %v", status, body, h.For)
			}
		}
	})
}
