package pace

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// A Limit is a token bucket: count events per period on average, with bursts
// of up to burst events; or, made by Window or FixedWindow, a window quota of
// count events per period. The zero Limit is invalid: limiters refuse it.
//
// A Limit is a plain value, safe to copy and to share between goroutines.
type Limit struct {
	count  float64
	period time.Duration
	burst  int // for windows, count: the most one request may take
	kind   limitKind
	name   string   // names the limit's Redis key; its String when empty
	learn  learning // adopts the limit the upstream advertises (see Learn)
	cal    calendar // a Daily or Monthly window's days or months
}

// limitKind says how a Limit counts.
type limitKind uint8

const (
	bucket        limitKind = iota // a token bucket
	slidingWindow                  // count per period, in every period wherever it starts
	fixedWindow                    // count per period, in periods aligned to the clock
	concurrent                     // count requests in flight at once
)

// Window returns a sliding window quota: in no period of length per,
// wherever it starts, are more than n events granted. It is safe against an
// upstream that counts in fixed windows whose alignment the client does not
// know. It needs Redis (a Redis limiter), which keeps the times of the last n
// grants of each key, for one window: 40 to 120 bytes each (measured with
// MEMORY USAGE: 4.2 KB for 100, 118 KB for 1,000).
func Window(n int, per time.Duration) Limit {
	return Limit{count: float64(n), period: per, burst: n, kind: slidingWindow}
}

// FixedWindow returns a fixed window quota: at most n events in each period
// of length per, with periods aligned to Redis's clock (a minute's windows
// start on the minute), as an upstream that counts so would. A request that
// finds its window full waits for the next one. A Local aligns its windows
// to its own clock, as Redis does to Redis's.
func FixedWindow(n int, per time.Duration) Limit {
	return Limit{count: float64(n), period: per, burst: n, kind: fixedWindow}
}

// Concurrent returns a cap of n requests in flight at once: a request holds
// one of n slots from its grant until its response ends (see
// Redis.Acquire; a Transport takes one for each request). It
// stands alone or in an AllOf beside rate limits (at most one cap a quota).
// A slot is a lease that its holder renews while the request lives, so the
// slots of a process that dies come free within the lease (see WithLease).
func Concurrent(n int) Limit {
	return Limit{count: float64(n), burst: n, kind: concurrent}
}

// A Quota is what a limiter enforces: a Limit, or several at once (AllOf).
type Quota interface {
	limits() []Limit
}

func (l Limit) limits() []Limit { return []Limit{l} }

// AllOf returns a Quota of several limits at once, such as 10/s and
// 5000/h: a request goes when every one of them allows it, and is charged
// to all of them or, when it does not go, to none.
func AllOf(limits ...Limit) Quota { return allOf(slices.Clone(limits)) }

type allOf []Limit

func (a allOf) limits() []Limit { return a }

// PerSecond returns a Limit of n events per second with a burst of n
// (rounded up, at least 1).
func PerSecond(n float64) Limit { return Per(n, time.Second) }

// PerMinute returns a Limit of n events per minute with a burst of n
// (rounded up, at least 1).
func PerMinute(n float64) Limit { return Per(n, time.Minute) }

// PerHour returns a Limit of n events per hour with a burst of n
// (rounded up, at least 1).
func PerHour(n float64) Limit { return Per(n, time.Hour) }

// Per returns a Limit of n events per period with a burst of n (rounded up,
// at least 1). Per(900, 15*time.Minute) is X's "900 requests per 15 minutes".
func Per(n float64, period time.Duration) Limit {
	return Limit{count: n, period: period, burst: defaultBurst(n)}
}

// Every returns a Limit of one event every interval, with a burst of 1.
func Every(interval time.Duration) Limit { return Per(1, interval) }

// WithBurst returns a copy of l whose bucket holds burst events. It does
// not apply to windows, whose burst is their count.
func (l Limit) WithBurst(burst int) Limit {
	l.burst = burst
	return l
}

// Named returns a copy of l whose Redis key ends in name rather than in the
// limit's text. Limiters whose limits share a name and whose keys are the
// same share that limit: Stripe's 100/s for a whole account, beside 25/s for
// each endpoint, is PerSecond(100).Named("account") in every endpoint's
// quota, under one key for the account.
func (l Limit) Named(name string) Limit {
	l.name = name
	return l
}

// Rate returns the sustained rate of l in events per second; 0 for a cap
// of requests in flight (Concurrent).
func (l Limit) Rate() float64 {
	if l.kind == concurrent {
		return 0
	}
	return l.count / l.period.Seconds()
}

// Burst returns the number of events l allows at once (for Concurrent,
// the requests in flight).
func (l Limit) Burst() int { return l.burst }

