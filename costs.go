package pace

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// Costs are what one request takes under each limit of its quota, by the
// limit's name: the name Limit.Named gave it, or its text, such as "500/m".
// A limit the Costs do not name costs 1. Under
//
//	pace.AllOf(pace.PerMinute(500).Named("requests"), pace.PerMinute(200000).Named("tokens"))
//
// a request estimated at 1,200 tokens costs pace.Costs{"tokens": 1200}: 1
// request and 1,200 tokens. A cost may be 0 under some limits, never below.
type Costs map[string]int

// A Reservation is a wait that Local or Redis granted at an estimated cost
// (Reserve), to be settled with the actual cost once it is known (Settle).
// It is safe for concurrent use. It is for costs known only once the
// response has ended, such as the tokens of an LLM API.
//
// Reserve waits, like Wait, for a request estimated at estimate, and returns
// the Reservation of its grant. Settle then charges the difference between
// the actual costs and the estimate, the way an upstream that estimates a
// request when it starts and corrects its count when it ends does: less
// gives the difference back at once, more is a debt that later callers wait
// for (beyond the burst, it is paid off at the rate). An actual cost is
// capped at what its limit can ever hold (a burst, a window's count) and,
// under a bucket, so that its debt delays the key by the limiter's MaxHold
// at most (see WithMaxHold): a usage object that says a request took 2^40
// tokens cannot stall a key for years. A reservation is settled once:
// settling it again does nothing. One never settled stays at its estimate.
type Reservation struct {
	limiter  backend // the limiter that made it
	key      string
	estimate store.LimitCosts
	booked   booking // what was booked, and where
	settled  atomic.Bool
}

// Key returns the key the reservation was made for.
func (r *Reservation) Key() string { return r.key }

// Delay returns how long the reservation's caller waited for its grant.
func (r *Reservation) Delay() time.Duration { return r.booked.delay }

// granted returns what the reservation booked, by which the response to
// its request steers the key.
func (r *Reservation) granted() grant { return grant{r.booked} }

// uniform is cost under each of n limits (0 beyond them).
func uniform(cost, n int) store.LimitCosts {
	var c store.LimitCosts
	for i := range n {
		c[i] = cost
	}
	return c
}

// estimated is the set of limits that estimate names: their costs are
// estimates, which the upstream's counters may correct until they are
// settled (see lua/common.lua's CEILING).
func (n namedLimits) estimated(estimate Costs) (set store.LimitSet) {
	for i, name := range n.names {
		if _, ok := estimate[name]; ok {
			set |= 1 << i
		}
	}
	return set
}

// asked is the event of a wait for costs of key, which limiter decides,
// before its Kind is set: its Cost is the cost under the first limit and,
// for a reservation (reserved) that o hears of, its Costs are the costs
// under each limit by name.
func (n namedLimits) asked(o Observer, limiter, key string, costs *store.LimitCosts, reserved bool) Event {
	e := Event{Limiter: limiter, Key: key, Cost: costs[0]}
	if o != nil && reserved {
		e.Costs = n.byName(costs)
	}
	return e
}

// byName returns costs as Costs: each limit's cost by its name.
func (n namedLimits) byName(costs *store.LimitCosts) Costs {
	c := make(Costs, len(n.names))
	for i, name := range n.names {
		c[name] = costs[i]
	}
	return c
}

// settled tells o of the settlement by limiter of a reservation of key
// (estimate, nil for one another limiter made) at actual (as capped, nil
// when it never began), or that it failed with err, and returns err.
func (n namedLimits) settled(ctx context.Context, o Observer, limiter, key string, estimate, actual *store.LimitCosts, err error) error {
	if o == nil {
		return err
	}
	e := Event{Kind: EventSettle, Limiter: limiter, Key: key, Err: err}
	if estimate != nil {
		e.Estimate = n.byName(estimate)
	}
	if actual != nil {
		e.Cost, e.Costs = actual[0], n.byName(actual)
	}
	o.emit(ctx, e)
	return err
}

