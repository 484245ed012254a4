package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetpace/pace/internal/store"
	"github.com/fleetpace/pace/lua"
)

// mustZone loads a zone of the IANA database, or fails the test.
func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

// TestDailyResetsAtLocalMidnight: on a clock set to each hour of the days
// around Los Angeles's changes of 2026, a Daily's window is the day that
// holds it, from local midnight to the next: 23 hours on 8 March, 25 on 1
// November, 24 on the others.
func TestDailyResetsAtLocalMidnight(t *testing.T) {
	la := mustZone(t, "America/Los_Angeles")
	l := Daily(10000, la)
	long := map[string]time.Duration{"2026-03-08": 23 * time.Hour, "2026-11-01": 25 * time.Hour}
	for _, first := range []string{"2026-03-05", "2026-10-29"} {
		day, _ := time.ParseInLocation(time.DateOnly, first, la)
		for range 6 {
			date := day.Format(time.DateOnly)
			want := long[date]
			if want == 0 {
				want = 24 * time.Hour
			}
			for at := day; at.Format(time.DateOnly) == date; at = at.Add(time.Hour) {
				start, end := l.Window(at)
				if !start.Equal(day) || end.Sub(start) != want {
					t.Errorf("at %v: window %v to %v (%v), want from %v for %v", at, start.In(la), end.In(la), end.Sub(start), day, want)
				}
			}
			day = day.Add(want)
		}
	}
}

// TestMonthlyResetsOnTheFirst: a Monthly's window runs from midnight of
// the first of each month of 2026 (in Los Angeles, whose March and
// November lose and gain an hour) and of February 2028 (29 days) to the
// first of the next.
func TestMonthlyResetsOnTheFirst(t *testing.T) {
	for _, zone := range []string{"America/Los_Angeles", "UTC", "Asia/Kolkata"} {
		loc := mustZone(t, zone)
		l := Monthly(100, loc)
		months := []time.Time{time.Date(2028, time.February, 1, 0, 0, 0, 0, loc)}
		for m := time.January; m <= time.December; m++ {
			months = append(months, time.Date(2026, m, 1, 0, 0, 0, 0, loc))
		}
		for _, first := range months {
			next := time.Date(first.Year(), first.Month()+1, 1, 0, 0, 0, 0, loc)
			for _, at := range []time.Time{first, first.Add(36 * time.Hour), next.Add(-time.Microsecond)} {
				if start, end := l.Window(at); !start.Equal(first) || !end.Equal(next) {
					t.Errorf("%s: at %v: window %v to %v, want %v to %v", zone, at, start, end, first, next)
				}
			}
			days := int(next.Sub(first).Round(24*time.Hour) / (24 * time.Hour))
			if want := daysIn(first.Month(), first.Year()); days != want {
				t.Errorf("%s: %v lasts %d days, want %d", zone, first, days, want)
			}
		}
	}
}

// daysIn is the length of month m of year y in days.
func daysIn(m time.Month, y int) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// TestDailyHoldsEveryInstantOfItsDay: through all of 2026, every quarter
// hour of zones whose changes skip midnight (Santiago), move by half an
// hour (Lord Howe), sit at odd offsets (Chatham, Kolkata) or never change
// (UTC) lies in the window of its own local date, which starts at the
// first instant of that date and ends where the next date's starts.
func TestDailyHoldsEveryInstantOfItsDay(t *testing.T) {
	for _, zone := range []string{"America/Santiago", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kolkata", "UTC", "America/Los_Angeles"} {
		loc := mustZone(t, zone)
		l := Daily(1, loc)
		bad := 0
		for at := time.Date(2026, 1, 1, 0, 0, 0, 0, loc); at.Year() == 2026 && bad < 3; at = at.Add(15 * time.Minute) {
			start, end := l.Window(at)
			first := start.Add(-time.Nanosecond)
			if at.Before(start) || !at.Before(end) || start.In(loc).Format(time.DateOnly) != at.In(loc).Format(time.DateOnly) ||
				first.In(loc).Format(time.DateOnly) == at.In(loc).Format(time.DateOnly) || end.In(loc).Format(time.DateOnly) == at.In(loc).Format(time.DateOnly) {
				t.Errorf("%s: at %v: window %v to %v", zone, at.In(loc), start.In(loc), end.In(loc))
				bad++
			}
		}
	}
}

