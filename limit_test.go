package pace

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseLimit(t *testing.T) {
	for text, want := range map[string]struct {
		rate     float64
		burst    int
		interval int64 // µs per token in Redis
		str      string
	}{
		"100/s":           {100, 100, 10_000, "100/s"},
		"5000/h":          {5000.0 / 3600, 5000, 720_000, "5000/h"},
		"10/s burst 20":   {10, 20, 100_000, "10/s burst 20"},
		"  10/s  burst 1": {10, 1, 100_000, "10/s burst 1"},
		"900/15m":         {1, 900, 1_000_000, "900/15m"},
		"10/2h":           {10.0 / 7200, 10, 720_000_000, "10/2h"},
		"3/1h30m":         {3.0 / 5400, 3, 1_800_000_000, "3/1h30m"},
		"2/1m30s":         {2.0 / 90, 2, 45_000_000, "2/1m30s"},
		"100/m":           {100.0 / 60, 100, 600_000, "100/m"},
		"3/s":             {3, 3, 333_334, "3/s"},
		"1/500ms":         {2, 1, 500_000, "1/500ms"},
		"0.5/s":           {0.5, 1, 2_000_000, "0.5/s"},
		"86400/d":         {1, 86400, 1_000_000, "86400/d"},
		"1e6/s burst 5":   {1e6, 5, 1, "1e+06/s burst 5"},
		// the slowest rate, a token a year, to the microsecond
		"1/8760h": {1.0 / (365 * 24 * 3600), 1, 31_536_000_000_000, "1/8760h"},
		// a count above 2^31 keeps its burst
		"3000000000/d": {3e9 / 86400, 3_000_000_000, 29, "3e+09/d"},
		// a bucket that learns the upstream's limit
		// The spellings users write: words, plurals, "per", spaces, a number of a unit.
		"100/minute":             {100.0 / 60, 100, 600_000, "100/m"},
		"100/min":                {100.0 / 60, 100, 600_000, "100/m"},
		"100 per minute":         {100.0 / 60, 100, 600_000, "100/m"},
		"100 / mins":             {100.0 / 60, 100, 600_000, "100/m"},
		"5000/hour":              {5000.0 / 3600, 5000, 720_000, "5000/h"},
		"5000/hr burst 10":       {5000.0 / 3600, 10, 720_000, "5000/h burst 10"},
		"5000 per hours":         {5000.0 / 3600, 5000, 720_000, "5000/h"},
		"3/sec":                  {3, 3, 333_334, "3/s"},
		"3/seconds":              {3, 3, 333_334, "3/s"},
		"100 per 15 minutes":     {100.0 / 900, 100, 9_000_000, "100/15m"},
		"100/15 minutes":         {100.0 / 900, 100, 9_000_000, "100/15m"},
		"100/15min sliding":      {100.0 / 900, 100, 9_000_000, "100/15m sliding"},
		"2/1.5h":                 {2.0 / 5400, 2, 2_700_000_000, "2/1h30m"},
		"1 per 500 milliseconds": {2, 1, 500_000, "1/500ms"},
		"86400/days":             {1, 86400, 1_000_000, "86400/d"},
		"10/s learn":             {10, 10, 100_000, "10/s learn"},
		"10/s burst 20 learn":    {10, 20, 100_000, "10/s burst 20 learn"},
		"10/s learn 1..500":      {10, 10, 100_000, "10/s learn 1..500"},
		"5000/h learn 50..5000":  {5000.0 / 3600, 5000, 720_000, "5000/h learn 50..5000"},
	} {
		l, err := ParseLimit(text)
		if err != nil {
			t.Errorf("ParseLimit(%q): %v", text, err)
			continue
		}
		if diff := l.Rate() - want.rate; diff > 1e-9 || diff < -1e-9 || l.Burst() != want.burst || l.intervalMicros() != want.interval || l.String() != want.str {
			t.Errorf("ParseLimit(%q) = rate %v burst %d interval %dµs %q; want %v %d %dµs %q",
				text, l.Rate(), l.Burst(), l.intervalMicros(), l, want.rate, want.burst, want.interval, want.str)
		}
		if again, err := ParseLimit(l.String()); err != nil || again != l {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v back", l.String(), again, err, l)
		}
	}
}