// Validate reports why l cannot be used, or nil. Limiters call it for you.
func (l Limit) Validate() error {
	if why := l.problem(); why != "" {
		return fmt.Errorf("pace: limit %s: %s", l, why)
	}
	return nil
}

// problem says what is wrong with l, or "".
func (l Limit) problem() string {
	switch {
	case math.IsNaN(l.count) || math.IsInf(l.count, 0) || l.count <= 0:
		return fmt.Sprintf("count %v is not a positive finite number", l.count)
	case l.count > 1<<53:
		return fmt.Sprintf("count %v is above 2^53", l.count)
	case l.kind == concurrent:
		return l.capProblem()
	case l.cal.unit != notCalendar && l.cal.loc == nil:
		return "a calendar window needs a zone (a *time.Location such as time.UTC)"
	case l.period <= 0:
		return fmt.Sprintf("period %v is not positive", l.period)
	case l.burst < 1:
		return fmt.Sprintf("burst %d is below 1", l.burst)
	case float64(l.period)/l.count < float64(time.Microsecond):
		return fmt.Sprintf("rate %v/s is above the maximum of 1000000/s", l.Rate())
	case l.kind != bucket && (l.count != math.Trunc(l.count) || l.burst != int(l.count)):
		return fmt.Sprintf("a window's count %v must be a whole number and its burst", l.count)
	case strings.ContainsAny(l.name, store.ReservedInNames):
		return fmt.Sprintf("name %q may not contain '{', '}' or '#'", l.name)
	case l.learn.on && l.kind != bucket:
		return "a window cannot learn; Learn applies to token buckets"
	case l.learn.on:
		return l.learnProblem()
	case l.kind != bucket && l.period > store.MaxRefill:
		return fmt.Sprintf("window %v is longer than a year", l.period)
	case l.kind == bucket && int64(l.burst) > store.MaxRefill.Microseconds()/l.intervalMicros():
		return fmt.Sprintf("burst %d takes more than a year to refill", l.burst)
	}
	return ""
}

// capProblem says what is wrong with a cap of requests in flight, or "".
func (l Limit) capProblem() string {
	switch {
	case l.count > maxSlots || l.count != math.Trunc(l.count) || l.burst != int(l.count):
		return fmt.Sprintf("a cap of %v in flight: want a whole number from 1 to %d", l.count, maxSlots)
	case strings.ContainsAny(l.name, store.ReservedInNames):
		return fmt.Sprintf("name %q may not contain '{', '}' or '#'", l.name)
	case l.learn.on:
		return "a cap in flight cannot learn; Learn applies to token buckets"
	}
	return ""
}

// maxSlots is the largest cap of requests in flight.
const maxSlots = 1 << 20

// checkQuota returns the limits of q, or why they cannot be used.
func checkQuota(q Quota) ([]Limit, error) {
	if q == nil {
		return nil, fmt.Errorf("pace: no quota")
	}
	limits := q.limits()
	if len(limits) == 0 || len(limits) > store.MaxLimits {
		return nil, fmt.Errorf("pace: a quota of %d limits; want 1 to %d", len(limits), store.MaxLimits)
	}
	caps := 0
	named := make(map[string]Limit, len(limits))
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			return nil, err
		}
		if l.kind == concurrent {
			caps++
		}
		if other, ok := named[limitName(l)]; ok {
			return nil, fmt.Errorf("pace: two limits of the quota go by the name %q (%s and %s): they would share one key and one cost; name them apart with Named", limitName(l), other, l)
		}
		named[limitName(l)] = l
	}
	if caps > 1 {
		return nil, fmt.Errorf("pace: a quota of %d caps in flight (%v); want at most one", caps, limits)
	}
	return limits, nil
}

// splitCap returns the rate limits of a checked quota, and its cap of
// requests in flight (capped says whether it has one).
func splitCap(limits []Limit) (rates []Limit, limit Limit, capped bool) {
	for _, l := range limits {
		if l.kind == concurrent {
			limit, capped = l, true
		} else {
			rates = append(rates, l)
		}
	}
	return rates, limit, capped
}

// asBucket is a token bucket that never allows more than l in any period:
// l itself, or, for a window of n per T, n/2 at once and n/2 per T.
func (l Limit) asBucket() Limit {
	if l.kind == bucket {
		return l
	}
	return Limit{count: l.count / 2, period: l.period, burst: max(l.burst/2, 1)}
}

// fallbackShare is what one of n processes keeps of l alone while Redis is
// away: a fixed or calendar window as itself, at 1/n of its count (1 at
// least), counted from the outage on (Local keeps them); a bucket, or a
// sliding window as a bucket that never allows more, at its share.
func (l Limit) fallbackShare(n int) Limit {
	if l.kind == fixedWindow {
		l.count = max(math.Floor(l.count/float64(n)), 1)
		l.burst = int(l.count)
		return l
	}
	return l.asBucket().share(n)
}

