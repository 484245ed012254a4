package pace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
	"github.com/fleetpace/pace/internal/store"
)

// A Class is a request's priority class. A request of a class with a
// horizon books only when its wait would be within that horizon: while the
// key's schedule is booked further ahead, it waits outside it, in a line of
// its own (one script call to join it), and, at its turn, books if its wait
// is within twice the horizon (else it tries again when it would be). So
// the classes without a horizon find the schedule at most twice the
// horizon ahead, and wait about that long, never behind a backlog of lower
// classes; and the lower classes get all that the others leave, in about
// the order they lined up. The bound on the rate, over all classes
// together, is the quota's.
//
// Set a request's class on its context (WithClass) or on its Rule.
type Class uint8

const (
	// ClassDefault, the class of a request without one, books as far
	// ahead as it needs, unless WithHorizon gives it a horizon.
	ClassDefault Class = iota
	// ClassCritical always books as far ahead as it needs.
	ClassCritical
	// ClassBatch books no further ahead than its horizon: by default, half
	// the time the quickest of the limits the request costs anything under
	// takes to refill its cost, so that a critical request waits at most
	// about two intervals of the limit that binds. (Under
	// AllOf(PerSecond(10), Per(100000, 24*time.Hour)) that is 50 ms while
	// the per-second limit binds; once the daily one does, a batch request
	// books when the day's next token is within 50 ms, and lines up again
	// until it is.)
	ClassBatch
)

var classNames = [...]string{ClassDefault: "default", ClassCritical: "critical", ClassBatch: "batch"}

// String returns the class's name: "default", "critical" or "batch".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", c)
}

type classKey struct{}

// WithClass returns ctx carrying the priority class c, which the waits of
// a Local or Redis limiter made with it (and a Transport's, for a request
// with that context) follow.
func WithClass(ctx context.Context, c Class) context.Context {
	return context.WithValue(ctx, classKey{}, c)
}

// classOf returns the class ctx carries, ClassDefault when none.
func classOf(ctx context.Context) Class {
	c, _ := ctx.Value(classKey{}).(Class)
	return c
}

// WithHorizon sets the horizon of class c: how far ahead of now its
// requests may book (see Class). ClassBatch has one by default; ClassCritical
// cannot have one. Zero restores the default.
func WithHorizon(c Class, d time.Duration) Option {
	return commonOption(func(config *commonConfig) {
		if config.horizons == nil {
			config.horizons = make(map[Class]time.Duration)
		}
		config.horizons[c] = d
	})
}

// checkHorizons reports a horizon that cannot be.
func checkHorizons(h map[Class]time.Duration) error {
	for c, d := range h {
		switch {
		case c > ClassBatch:
			return fmt.Errorf("pace: WithHorizon(%v, %v): unknown class", c, d)
		case c == ClassCritical && d != 0:
			return fmt.Errorf("pace: WithHorizon(critical, %v): critical requests have no horizon", d)
		case d < 0 || d > MaxDelay:
			return fmt.Errorf("pace: WithHorizon(%v, %v): want from 0 to MaxDelay", c, d)
		}
	}
	return nil
}

// horizonOf is how far ahead a request of the class ctx carries may book,
// for costs under limits; 0 for no horizon.
func horizonOf(ctx context.Context, config *commonConfig, limits []Limit, costs *store.LimitCosts) time.Duration {
	if config.dryRun {
		return 0 // see WithDryRun
	}
	c := classOf(ctx)
	if d := config.horizons[c]; d > 0 {
		return d
	}
	if c != ClassBatch {
		return 0
	}
	return max(refillOf(limits, costs)/2, time.Microsecond)
}

// refillOf is the time the quickest of limits takes to refill costs,
// among those costs charge (a bucket's interval, or a window's length
// over its count, times the cost; 0 when costs charge none): the shortest
// time in which the limit that binds, whichever it is, can grant the
// request again. The slowest would not do: a daily cap beside a
// per-second limit would size a horizon, and the line's turns, by a
// daily cap that binds only once its day's burst is spent.
func refillOf(limits []Limit, costs *store.LimitCosts) time.Duration {
	var quickest time.Duration
	for i, l := range limits {
		if costs[i] <= 0 {
			continue
		}
		refill := time.Duration(float64(l.period)/l.count) * time.Duration(costs[i])
		if quickest == 0 || refill < quickest {
			quickest = refill
		}
	}
	return quickest
}

// A deferral is a wait that a request's class kept out of the schedule:
// the wait would have been delay, beyond the class's horizon.
type deferral struct{ delay time.Duration }

func (d *deferral) Error() string { return fmt.Sprintf("pace: deferred: a wait of %v", d.delay) }

// classBudget narrows a wait's budget to the horizon of its class: a
// refusal within the caller's own budget is then a deferral (see defers).
func classBudget(budget, horizon time.Duration) time.Duration {
	if horizon > 0 {
		return min(budget, horizon)
	}
	return budget
}

// defers reports whether a wait of delay, refused under a budget that
// classBudget narrowed from own to horizon, is a deferral rather than a
// refusal: it fits the caller's own budget.
func defers(delay, own, horizon time.Duration) bool {
	return horizon > 0 && horizon < own && delay <= own
}

// asDeferral returns err's deferral, if it is one. A nil err costs no
// allocation (errors.As would take d's address to the heap).
func asDeferral(err error) (*deferral, bool) {
	if err == nil {
		return nil, false
	}
	var d *deferral
	ok := errors.As(err, &d)
	return d, ok
}

// deferLines are a Local's lines of deferred requests, by key: when the
// last one's turn ends (as lua/line.lua keeps them in Redis).
type deferLines struct {
	mu   sync.Mutex
	last expiring.Map[time.Time]
}

// lineUp returns when a request deferred at now, whose wait comes within
// its horizon after earliest, books: at that time, or, behind the requests
// deferred before it, when their turns (turn each) have passed.
func (l *deferLines) lineUp(key string, now time.Time, earliest, turn time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, _ := l.last.Get(key)
	retry := max(earliest, last.Sub(now))
	end := now.Add(retry + turn)
	l.last.Put(key, end, end, now)
	return retry
}

// sleepDeferred tells o that a request of ctx's class, for cost units of key,
// was kept out of the schedule, and waits retry before it books.
func sleepDeferred(ctx context.Context, o Observer, e Event, retry time.Duration) error {
	e.Kind, e.Delay, e.Reason = EventClass, retry, classOf(ctx).String()
	o.emit(ctx, e)
	return sleep(ctx, e.Key, retry)
}
