package pace

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/store"
)

// DefaultMaxHold is the longest that anything a response says can delay a
// key, unless a limiter is told otherwise (WithMaxHold).
const DefaultMaxHold = time.Hour

// heldBefore applies w's holds of a key by hold, and returns when the
// key's hold before them ended (0 for none, or when none held it): what a
// refusal's weight looks back at (see internal/steer's Rate.Refused). Of
// several holds, the first that held the key saw it: the others saw its
// end, which is later.
func heldBefore(w headers.Word, hold func(headers.Hold) (before int64, err error)) int64 {
	before := int64(0)
	for _, h := range w.Holds {
		if b, err := hold(h); err == nil && b > 0 && (before == 0 || b < before) {
			before = b
		}
	}
	return before
}

// reportHold tells o that limiter held key as h says: a cap when there was
// one, and, when changed (the hold outlasts what was in place), the hold and
// later its end.
func reportHold(ctx context.Context, o Observer, limiter, key string, h headers.Hold, changed bool) {
	if o == nil {
		return
	}
	if h.Asked > 0 {
		o(ctx, Event{Kind: EventHoldCapped, Limiter: limiter, Key: key, Delay: h.Asked, Reason: h.Reason})
	}
	if !changed {
		return
	}
	o(ctx, Event{Kind: EventHold, Limiter: limiter, Key: key, Delay: h.For, Reason: h.Reason})
	ctx = context.WithoutCancel(ctx)
	time.AfterFunc(h.For, func() {
		o(ctx, Event{Kind: EventHoldEnd, Limiter: limiter, Key: key, Reason: h.Reason})
	})
}

// hold returns h as the limiter sets it for key: capped at the limiter's
// bound (and saying what was asked), and whether it holds the key at all
// (a hold of a quota none of limits is holds nothing); or why it cannot be
// set: an empty key, or a hold that is not positive.
func (c commonConfig) hold(limits namedLimits, key string, h headers.Hold) (headers.Hold, bool, error) {
	switch {
	case key == "":
		return h, false, fmt.Errorf("pace: Hold: empty key (%s)", h.Reason)
	case h.For <= 0:
		return h, false, fmt.Errorf("pace: key %s: headers.Hold for %v (%s): want a positive time", store.QuoteKey(key), h.For, h.Reason)
	}
	if bound := c.maxHold; h.For > bound {
		h.For, h.Asked = bound, max(h.Asked, h.For)
	}
	return h, limits.holds(h), nil
}

// A hold must stop every request of the fleet, also those already booked
// and asleep, in every process. So the hold script publishes each hold, and
// every Redis limiter listens: a caller that wakes to find that its time lies
// before the end of a hold (both by Redis's clock) books again, after the
// hold, instead of going.