// share is the part of l for one of n processes: 1/n of the rate, and 1/n
// of the burst (at least 1).
func (l Limit) share(n int) Limit {
	return Limit{count: l.count / float64(n), period: l.period, burst: max(l.burst/n, 1)}
}

// intervalMicros is the time one unit takes to refill, in whole
// microseconds (see microsPer).
func (l Limit) intervalMicros() int64 { return microsPer(l.period, l.count) }

// String formats l in the syntax ParseLimit reads, such as "100/s",
// "10/s burst 20", "900/15m sliding" or "10 in flight". A bucket's burst is shown when it
// differs from the count's default.
func (l Limit) String() string {
	if l.kind == concurrent {
		return strconv.FormatFloat(l.count, 'f', -1, 64) + " in flight"
	}
	if l.cal.unit != notCalendar {
		return strconv.FormatFloat(l.count, 'f', -1, 64) + l.cal.calendarText()
	}
	s := strconv.FormatFloat(l.count, 'g', -1, 64) + "/" + formatPeriod(l.period)
	switch {
	case l.kind == slidingWindow:
		s += " sliding"
	case l.kind == fixedWindow:
		s += " fixed"
	case l.burst != defaultBurst(l.count):
		s += " burst " + strconv.Itoa(l.burst)
	}
	return s + l.learnText()
}

// ParseLimit reads a Limit written as
//
//	COUNT/PERIOD [burst N | sliding | fixed] [learn [FLOOR..CEILING]]
//	COUNT in flight
//	COUNT/day [in ZONE]
//	COUNT/month [in ZONE]
//
// COUNT is a positive number; PERIOD is s, m, h or d, or their words
// (sec, second, min, minute, hr, hour, day, ms, millisecond, plurals too),
// a number of them ("15 minutes", 15m, 1.5h), or a Go duration such as
// 1h30m or 500ms; "/" may be written "per", with spaces around it or not:
// "100 per minute", "900 per 15 minutes". Alone, or with a burst (which
// defaults to COUNT rounded up), it is a token bucket; "sliding" makes it a
// Window, "fixed" a FixedWindow (with a whole COUNT); "learn" makes a bucket
// Learn, and "learn FLOOR..CEILING" LearnWithin(FLOOR, CEILING); "COUNT in
// flight" is a cap of requests in flight (Concurrent); "/day" and "/month"
// are calendar windows (Daily, Monthly) in ZONE, a name of the IANA time
// zone database, or UTC. Examples: "100/s", "5000/h", "10/s burst 20",
// "100 per minute", "900/15m sliding", "100/h fixed", "10/s learn", "10/s learn 1..500",
// "10 in flight", "10000/day in America/Los_Angeles", "50000/month".
// Anything else is an error that quotes the input.
func ParseLimit(s string) (Limit, error) {
	bad := func(why string) (Limit, error) {
		return Limit{}, fmt.Errorf("pace: invalid limit %q: %s (want COUNT/PERIOD [burst N], such as \"100/s\", \"100 per minute\", \"900 per 15 minutes\" or \"10/s burst 20\")", s, why)
	}
	fields := joinRate(strings.Fields(s))
	if len(fields) == 3 && fields[1] == "in" && fields[2] == "flight" {
		return parseCap(fields[0], bad)
	}
	if isCalendar(fields) {
		return parseCalendar(fields, bad)
	}
	fields, learn, err := parseLearn(fields)
	if err != nil {
		return bad(err.Error())
	}
	windowed := len(fields) == 2 && (fields[1] == "sliding" || fields[1] == "fixed")
	if len(fields) == 0 || (len(fields) != 1 && !windowed && (len(fields) != 3 || fields[1] != "burst")) {
		return bad("want COUNT/PERIOD, then nothing, burst N, sliding or fixed")
	}
	countText, periodText, ok := strings.Cut(fields[0], "/")
	if !ok {
		return bad("no '/'")
	}
	count, err := strconv.ParseFloat(countText, 64)
	if err != nil {
		return bad("count " + strconv.Quote(countText) + " is not a number")
	}
	period, err := parsePeriod(periodText)
	if err != nil {
		return bad("period " + strconv.Quote(periodText) + ": want s, sec, second, m, min, minute, h, hr, hour, d or day (plurals too), a number of them (15m, \"15 minutes\") or a Go duration (500ms, 1h30m)")
	}
	l := Per(count, period)
	if windowed {
		l = Limit{count: count, period: period, burst: int(count), kind: slidingWindow}
		if fields[1] == "fixed" {
			l.kind = fixedWindow
		}
	}
	if len(fields) == 3 {
		if l.burst, err = strconv.Atoi(fields[2]); err != nil {
			return bad("burst " + strconv.Quote(fields[2]) + " is not a whole number")
		}
	}
	l.learn = learn
	if why := l.problem(); why != "" {
		return bad(why)
	}
	return l, nil
}