func TestParseLimitRejects(t *testing.T) {
	for _, text := range []string{
		"", "100", "100/", "/s", "abc/s", "100/x", "100/-5s", "10/s burst", "10/s burst x",
		"10/s bust 20", "10/s burst 20 more", "-5/s", "0/s", "NaN/s", "Inf/s", "10/s burst 0",
		"10/s burst -1", "10 // s", "2000000/s", "1/0s", "learn", "10/s learn learn", "100/m sliding learn",
		"100/m fixed learn", "10/s learn burst 20",
		// learning bounds that cannot be: the count outside them, garbage, a ceiling above 10^6/s,
		// a floor at which the burst would take more than a year to refill
		"10/s learn 20..30", "10/s learn 1..5", "10/s learn 1..", "10/s learn x..y", "10/s learn 0..10", "10/s learn 5",
		"10/s learn 1..2000000", "10/s burst 1000 learn 0.00001..10", "10/s learn NaN..10",
		// spellings of a period that are none
		"100 per", "100 per per minute", "100/1e400 minutes", "100/0 minutes", "100/-2 minutes", "100/15 minutes burst", "100/15 parsecs",
	} {
		_, err := ParseLimit(text)
		if err == nil {
			t.Errorf("ParseLimit(%q) accepted it", text)
			continue
		}
		if !strings.Contains(err.Error(), strconv.Quote(text)) {
			t.Errorf("ParseLimit(%q): %q does not quote the input", text, err)
		}
	}
	for _, text := range []string{"100/fortnight", "100 per blink", "100/15parsecs", "100/minutely"} {
		if _, err := ParseLimit(text); err == nil || !containsAll(err.Error(), strconv.Quote(text), "second", "minute", "hour", "day", "15 minutes", "500ms") {
			t.Errorf("ParseLimit(%q): %v; want an error that lists the periods it reads", text, err)
		}
	}
}

func TestLimitConstructors(t *testing.T) {
	for _, tc := range []struct {
		limit Limit
		str   string
	}{
		{PerSecond(100), "100/s"},
		{PerMinute(60).WithBurst(5), "60/m burst 5"},
		{PerHour(5000), "5000/h"},
		{Per(900, 15*time.Minute), "900/15m"},
		{Every(250 * time.Millisecond), "1/250ms"},
		{Every(time.Second).WithBurst(3), "1/s burst 3"},
	} {
		if err := tc.limit.Validate(); err != nil {
			t.Errorf("%s: %v", tc.str, err)
		}
		if got := tc.limit.String(); got != tc.str {
			t.Errorf("String() = %q, want %q", got, tc.str)
		}
	}
}

func TestLimitText(t *testing.T) {
	var config struct{ Limit Limit }
	if err := json.Unmarshal([]byte(`{"Limit": "10/s burst 20"}`), &config); err != nil {
		t.Fatal(err)
	}
	if config.Limit != PerSecond(10).WithBurst(20) {
		t.Errorf("unmarshalled %v", config.Limit)
	}
	out, err := json.Marshal(config)
	if err != nil || string(out) != `{"Limit":"10/s burst 20"}` {
		t.Errorf("marshalled %s, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"Limit": "fast"}`), &config); err == nil || !strings.Contains(err.Error(), `"fast"`) {
		t.Errorf("unmarshalling \"fast\": %v", err)
	}
}

// FuzzParseLimit: whatever the text, ParseLimit never panics; what it
// accepts is a valid limit whose String reads back as itself, and what it
// refuses is an error that quotes the text.
func FuzzParseLimit(f *testing.F) {
	for _, seed := range []string{"100/s", "100 per 15 minutes", "5000/hr burst 10", "2/1.5h", "900/15m sliding",
		"10/s learn 1..500", "10 in flight", "1500 per day in Asia/Kolkata", "1/0.0000001ms", "1e308/1e308 hours", "100/ 15 min"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		l, err := ParseLimit(text)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(text)) {
				t.Errorf("ParseLimit(%q): %q does not quote the input", text, err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Errorf("ParseLimit(%q) = %v, which Validate refuses: %v", text, l, err)
		}
		if again, err := ParseLimit(l.String()); err != nil || again.String() != l.String() {
			t.Errorf("ParseLimit(%q) = %v, whose text reads back as %v, %v", text, l, again, err)
		}
	})
}
