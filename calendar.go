package pace

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Daily returns a quota of n events a calendar day in loc: its windows
// start at midnight in loc, so a day of a change to or from daylight saving
// time is 23 or 25 hours long, as Google's "per day, reset at midnight
// Pacific time" quotas count. A request that finds its day full waits for
// the next one. A Local counts it in its process; while Redis fails, a Redis
// limiter paces it as a token bucket of its share of n a day.
func Daily(n int, loc *time.Location) Limit {
	return calendarLimit(n, calendar{unit: day, loc: loc})
}

// Monthly returns a quota of n events a calendar month in loc: its windows
// start at midnight of the first day of each month in loc, whatever the
// month's length, as a monthly plan counts. It is kept as Daily is.
func Monthly(n int, loc *time.Location) Limit {
	return calendarLimit(n, calendar{unit: month, loc: loc})
}

// calendarLimit is a fixed window of n whose windows are c's days or
// months. Its period is the longest of them (a month of 31 days and a
// changed hour), so that a token bucket made of it (asBucket) never allows
// more than n in one of them.
func calendarLimit(n int, c calendar) Limit {
	period := 25 * time.Hour
	if c.unit == month {
		period = 31*24*time.Hour + time.Hour
	}
	return Limit{count: float64(n), period: period, burst: n, kind: fixedWindow, cal: c}
}

// calendarUnit is what a calendar window lasts: a day or a month.
type calendarUnit uint8

const (
	notCalendar calendarUnit = iota // a window of a fixed length, or not a window
	day
	month
)

// calendarNames are the units as ParseLimit reads them.
var calendarNames = [...]string{day: "day", month: "month"}

// calendar is the windows of a Daily or Monthly limit: days or months in a
// zone.
type calendar struct {
	unit calendarUnit
	loc  *time.Location
}

// start is the start of c's window that holds t.
func (c calendar) start(t time.Time) time.Time {
	y, m, d := t.In(c.loc).Date()
	if c.unit == month {
		d = 1
	}
	return c.midnight(y, m, d)
}

// next is the start of c's window after the one that starts at start.
func (c calendar) next(start time.Time) time.Time {
	y, m, d := start.In(c.loc).Date()
	if c.unit == month {
		return c.midnight(y, m+1, 1)
	}
	return c.midnight(y, m, d+1)
}

// midnight is the first instant of day d of month m of year y in c's zone
// (normalised as time.Date does: the 32nd of January is the 1st of
// February). Where a change of zone skips midnight, the day starts at the
// change.
func (c calendar) midnight(y int, m time.Month, d int) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if got := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC); got.Before(want) {
		_, t = t.ZoneBounds() // the time fell on the day before, in the zone the change ended
	}
	return t
}

// calendarWindows is the windows of a calendar as the scripts take them,
// kept for the window they were made in (see text).
type calendarWindows struct {
	cal    calendar
	latest atomic.Pointer[calendarSpan]
}

// calendarSpan is the text of the windows around a calendar's window that
// starts at from and ends at until.
type calendarSpan struct {
	from, until time.Time
	text        string
}

// windowsAhead is how many windows after the current one the scripts are
// told of: a request books at most so far ahead.
const windowsAhead = 6

// text is the starts of c's windows around now, in microseconds of the Unix
// epoch, comma-separated: the window before now's, now's and windowsAhead
// after, then the end of the last (see window_at in lua/common.lua). The
// one before lets Redis's clock lag behind the process's by up to a
// window.
func (w *calendarWindows) text(now time.Time) string {
	if s := w.latest.Load(); s != nil && !now.Before(s.from) && now.Before(s.until) {
		return s.text
	}
	start := w.cal.start(now)
	t := w.cal.start(start.Add(-time.Nanosecond))
	var text strings.Builder
	for i := 0; i < windowsAhead+3; i++ {
		if i > 0 {
			text.WriteByte(',')
		}
		text.WriteString(strconv.FormatInt(t.UnixMicro(), 10))
		t = w.cal.next(t)
	}
	s := &calendarSpan{from: start, until: w.cal.next(start), text: text.String()}
	w.latest.Store(s)
	return s.text
}

// Window returns the window of a fixed window limit (FixedWindow, Daily,
// Monthly) that holds t: when it starts and when the next starts, which is
// when its count resets. For other limits it returns zero times.
func (l Limit) Window(t time.Time) (start, end time.Time) {
	switch {
	case l.kind != fixedWindow:
		return time.Time{}, time.Time{}
	case l.cal.unit != notCalendar:
		start = l.cal.start(t)
		return start, l.cal.next(start)
	}
	us, period := t.UnixMicro(), l.period.Microseconds()
	start = time.UnixMicro(us - us%period)
	return start, start.Add(l.period)
}

// Zone returns the zone whose calendar a Daily or Monthly limit counts
// in; nil for other limits.
func (l Limit) Zone() *time.Location { return l.cal.loc }

// calendarText is the text of a calendar limit after its count, such as
// "/day in America/Los_Angeles".
func (c calendar) calendarText() string {
	return "/" + calendarNames[c.unit] + " in " + c.loc.String()
}

// isCalendar reports whether a limit's fields are a calendar window's:
// COUNT/day or COUNT/month, then anything.
func isCalendar(fields []string) bool {
	if len(fields) == 0 {
		return false
	}
	_, unit, _ := strings.Cut(fields[0], "/")
	return calendarUnitOf(unit) != notCalendar
}

// parseCalendar reads a calendar window's fields: COUNT/day or
// COUNT/month, then nothing or "in ZONE".
func parseCalendar(fields []string, bad func(string) (Limit, error)) (Limit, error) {
	countText, unitText, _ := strings.Cut(fields[0], "/")
	unit := calendarUnitOf(unitText)
	count, err := strconv.Atoi(countText)
	if err != nil {
		return bad("a calendar window's count " + strconv.Quote(countText) + " is not a whole number")
	}
	loc := time.UTC
	switch {
	case len(fields) == 3 && fields[1] == "in":
		if loc, err = time.LoadLocation(fields[2]); err != nil || fields[2] == "" {
			return bad(fmt.Sprintf("zone %q is not a zone of the IANA database, such as America/Los_Angeles", fields[2]))
		}
	case len(fields) != 1:
		return bad("want COUNT/" + calendarNames[unit] + ", then nothing or in ZONE")
	}
	l := calendarLimit(count, calendar{unit: unit, loc: loc})
	if why := l.problem(); why != "" {
		return bad(why)
	}
	return l, nil
}

// calendarUnitOf is the calendar unit a limit's period text names, or
// notCalendar.
func calendarUnitOf(period string) calendarUnit {
	for u, name := range calendarNames {
		if name != "" && name == period {
			return calendarUnit(u)
		}
	}
	return notCalendar
}