// parseCap reads the count of "COUNT in flight".
func parseCap(countText string, bad func(string) (Limit, error)) (Limit, error) {
	n, err := strconv.Atoi(countText)
	if err != nil {
		return bad("count " + strconv.Quote(countText) + " of requests in flight is not a whole number")
	}
	l := Concurrent(n)
	if why := l.problem(); why != "" {
		return bad(why)
	}
	return l, nil
}

// MarshalText implements encoding.TextMarshaler with the syntax of ParseLimit.
func (l Limit) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseLimit, so a
// Limit can be read from JSON, YAML or flag.TextVar.
func (l *Limit) UnmarshalText(text []byte) error {
	parsed, err := ParseLimit(string(text))
	if err != nil {
		return err
	}
	*l = parsed
	return nil
}

// defaultBurst is count rounded up, at least 1. A count that is not finite
// or above 2^53 gets 1, and Validate refuses it.
func defaultBurst(count float64) int {
	if !(count >= 1) || count > 1<<53 {
		return 1
	}
	return int(math.Ceil(count))
}

var namedPeriods = []struct {
	name   string
	period time.Duration
}{{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour}}

// periodWords are the words of a period a limit may be written with, each
// the unit it means.
var periodWords = map[string]time.Duration{
	"ms": time.Millisecond, "millisecond": time.Millisecond, "milliseconds": time.Millisecond,
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// joinRate joins the spellings of a rate that fields may begin with into
// one field, COUNT/PERIOD: "100 per minute", "100 / minute", "100 per 15
// minutes", "100/ 15 minutes".
func joinRate(fields []string) []string {
	if len(fields) >= 3 && (fields[1] == "per" || fields[1] == "/") {
		fields = append([]string{fields[0] + "/"}, fields[2:]...)
	}
	if len(fields) >= 2 && strings.HasSuffix(fields[0], "/") {
		fields = append([]string{fields[0] + fields[1]}, fields[2:]...)
	}
	if len(fields) >= 2 && periodWords[fields[1]] != 0 && strings.Contains(fields[0], "/") {
		if _, n, _ := strings.Cut(fields[0], "/"); isNumber(n) {
			fields = append([]string{fields[0] + fields[1]}, fields[2:]...) // "100/15 minutes"
		}
	}
	return fields
}

// isNumber reports whether s is a number, as a period's count is.
func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil && s != "" && s[0] >= '0' && s[0] <= '9'
}

// parsePeriod reads a period: a word of periodWords, a number of one
// ("15minutes", "15m", "1.5h"), or a Go duration ("500ms", "1h30m").
func parsePeriod(s string) (time.Duration, error) {
	if p := periodWords[s]; p != 0 {
		return p, nil
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, fmt.Errorf("unknown period %q", s)
	}
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if unit := periodWords[s[max(i, 0):]]; i > 0 && unit != 0 {
		n, err := strconv.ParseFloat(s[:i], 64)
		if err != nil || n <= 0 || n*float64(unit) > float64(math.MaxInt64) {
			return 0, fmt.Errorf("unknown period %q", s)
		}
		return time.Duration(n * float64(unit)), nil
	}
	return time.ParseDuration(s)
}

func formatPeriod(d time.Duration) string {
	for _, p := range namedPeriods {
		if d == p.period {
			return p.name
		}
	}
	s := d.String() // "15m0s" reads better as "15m", and "2h0m0s" as "2h"
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// storeLimits are limits as the store takes them, a calendar's windows
// told by the clock now. Each limit's Redis key is prefix{key}, a colon and
// the limit's name; the key of a quota of one unnamed bucket is prefix{key}
// alone.
func storeLimits(limits []Limit, now func() time.Time) []store.Limit {
	kinds := map[limitKind]store.Kind{bucket: store.Bucket, slidingWindow: store.SlidingWindow, fixedWindow: store.FixedWindow}
	out := make([]store.Limit, len(limits))
	for i, l := range limits {
		out[i] = store.Limit{Kind: kinds[l.kind], Span: l.intervalMicros(), Count: l.burst, Suffix: ":" + limitName(l)}
		if l.kind != bucket {
			out[i].Span = l.period.Microseconds()
		}
		if l.cal.unit != notCalendar {
			windows := &calendarWindows{cal: l.cal}
			out[i].Windows = func() string { return windows.text(now()) }
		}
	}
	if len(limits) == 1 && limits[0].kind == bucket && limits[0].name == "" {
		out[0].Suffix = ""
	}
	return out
}