// windowAtScript runs lua/common.lua's window_at on Redis: ARGV[1] the
// windows, ARGV[2] a time.
var windowAtScript = redis.NewScript("local horizon, max_refill = 0, 0\n" + mustPart("common") +
	"local start, finish, field = window_at(ARGV[1], tonumber(ARGV[2]))\nreturn {start or -1, finish or -1, tonumber(field) or -1}\n")

func mustPart(name string) string {
	text, err := lua.FS.ReadFile(name + ".lua")
	if err != nil {
		panic(err)
	}
	return string(text)
}

// TestCalendarWindowsInLua: the windows a limiter tells the scripts, on a
// clock set to each hour around Los Angeles's changes, month ends and a
// day skipped at midnight in Santiago, put each hour in the window that
// Window gives, under the field of its start; a time outside them has none.
func TestCalendarWindowsInLua(t *testing.T) {
	ctx := context.Background()
	c := scriptRedis(t)
	cases := []struct {
		limit Limit
		from  string
	}{
		{Daily(5, mustZone(t, "America/Los_Angeles")), "2026-03-07T00:30:00-08:00"},
		{Daily(5, mustZone(t, "America/Los_Angeles")), "2026-10-31T00:30:00-07:00"},
		{Daily(5, mustZone(t, "America/Santiago")), "2026-09-05T00:30:00-04:00"},
		{Monthly(5, mustZone(t, "America/Los_Angeles")), "2026-02-27T12:00:00-08:00"},
	}
	for _, tc := range cases {
		from, err := time.Parse(time.RFC3339, tc.from)
		if err != nil {
			t.Fatal(err)
		}
		windows := &calendarWindows{cal: tc.limit.cal}
		for at := from; at.Before(from.Add(72 * time.Hour)); at = at.Add(time.Hour) {
			text := windows.text(at)
			reply, err := windowAtScript.Run(ctx, c, nil, text, at.UnixMicro()).Int64Slice()
			if err != nil {
				t.Fatalf("%s at %v: %v", tc.limit, at, err)
			}
			start, end := tc.limit.Window(at)
			if reply[0] != start.UnixMicro() || reply[1] != end.UnixMicro() || reply[2] != start.UnixMicro() {
				t.Errorf("%s at %v: the script found %v, want %d, %d, %d", tc.limit, at, reply, start.UnixMicro(), end.UnixMicro(), start.UnixMicro())
			}
			bounds := strings.Split(text, ",")
			if len(bounds) != windowsAhead+3 {
				t.Errorf("%d windows told, want %d", len(bounds), windowsAhead+3)
			}
			last, _ := strconv.ParseInt(bounds[len(bounds)-1], 10, 64)
			if reply, _ := windowAtScript.Run(ctx, c, nil, text, last).Int64Slice(); len(reply) != 3 || reply[0] != -1 {
				t.Errorf("%s: the end of the windows told is in a window: %v", tc.limit, reply)
			}
		}
	}
}

// TestParseCalendarLimit: the calendar windows ParseLimit reads, each
// written back as it was read, and the text it refuses, named.
func TestParseCalendarLimit(t *testing.T) {
	for text, want := range map[string]Limit{
		"10000/day in America/Los_Angeles": Daily(10000, mustZone(t, "America/Los_Angeles")),
		"500/month in Europe/Berlin":       Monthly(500, mustZone(t, "Europe/Berlin")),
		"50000/month":                      Monthly(50000, time.UTC),
		"1/day in UTC":                     Daily(1, time.UTC),
		"1500 per day in Asia/Kolkata":     Daily(1500, mustZone(t, "Asia/Kolkata")),
		"50000 per month":                  Monthly(50000, time.UTC),
	} {
		l, err := ParseLimit(text)
		if err != nil {
			t.Errorf("ParseLimit(%q): %v", text, err)
			continue
		}
		if l.String() != want.String() || l.Zone().String() != want.Zone().String() || l.Burst() != want.Burst() {
			t.Errorf("ParseLimit(%q) = %v, want %v", text, l, want)
		}
		if again, err := ParseLimit(l.String()); err != nil || again.String() != l.String() {
			t.Errorf("ParseLimit(%q) = %v, %v: the text of %q does not read back", l.String(), again, err, text)
		}
	}
	for text, why := range map[string]string{
		"10/day in Mars/Olympus":       `zone "Mars/Olympus"`,
		"10/day in":                    "then nothing or in ZONE",
		"10/day burst 5":               "then nothing or in ZONE",
		"1.5/day":                      `count "1.5"`,
		"0/month":                      "count 0",
		"-3/day in UTC":                "count -3",
		"10/month in ../../etc/passwd": `zone "../../etc/passwd"`,
	} {
		if _, err := ParseLimit(text); err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), strconv.Quote(text)) {
			t.Errorf("ParseLimit(%q): %v, want an error that quotes it and says %s", text, err, why)
		}
	}
	if err := Daily(5, nil).Validate(); err == nil || !strings.Contains(err.Error(), "zone") {
		t.Errorf("Daily(5, nil).Validate() = %v, want an error that asks for a zone", err)
	}
}

