package pace

import (
	"context"
	"math"
	"slices"
	"strconv"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
)

// explains reports whether w explains its refusal for n: a reading of one
// of the limits with no unit left, which steers the key's buckets (not one
// Rounded, perhaps a token bucket's that the fleet emptied, nor one that
// is the refusal, THROTTLED in a body); or a
// hold of the key beside readings of its limits, which steer them while
// the hold pauses it. Any other refusal steers the key's rate (see
// internal/steer), one that a hold alone explains too: the hold pauses
// the fleet, but the refusal says it went too fast (or others spend the
// quota, or jitter ate the burst), and the rate, which has no burst, ends
// the hold softly. (Where counters steer a window, the rate, which paces
// at the configured limit's rate, an hourly quota's, would end it late.)
func (n namedLimits) explains(w headers.Word) bool {
	read := false
	for _, r := range w.Readings {
		if r.Rounded() || r.Refused || n.limitOf(r.Name, r.OwnQuota, len(w.Readings) == 1) < 0 {
			continue
		}
		if r.Remaining == 0 {
			return true
		}
		read = true
	}
	return read && slices.ContainsFunc(w.Holds, n.holds)
}

// limitOf returns the index of the limit that a reading of the upstream's
// quota name is about, or -1: the limit named like it; or, for a response's
// only reading (only), the quota's only limit, unless the reading names a
// quota of its own (own: a GitHub resource other than core).
func (n namedLimits) limitOf(name string, own, only bool) int {
	for i, known := range n.names {
		if known == name {
			return i
		}
	}
	if only && !own && len(n.limits) == 1 {
		return 0
	}
	return -1
}

// holds reports whether h holds a key of these limits: a hold of the whole
// key, or of a quota one of them is; not one a bucket's level alone said
// (see bucketLevel).
func (n namedLimits) holds(h headers.Hold) bool {
	i := n.limitOf(h.Quota, h.OwnQuota, h.OnlyReading)
	if h.Reading != nil && i >= 0 && bucketLevel(*h.Reading, n.limits[i]) {
		return false
	}
	return h.Quota == "" || i >= 0
}

// reportRate tells o that limiter cut key's rate, after the refusal the
// response's status says, to fraction (of steer.Full), or that it is back
// at its configured rate (fraction steer.Full).
func reportRate(ctx context.Context, o Observer, limiter, key string, fraction int64, status int) {
	reason := "recovered"
	if fraction < steer.Full {
		reason = strconv.Itoa(status) + " that no counters explain"
	}
	e := Event{Kind: EventRate, Limiter: limiter, Key: key, Rate: float64(fraction) / steer.Full, Reason: reason}
	if fraction < steer.Full {
		e.Delay = steer.Period
	}
	o.emit(ctx, e)
}

// rateUnit returns, for a request of costs, the time the fastest limit it
// costs anything under takes to refill its cost, in µs (0 for a request
// that costs nothing): what a key's rate measures against. per gives a
// limit's interval, by index: the one a bucket books at (learned or
// steered), a window's length over its count.
func rateUnit(costs *store.LimitCosts, n int, per func(i int) int64) int64 {
	unit := int64(math.MaxInt64)
	for i := range n {
		if costs[i] > 0 {
			unit = min(unit, int64(costs[i])*per(i))
		}
	}
	if unit == math.MaxInt64 {
		return 0
	}
	return unit
}