// settleFailed tells o that limiter's settlement of r failed before it
// began (err), and returns err. The estimate is named only for a
// reservation that limiter made.
func (n namedLimits) settleFailed(ctx context.Context, o Observer, name string, limiter backend, r *Reservation, err error) error {
	if r == nil || r.limiter != limiter {
		return n.settled(ctx, o, name, "", nil, nil, err)
	}
	return n.settled(ctx, o, name, r.key, &r.estimate, nil, err)
}

// limitName is the name a limit goes by in Costs and in its Redis key.
func limitName(l Limit) string { return cmp.Or(l.name, l.String()) }

// namedLimits are the limits of a quota and the name each goes by.
type namedLimits struct {
	limits    []Limit
	names     []string
	intervals []int64 // each limit's intervalMicros, computed once: it is exact, and costly
}

func newNamedLimits(limits []Limit) namedLimits {
	n := namedLimits{limits: limits}
	for _, l := range limits {
		n.names = append(n.names, limitName(l))
		n.intervals = append(n.intervals, l.intervalMicros())
	}
	return n
}

// costsOf reads c, for key, as a cost under each limit. An estimate must
// fit each limit's burst or count, lest its wait never end.
func (n namedLimits) costsOf(key string, c Costs, estimate bool) (store.LimitCosts, error) {
	var costs store.LimitCosts
	for i := range n.limits {
		costs[i] = 1
	}
	for name, cost := range c {
		i := -1
		for j, known := range n.names {
			if known == name {
				i = j
			}
		}
		switch {
		case i < 0:
			return costs, &requestError{fmt.Sprintf("pace: key %s: Costs name %q, which is not a limit of the quota (%s)", store.QuoteKey(key), name, strings.Join(n.names, ", "))}
		case cost < 0:
			return costs, &requestError{fmt.Sprintf("pace: key %s: cost %d under limit %q is below 0", store.QuoteKey(key), cost, name)}
		case estimate && cost > n.limits[i].burst:
			return costs, &requestError{fmt.Sprintf("pace: key %s: cost %d under limit %q exceeds its burst %d", store.QuoteKey(key), cost, name, n.limits[i].burst)}
		}
		costs[i] = cost
	}
	return costs, nil
}

// checkReserve reports a reservation that cannot begin, as checkWait does.
func (n namedLimits) checkReserve(ctx context.Context, key string, estimate Costs) (store.LimitCosts, error) {
	if err := checkWait(ctx, 1, key, 1); err != nil {
		return store.LimitCosts{}, err
	}
	return n.costsOf(key, estimate, true)
}

// checkSettle reports a settlement that cannot be made: of a reservation
// that limiter did not make, or with a bad actual cost.
func (n namedLimits) checkSettle(limiter backend, r *Reservation, actual Costs) (store.LimitCosts, error) {
	if r == nil || r.limiter != limiter {
		return store.LimitCosts{}, &requestError{"pace: Settle: a reservation this limiter did not make"}
	}
	return n.costsOf(r.key, actual, false)
}

// capDebts caps each of a settlement's actual costs at what its limit can
// ever hold (a bucket's burst, a window's count) and, for a bucket, at the
// estimate plus what it refills in bound, so that no settlement can delay
// the key beyond bound; limiter's observer o hears of each cap.
func (n namedLimits) capDebts(ctx context.Context, o Observer, limiter string, r *Reservation, actual *store.LimitCosts, bound time.Duration) {
	for i, l := range n.limits {
		most := l.burst
		if l.kind == bucket {
			most = min(most, r.estimate[i]+int(min(bound.Microseconds()/n.intervals[i], int64(l.burst))))
		}
		if actual[i] > most {
			o.emit(ctx, Event{Kind: EventSettleCapped, Limiter: limiter, Key: r.key, Cost: actual[i],
				Reason: fmt.Sprintf("%s: capped at %d", n.names[i], most)})
			actual[i] = most
		}
	}
}
