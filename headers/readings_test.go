package headers

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// want is a reading as the tests expect it.
type want struct {
	name             string
	limit, remaining int64
	reset, window    time.Duration
	refills          bool
}

// epoch is a Unix time s seconds after holdNow, as GitHub writes it.
func epoch(s int64) string { return strconv.FormatInt(holdNow.Unix()+s, 10) }

// at is an RFC 3339 time s seconds after holdNow, as Anthropic writes it.
func at(s int64) string {
	return holdNow.Add(time.Duration(s) * time.Second).UTC().Format(time.RFC3339)
}

// dated adds the Date header of holdNow to headers.
func dated(header ...string) []string {
	return append([]string{"Date", holdNow.UTC().Format(http.TimeFormat)}, header...)
}

func TestParseReadings(t *testing.T) {
	policy := `"burst";q=100;w=60,"daily";q=1000;w=86400`
	for name, tc := range map[string]struct {
		header []string
		want   []want
	}{
		// GitHub: a resource a quota, reset as a Unix time.
		"GitHub core": {dated("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999", "X-RateLimit-Used", "1",
			"X-RateLimit-Reset", epoch(600), "X-RateLimit-Resource", "core"), []want{{"core", 5000, 4999, 10 * time.Minute, 0, false}}},
		"GitHub search": {dated("X-RateLimit-Limit", "30", "X-RateLimit-Remaining", "18", "X-RateLimit-Used", "12",
			"X-RateLimit-Reset", epoch(42), "X-RateLimit-Resource", "search"), []want{{"search", 30, 18, 42 * time.Second, 0, false}}},
		"GitHub graphql": {dated("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4990", "X-RateLimit-Used", "10",
			"X-RateLimit-Reset", epoch(3599), "X-RateLimit-Resource", "graphql"), []want{{"graphql", 5000, 4990, 3599 * time.Second, 0, false}}},
		"GitHub without a Date header": {[]string{"X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "59",
			"X-RateLimit-Reset", epoch(300), "X-RateLimit-Resource", "core"}, []want{{"core", 60, 59, 5 * time.Minute, 0, false}}},
		"GitHub, a Date a second behind the arrival: from the arrival": {[]string{"Date", holdNow.Add(-time.Second).UTC().Format(http.TimeFormat),
			"X-RateLimit-Remaining", "10", "X-RateLimit-Reset", epoch(30)}, []want{{"", 0, 10, 30 * time.Second, 0, false}}},
		"GitHub, a Date an hour behind the arrival: from the Date": {[]string{"Date", holdNow.Add(-time.Hour).UTC().Format(http.TimeFormat),
			"X-RateLimit-Remaining", "10", "X-RateLimit-Reset", epoch(30 - 3600)}, []want{{"", 0, 10, 30 * time.Second, 0, false}}},
		"GitHub, used and remaining do not add up": {dated("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999",
			"X-RateLimit-Used", "5", "X-RateLimit-Reset", epoch(600)), nil},
		"GitHub, reset in the past": {dated("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999",
			"X-RateLimit-Reset", epoch(-60)), nil},
		"X's X-Rate-Limit": {dated("X-Rate-Limit-Limit", "900", "X-Rate-Limit-Remaining", "850",
			"X-Rate-Limit-Reset", epoch(840)), []want{{"", 900, 850, 14 * time.Minute, 0, false}}},
		"a small reset is seconds":   {[]string{"X-RateLimit-Remaining", "7", "X-RateLimit-Reset", "20"}, []want{{"", 0, 7, 20 * time.Second, 0, false}}},
		"remaining above the limit":  {dated("X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "11", "X-RateLimit-Reset", epoch(60)), nil},
		"remaining negative":         {dated("X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "-1", "X-RateLimit-Reset", epoch(60)), nil},
		"remaining overflows":        {dated("X-RateLimit-Remaining", "99999999999999999999", "X-RateLimit-Reset", epoch(60)), nil},
		"reset is garbage":           {dated("X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "soon"), nil},
		"reset beyond MaxDelay":      {dated("X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "9999999999999"), nil},
		"limit is garbage":           {dated("X-RateLimit-Limit", "lots", "X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "60"), nil},
		"the older RateLimit fields": {[]string{"RateLimit-Limit", "100", "RateLimit-Remaining", "20", "RateLimit-Reset", "10"}, []want{{"", 100, 20, 10 * time.Second, 0, false}}},

		// The IETF draft: policies, with their quota and window.
		"IETF, one policy of two": {[]string{"RateLimit-Policy", policy, "RateLimit", `"burst";r=50;t=30`},
			[]want{{"burst", 100, 50, 30 * time.Second, time.Minute, false}}},
		"IETF, two policies": {[]string{"RateLimit-Policy", policy, "RateLimit", `"burst";r=50;t=30, "daily";r=900;t=3600`},
			[]want{{"burst", 100, 50, 30 * time.Second, time.Minute, false}, {"daily", 1000, 900, time.Hour, 24 * time.Hour, false}}},
		"IETF, a token for a name":        {[]string{"RateLimit", `default;r=5;t=1`}, []want{{"default", 0, 5, time.Second, 0, false}}},
		"IETF, without a policy":          {[]string{"RateLimit", `"default";r=10;t=5`}, []want{{"default", 0, 10, 5 * time.Second, 0, false}}},
		"IETF, the older dictionary":      {[]string{"RateLimit", "limit=100, remaining=50, reset=30"}, []want{{"", 100, 50, 30 * time.Second, 0, false}}},
		"IETF, garbage":                   {[]string{"RateLimit", `;;,=,"x";r=;t=-3,"y";r=0;t=abc`}, nil},
		"IETF, remaining negative":        {[]string{"RateLimit", `"default";r=-5;t=30`}, nil},
		"IETF, a reset of zero":           {[]string{"RateLimit", `"default";r=5;t=0`}, nil},
		"IETF, remaining above the quota": {[]string{"RateLimit-Policy", `"default";q=10;w=1`, "RateLimit", `"default";r=11;t=1`}, nil},
		// Atlassian's (Jira Cloud, 2026), the draft's fields with a Beta- prefix.
		"Atlassian's Beta- fields": {[]string{"Beta-Ratelimit-Policy", `"tenant-app-quota";q=100100;w=3600`, "Beta-Ratelimit", `"tenant-app-quota";r=17842;t=2107`},
			[]want{{"tenant-app-quota", 100100, 17842, 2107 * time.Second, time.Hour, false}}},
		"Atlassian's Beta- field spent, without its policy": {[]string{"Beta-Ratelimit", `"tenant-app-quota";r=0;t=2788`},
			[]want{{"tenant-app-quota", 0, 0, 2788 * time.Second, 0, false}}},
		// express-rate-limit's draft-7 and draft-8 output, a window of 100 a minute.
		"express-rate-limit, draft 7": {[]string{"RateLimit-Policy", "100;w=60", "RateLimit", "limit=100, remaining=99, reset=60"},
			[]want{{"", 100, 99, time.Minute, time.Minute, false}}},
		"express-rate-limit, draft 8": {[]string{"RateLimit-Policy", `"100-in-1min"; q=100; w=60; pk=:ZDI3ZGQ0N2NjOTQx:`, "RateLimit", `"100-in-1min"; r=99; t=60`},
			[]want{{"100-in-1min", 100, 99, time.Minute, time.Minute, false}}},
		"draft 7, a policy of another quota": {[]string{"RateLimit-Policy", "50;w=1", "RateLimit", "limit=100, remaining=99, reset=60"},
			[]want{{"", 100, 99, time.Minute, 0, false}}},

		// OpenAI: requests and tokens, resets as durations, quotas that refill.
		"OpenAI": {[]string{"x-ratelimit-limit-requests", "10000", "x-ratelimit-remaining-requests", "9999", "x-ratelimit-reset-requests", "6ms",
			"x-ratelimit-limit-tokens", "2000000", "x-ratelimit-remaining-tokens", "1999976", "x-ratelimit-reset-tokens", "0s"},
			[]want{{"requests", 10000, 9999, 6 * time.Millisecond, time.Minute, true}}}, // a reset of 0s says nothing
		"OpenAI, minutes": {[]string{"x-ratelimit-limit-tokens", "40000", "x-ratelimit-remaining-tokens", "18000", "x-ratelimit-reset-tokens", "6m0s"},
			[]want{{"tokens", 40000, 18000, 6 * time.Minute, time.Minute, true}}},
		"OpenAI, a limit of -1 is not reported": {[]string{"x-ratelimit-limit-requests", "-1", "x-ratelimit-remaining-requests", "40", "x-ratelimit-reset-requests", "1h2m3.5s"},
			[]want{{"requests", 0, 40, time.Hour + 2*time.Minute + 3500*time.Millisecond, time.Minute, true}}},
		"OpenAI, a limit beyond any count is not reported": {[]string{"x-ratelimit-limit-requests", "9007199254740993", "x-ratelimit-remaining-requests", "40", "x-ratelimit-reset-requests", "1s"},
			[]want{{"requests", 0, 40, time.Second, time.Minute, true}}},
		"OpenAI, a reset that is not a duration": {[]string{"x-ratelimit-remaining-requests", "40", "x-ratelimit-reset-requests", "tomorrow"}, nil},
		"OpenAI, remaining negative":             {[]string{"x-ratelimit-remaining-tokens", "-5", "x-ratelimit-reset-tokens", "1s"}, nil},

		// Anthropic: four quotas, resets as RFC 3339 times.
		"Anthropic requests": {dated("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "49",
			"anthropic-ratelimit-requests-reset", at(10)), []want{{"requests", 50, 49, 10 * time.Second, time.Minute, true}}},
		"Anthropic, tokens rounded to thousands": {dated("anthropic-ratelimit-tokens-limit", "80000", "anthropic-ratelimit-tokens-remaining", "79000",
			"anthropic-ratelimit-tokens-reset", at(1)), []want{{"tokens", 80000, 79000, time.Second, time.Minute, true}}},
		"Anthropic input and output": {dated("anthropic-ratelimit-input-tokens-limit", "40000", "anthropic-ratelimit-input-tokens-remaining", "38000",
			"anthropic-ratelimit-input-tokens-reset", at(3), "anthropic-ratelimit-output-tokens-limit", "8000",
			"anthropic-ratelimit-output-tokens-remaining", "7000", "anthropic-ratelimit-output-tokens-reset", at(8)),
			[]want{{"input-tokens", 40000, 38000, 3 * time.Second, time.Minute, true}, {"output-tokens", 8000, 7000, 8 * time.Second, time.Minute, true}}},
		"Anthropic, a reset that is not RFC 3339": {dated("anthropic-ratelimit-requests-remaining", "49", "anthropic-ratelimit-requests-reset", "12s"), nil},
		"Anthropic, remaining above the limit": {dated("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "51",
			"anthropic-ratelimit-requests-reset", at(10)), nil},

		// Several dialects at once.
		"of two readings of one quota, the one with fewer left": {[]string{"X-RateLimit-Remaining", "9", "X-RateLimit-Reset", "30",
			"RateLimit", "limit=100, remaining=5, reset=20"}, []want{{"", 100, 5, 20 * time.Second, 0, false}}},
		"no headers": {nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			var got []want
			for _, r := range ParseReadings(response(200, tc.header...), holdNow) {
				got = append(got, want{r.Name, r.Limit, r.Remaining, r.Reset, r.Window, r.Refills})
				if r.Header == "" {
					t.Errorf("reading %+v does not say which header said so", r)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("readings %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRoundedResets: a reset said in whole seconds is rounded up, and may
// come up to a second sooner (Early), two against a Date off the arrival
// (the Date is a second late at most); a second away or less (two against
// the Date), it may be a token bucket's time until it is full (an API
// gateway says `x-ratelimit-reset: 1` of a bucket that refills in 5 ms):
// such a reading is Rounded. A reset said to the millisecond, or of a
// quota that refills, is neither.
func TestRoundedResets(t *testing.T) {
	for name, tc := range map[string]struct {
		header  []string
		early   time.Duration
		rounded bool
	}{
		"a gateway's, a second":     {[]string{"X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1"}, time.Second, true},
		"IETF, t=1":                 {[]string{"RateLimit-Policy", `"default";q=1;w=1`, "RateLimit", `"default";r=0;t=1`}, time.Second, true},
		"IETF dictionary, reset=1":  {[]string{"RateLimit", "limit=10, remaining=0, reset=1"}, time.Second, true},
		"GitHub's, the next second": {dated("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(1)), time.Second, true},
		"IETF, t=2":                 {[]string{"RateLimit", `"default";r=0;t=2`}, time.Second, false},
		"GitHub's, in two seconds":  {dated("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(2)), time.Second, false},
		"GitHub's, in an hour":      {dated("X-RateLimit-Remaining", "4999", "X-RateLimit-Reset", epoch(3600)), time.Second, false},
		// Against a Date an hour off (taken for the upstream's clock), which
		// says the second the upstream answered in: up to a second late.
		"GitHub's, two seconds after the Date":   {offDate("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", offEpoch(2)), 2 * time.Second, true},
		"GitHub's, three seconds after the Date": {offDate("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", offEpoch(3)), 2 * time.Second, false},
		"half a second, as decimals":             {[]string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "0.5"}, 0, false},
		"a Unix time with decimals":              {dated("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(0)+".5"), 0, false},
		"OpenAI's, which refills":                {[]string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s"}, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			readings := ParseReadings(response(200, tc.header...), holdNow)
			if len(readings) != 1 || readings[0].Early != tc.early || readings[0].Rounded() != tc.rounded {
				t.Errorf("readings %+v, want one, Early %v, Rounded %v", readings, tc.early, tc.rounded)
			}
		})
	}
}

// TestRoundedUnixTimes: a Unix time is rounded up to the upstream's next
// second, so a reset said in one may come a second sooner: at 0.7 s past
// a second, one said for the next second but one (1.3 s away) may be 0.3 s
// away, a token bucket's that is full in a moment, and is Rounded; it
// still holds the key at nothing left (it may be a window's: see
// bucketLevel in package pace). One 2.3 s away is not Rounded.
func TestRoundedUnixTimes(t *testing.T) {
	now := holdNow.Add(700 * time.Millisecond)
	for reset, rounded := range map[int64]bool{1: true, 2: true, 3: false} {
		w := Hear(response(200, dated("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(reset))...), now, time.Hour)
		if len(w.Readings) != 1 || w.Readings[0].Rounded() != rounded || w.Readings[0].Early != time.Second {
			t.Errorf("reset at %d s: readings %+v, want one, Early 1s, Rounded %v", reset, w.Readings, rounded)
		}
		if held := len(w.Holds) == 1; held != (reset > 1) {
			t.Errorf("reset at %d s: holds %+v, want one: %v", reset, w.Holds, reset > 1)
		}
	}
}

// TestDatedResets: a reset said as a Unix time is Dated, one instant in
// every response of its window; one said in seconds from now is not.
func TestDatedResets(t *testing.T) {
	for name, tc := range map[string]struct {
		header []string
		dated  bool
	}{
		"GitHub's Unix time":            {dated("X-RateLimit-Remaining", "10", "X-RateLimit-Reset", epoch(30)), true},
		"a Unix time with decimals":     {dated("X-RateLimit-Remaining", "10", "X-RateLimit-Reset", epoch(30)+".25"), true},
		"seconds from now":              {[]string{"X-RateLimit-Remaining", "10", "X-RateLimit-Reset", "30"}, false},
		"the IETF draft's t":            {[]string{"RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=10;t=30`}, false},
		"OpenAI's time until full":      {[]string{"x-ratelimit-remaining-requests", "10", "x-ratelimit-reset-requests", "30s"}, false},
		"the IETF draft's older fields": {[]string{"RateLimit", "limit=100, remaining=10, reset=30"}, false},
	} {
		readings := ParseReadings(response(200, tc.header...), holdNow)
		if len(readings) != 1 || readings[0].Dated != tc.dated {
			t.Errorf("%s: readings %+v, want one, Dated %v", name, readings, tc.dated)
		}
	}
}

// offDate adds a Date header an hour behind holdNow to headers, and
// offEpoch is a Unix time s seconds after that Date.
func offDate(header ...string) []string {
	return append([]string{"Date", holdNow.Add(-time.Hour).UTC().Format(http.TimeFormat)}, header...)
}

func offEpoch(s int64) string { return epoch(s - 3600) }

// FuzzParseReadings: whatever the headers, ParseReadings never panics, and
// every reading it returns is sound: units left not below zero nor above the
// limit, a reset ahead and within MaxDelay.
func FuzzParseReadings(f *testing.F) {
	f.Add("4999", epoch(600), "5000", "1", `"burst";r=50;t=30`, `"burst";q=100;w=60`, "6m0s", at(10))
	f.Add("0", "20", "-1", "", "limit=100, remaining=0, reset=50", "", "12ms", "garbage")
	f.Fuzz(func(t *testing.T, remaining, reset, limit, used, rateLimit, policy, duration, rfc3339 string) {
		resp := response(200, "Date", holdNow.UTC().Format(http.TimeFormat),
			"X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset, "X-RateLimit-Limit", limit, "X-RateLimit-Used", used,
			"RateLimit", rateLimit, "RateLimit-Policy", policy, "RateLimit-Remaining", remaining, "RateLimit-Reset", reset,
			"Beta-RateLimit", rateLimit, "Beta-RateLimit-Policy", remaining+";w="+reset,
			"x-ratelimit-remaining-tokens", remaining, "x-ratelimit-reset-tokens", duration, "x-ratelimit-limit-tokens", limit,
			"anthropic-ratelimit-requests-remaining", remaining, "anthropic-ratelimit-requests-reset", rfc3339)
		for _, r := range ParseReadings(resp, holdNow) {
			if r.Remaining < 0 || (r.Limit > 0 && r.Remaining > r.Limit) || r.Limit < 0 || r.Reset <= 0 || r.Reset > store.MaxDelay || r.Window < 0 ||
				(r.Early != 0 && (r.Refills || (r.Early != time.Second && r.Early != 2*time.Second))) || (r.Rounded() && r.Reset >= r.Early+time.Second) {
				t.Fatalf("unsound reading %+v", r)
			}
		}
	})
}