// TestDailyWaitsForMidnight: on Redis, a Daily key whose day is spent
// books the next request at the next midnight in its zone (its deadline
// refused, the DeadlineError says so), alone and beside a bucket; a request
// given back frees its place in that day.
func TestDailyWaitsForMidnight(t *testing.T) {
	c := newTestRedis(t)
	for _, zone := range []string{"America/Los_Angeles", "Asia/Kolkata", "Pacific/Chatham"} {
		loc := mustZone(t, zone)
		for _, q := range []Quota{Daily(2, loc), AllOf(PerSecond(100), Daily(2, loc).Named("day"))} {
			r := mustRedis(t, c, q, WithFleetSize(1))
			key := fmt.Sprintf("%s %v", zone, q)
			for range 2 {
				if err := r.Wait(context.Background(), key, 1); err != nil {
					t.Fatalf("%v: %v", q, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := r.Wait(ctx, key, 1)
			cancel()
			_, midnight := Daily(1, loc).Window(time.Now())
			var deadline *DeadlineError
			if !errors.As(err, &deadline) {
				t.Fatalf("%v: the third request: %v, want a DeadlineError", q, err)
			}
			if off := time.Until(midnight) - deadline.Delay; off < -time.Second || off > time.Second {
				t.Errorf("%v: a spent day's wait %v, want to the next midnight in %s, %v away", q, deadline.Delay, zone, time.Until(midnight))
			}
		}
	}
}

// TestDailyGivesBackAndRepays: on Redis, a request booked into tomorrow and
// given back leaves tomorrow's count as it was; a debt fills today and
// counts the rest tomorrow, whose first request then waits for midnight.
func TestDailyGivesBackAndRepays(t *testing.T) {
	ctx := context.Background()
	c := newTestRedis(t)
	loc := mustZone(t, "America/Los_Angeles")
	r := mustRedis(t, c, Daily(100, loc), WithFleetSize(1), sharedOnly)
	_, midnight := Daily(1, loc).Window(time.Now())
	took, err := storeOf(r).Repay(ctx, "k", store.LimitCosts{150}, 0, 1)
	if err != nil || took[0] != 150 {
		t.Fatalf("a debt of 150: took %v, %v; want 100 today and 50 tomorrow", took, err)
	}
	b, err := storeOf(r).Reserve(ctx, store.Request{Key: "k", Costs: uniform(50, store.MaxLimits)}, time.Hour*48, 0)
	if err != nil {
		t.Fatal(err)
	}
	if off := time.Until(midnight) - b.Delay; off < -time.Second || off > time.Second {
		t.Errorf("after the debt, 50 wait %v, want to midnight, %v away", b.Delay, time.Until(midnight))
	}
	if _, _, err := storeOf(r).Refund(ctx, "k", b); err != nil {
		t.Fatal(err)
	}
	counts, err := c.HGetAll(ctx, "pace:{k}:"+Daily(100, loc).String()).Result()
	if err != nil {
		t.Fatal(err)
	}
	tomorrow := strconv.FormatInt(midnight.UnixMicro(), 10)
	if counts[tomorrow] != "50" {
		t.Errorf("tomorrow's count after the booking went back: %v (fields %v), want 50", counts[tomorrow], counts)
	}
}
