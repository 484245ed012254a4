package pace

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/usage"
)

// BodyCounters reads the upstream's counters from the ends of a response
// body, for an upstream that states them there rather than in its headers
// (ShopifyCounters). Set as a Transport's or a Rule's BodyCounters, the
// readings it returns steer the request's key on a Redis once the body
// reaches EOF or is closed, as the headers' do (see Redis.Sync), unless
// IgnoreCounters; a reading Refused (THROTTLED) is a refusal too, which
// the refusals' loop weighs, unless IgnoreRefusals. A body never closed
// says nothing. The body then comes wrapped, as for a Settler.
type BodyCounters func(resp *http.Response, ends usage.Ends) []headers.Reading

// ShopifyCounters reads the cost bucket that Shopify's GraphQL Admin API
// states in each answer's extensions.cost.throttleStatus (usage.Shopify),
// THROTTLED answers too: one reading, named "cost", of a quota that
// refills, maximumAvailable points restored at restoreRate a second. It
// steers the quota's only rate limit, or the one Named "cost": a bucket in
// points, such as PerSecond(50).WithBurst(1000), each request's cost its
// query's requested cost (Rule.CostHeader, or an Estimate).
func ShopifyCounters(_ *http.Response, ends usage.Ends) []headers.Reading {
	th, ok := usage.Shopify(ends)
	if !ok {
		return nil
	}
	said := fmt.Sprintf("extensions.cost.throttleStatus: %g of %g available, %g restored a second", th.Available, th.Maximum, th.RestoreRate)
	if th.Throttled {
		said += ", THROTTLED"
	}
	return []headers.Reading{{
		Name:      "cost",
		Limit:     int64(th.Maximum),
		Window:    secondsOf(th.Maximum / th.RestoreRate),
		Remaining: int64(math.Floor(th.Available)),
		Reset:     secondsOf((th.Maximum - th.Available) / th.RestoreRate),
		Refills:   true,
		Refused:   th.Throttled,
		Header:    said,
	}}
}

// secondsOf is s seconds, s at most usage.MaxCount.
func secondsOf(s float64) time.Duration {
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// heedBody hands the counters that resp's body (its ends) states to p's
// limiter, as of arrival, when the headers came, and the refusal a reading
// says the body makes (THROTTLED) to the refusals' loop, which heard the
// headers already.
func (p pacing) heedBody(ctx context.Context, resp *http.Response, ends usage.Ends, arrival time.Time) {
	readings := p.counters(resp, ends)
	if len(readings) == 0 {
		return
	}
	w := headers.Word{Readings: readings, Status: resp.StatusCode, At: arrival,
		Refused: slices.ContainsFunc(readings, func(r headers.Reading) bool { return r.Refused })}
	scope := p.scope
	scope.refusals = scope.refusals && w.Refused
	p.backend.heed(ctx, p.key, p.grant, w, scope)
}
