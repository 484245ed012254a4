package pace

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// learning is what a Limit learns from the upstream (Learn): whether it
// learns, and the bounds of the rate it may adopt, in events per the
// limit's period (0: the default bound).
type learning struct {
	on             bool
	floor, ceiling float64
}

// Learn returns a copy of l that adopts the limit the upstream advertises:
// from the first response that says how large the quota is (see headers.Reading's
// Limit and Window, its window defaulting to l's period), the key paces at
// that rate instead of l's, with l's burst, in every process, until the key
// is idle long enough to expire. l's rate is the ceiling: the upstream's
// word never lifts a limit above what was configured; and a tenth of it is
// the floor, so that one advertisement cannot stall the key. LearnWithin
// sets other bounds. It needs a Redis limiter and a token bucket.
func (l Limit) Learn() Limit {
	l.learn = learning{on: true}
	return l
}

// LearnWithin is Learn, adopting no rate below floor nor above ceiling
// events per l's period: PerSecond(10).LearnWithin(1, 500) starts at a
// cautious 10/s, and follows the upstream from 1/s to 500/s. l's own count
// must lie between them.
func (l Limit) LearnWithin(floor, ceiling float64) Limit {
	l.learn = learning{on: true, floor: floor, ceiling: ceiling}
	return l
}

// learnBounds returns the bounds of what l may learn, in events per its
// period: the ones given, or a tenth of its count and its count.
func (l Limit) learnBounds() (floor, ceiling float64) {
	floor, ceiling = l.learn.floor, l.learn.ceiling
	if floor == 0 && ceiling == 0 {
		floor, ceiling = l.count/10, l.count
	}
	return floor, ceiling
}

// learnProblem says what is wrong with the learning of bucket l, or "".
func (l Limit) learnProblem() string {
	floor, ceiling := l.learnBounds()
	switch {
	case !(floor > 0) || math.IsInf(ceiling, 0) || !(floor <= l.count && l.count <= ceiling):
		return fmt.Sprintf("learning from %v to %v: want 0 < floor <= count %v <= ceiling", floor, ceiling, l.count)
	case float64(l.period)/ceiling < float64(time.Microsecond):
		return fmt.Sprintf("learning up to %v per %v: above the maximum of 1000000/s", ceiling, formatPeriod(l.period))
	case int64(l.burst) > store.MaxRefill.Microseconds()/microsPer(l.period, floor):
		return fmt.Sprintf("learning down to %v per %v: burst %d would take more than a year to refill", floor, formatPeriod(l.period), l.burst)
	}
	return ""
}

// learned returns the interval, in microseconds, that l adopts when the
// upstream advertises limit events per window: within l's bounds, and no
// longer than bound (MaxHold) unless l's ceiling is slower; and whether the
// bounds changed it.
func (l Limit) learned(limit int64, window, bound time.Duration) (interval int64, bounded bool) {
	floor, ceiling := l.learnBounds()
	shortest := microsPer(l.period, ceiling)
	longest := max(shortest, min(microsPer(l.period, floor), bound.Microseconds()))
	asked := max(int64(math.Ceil(float64(window.Microseconds())/float64(limit))), 1)
	interval = min(max(asked, shortest), longest)
	return interval, interval != asked
}

// learnText is the suffix of l's text for its learning: "", " learn", or
// " learn FLOOR..CEILING".
func (l Limit) learnText() string {
	switch {
	case !l.learn.on:
		return ""
	case l.learn.floor == 0 && l.learn.ceiling == 0:
		return " learn"
	}
	return " learn " + strconv.FormatFloat(l.learn.floor, 'g', -1, 64) + ".." + strconv.FormatFloat(l.learn.ceiling, 'g', -1, 64)
}

// parseLearn reads the learning at the end of a limit's fields ("learn",
// or "learn FLOOR..CEILING") and returns the fields before it.
func parseLearn(fields []string) ([]string, learning, error) {
	n := len(fields)
	switch {
	case n > 1 && fields[n-1] == "learn":
		return fields[:n-1], learning{on: true}, nil
	case n > 2 && fields[n-2] == "learn":
		floorText, ceilingText, ok := strings.Cut(fields[n-1], "..")
		floor, err1 := strconv.ParseFloat(floorText, 64)
		ceiling, err2 := strconv.ParseFloat(ceilingText, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, learning{}, fmt.Errorf("learning bounds %q: want FLOOR..CEILING, such as 1..500", fields[n-1])
		}
		return fields[:n-2], learning{on: true, floor: floor, ceiling: ceiling}, nil
	}
	return fields, learning{}, nil
}

// microsPer is the time one of count events per period takes, in whole
// microseconds, rounded up so that a rounded rate is never above the
// count's. It is computed exactly (count is a binary fraction), so that
// 100 per minute is 600000 µs and one a year 31536000000000 µs, not a
// floating-point neighbour of either.
func microsPer(period time.Duration, count float64) int64 {
	c := new(big.Rat).SetFloat64(count)
	if c == nil || c.Sign() <= 0 {
		return 0 // validation refuses such a count
	}
	us := new(big.Rat).Quo(new(big.Rat).SetInt64(int64(period)), c.Mul(c, big.NewRat(1000, 1)))
	q, r := new(big.Int).QuoRem(us.Num(), us.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}
