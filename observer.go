package pace

import (
	"context"
	"strconv"
	"time"
)

// An Observer sees what a limiter decides and what becomes of Redis, so that
// a program can log, count or trace it; pace itself never logs. It is called
// synchronously on the goroutine of the request concerned, with that
// request's context (so a tracer finds its span), possibly from many
// goroutines at once: it must be safe for concurrent use and quick.
type Observer func(context.Context, Event)

// The limiters an Event names (Event.Limiter).
const (
	redisLimiter = "redis" // the shared limit, decided in Redis
	localLimiter = "local" // a Local, or a Redis limiter's fallback while Redis is away
	openLimiter  = "open"  // a Redis limiter failing open (FailOpen)
)

// An Event is one thing a limiter did.
type Event struct {
	Kind    EventKind
	Limiter string        // which limiter decided: "redis", "local" (also the fallback), or "open" (fail-open)
	Key     string        // the key the event is about
	Cost    int           // the units asked for (under the first limit of a quota of several)
	Delay   time.Duration // the wait booked, refused or cut short; how long Redis was away; how long a hold lasts
	Err     error         // why: the refusal, the cancellation, or the Redis failure
	Reason  string        // for holds: the upstream's status and header, such as "429 Retry-After: 2"
	Rate    float64       // for EventRate: the fraction of its configured rate the key now goes at, from 0.01 to 1
	// Costs, for the events of a reservation (wait, refuse, cancel,
	// class), are its estimated costs under each limit, by name; for
	// EventSettle, the actual costs as settled. Nil for other events.
	Costs Costs
	// Estimate, for EventSettle, is the reservation's estimate under
	// each limit, by name.
	Estimate Costs
	// DryRun, for EventWait and EventRefuse, says that the limiter is a
	// dry run (WithDryRun): the caller did not wait, nor was refused.
	DryRun bool
}

// An EventKind says what an Event reports.
type EventKind uint8

const (
	// EventWait: cost units were granted; the caller waits Delay, then goes.
	EventWait EventKind = iota + 1
	// EventRefuse: nothing was booked, since a wait of Delay would pass the
	// caller's deadline or the maximum wait; Err is a *DeadlineError.
	EventRefuse
	// EventCancel: the caller's context ended during its wait; its booking
	// was given back (Err says if that failed).
	EventCancel
	// EventFallback: Redis calls failed, as the breaker confirmed (Err
	// says how), and until Redis is back the limiter decides by its
	// FailurePolicy. When Redis has never answered this process (a wrong
	// address, a wrong DB, Redis down at start), Reason says so, and what
	// follows, in words that suit any program's log (in Go, Redis.Check
	// finds it at start, and WithFleetSize sets the share paced meanwhile).
	EventFallback
	// EventProbe: after a cool-down, one request tried Redis again and
	// failed (Err says how); the next cool-down is longer.
	EventProbe
	// EventRecover: a probe succeeded; the shared limit is back. Delay is how
	// long the limiter went without Redis.
	EventRecover
	// EventHold: the upstream said Key's quota is spent (Reason), and the key
	// is held for Delay, for the whole fleet. A hold that would not outlast
	// one already in place changes nothing and is not reported.
	EventHold
	// EventHoldCapped: the upstream asked for a hold longer than the
	// limiter's MaxHold (WithMaxHold); Delay is what it asked for, and the hold is
	// reported (EventHold) at the cap.
	EventHoldCapped
	// EventHoldEnd: a hold this process set has run its course.
	EventHoldEnd
	// EventReading: a response's counters steered Key (see Redis.Sync):
	// Cost units were left, for Delay, as Reason (the header) said.
	EventReading
	// EventStaleReading: a sync found that the counters of a request booked
	// later had steered Key already, and ignored these. (Readings a
	// process can tell are stale it drops unasked, and unheard.)
	EventStaleReading
	// EventLearned: Key's limit adopted the rate the upstream advertised, as
	// Reason says.
	EventLearned
	// EventSlot: the request holds one of the slots of Key's cap in
	// flight (Concurrent), after Delay in line.
	EventSlot
	// EventSlotRelease: the request ended and freed its slot (Err says if
	// Redis could not be told; the slot then lapses with its lease).
	EventSlotRelease
	// EventSlotAbandon: a response body showed no sign of life for Delay, a
	// lease, and was never closed: its slot is left to lapse.
	EventSlotAbandon
	// EventSlotExpire: Cost slots of Key lapsed, their holders gone
	// without releasing them (a process that died, a body never closed),
	// and went to the next in line.
	EventSlotExpire
	// EventClass: a request of a lower priority class (Reason) found Key's
	// schedule booked past its horizon, and waits Delay before it books.
	EventClass
	// EventFail: while Redis is away, FailClosed failed the request (Err
	// wraps ErrUnavailable).
	EventFail
	// EventSettleCapped: a settlement's actual cost (Cost) was more than its
	// limit (Reason) can ever hold, or a debt that would delay Key beyond
	// the limiter's MaxHold, and was capped, as Reason says.
	EventSettleCapped
	// EventRate: the upstream refused a request of Key and no counters
	// explain it (a 429 or 503, with a Retry-After or without),
	// and Key's rate was cut to Rate, a share of its configured rate, for
	// the whole fleet, back at its configured rate within Delay unless
	// refused again; or (Rate 1) it is back at its configured rate.
	EventRate
	// EventIgnored: what a response said of Key lies beyond the limiter's
	// MaxHold (a window that resets later, a window of a limit that
	// learns longer, Delay), and was ignored as that response's foreign
	// data; Reason is the header.
	EventIgnored
	// EventRepay: the process is back on Redis after an outage, and booked
	// on Key what its local pacing granted of Key meanwhile: Cost units
	// under the first limit (at most a burst beyond an empty bucket, a
	// window's count beyond a full window). Err says if Redis could not be
	// told.
	EventRepay
	// EventSettle: a reservation of Key was settled (see Reservation): Costs
	// are the actual costs under each limit, as capped, and Estimate the
	// estimate; or it could not be, and Err says why, such as a Settler's
	// cost under a limit the quota lacks (Costs are then nil). A
	// reservation settled again does nothing, and is not reported.
	EventSettle
	// EventMismatch: another process paces Key at another limit (a deploy
	// rolling out a new one), as Reason says: both limits, and the
	// stricter, which the fleet keeps until all agree. Reported once a
	// second at most, for a key of one bucket.
	EventMismatch
)

var eventKindNames = [...]string{
	EventWait: "wait", EventRefuse: "refuse", EventCancel: "cancel",
	EventFallback: "fallback", EventProbe: "probe", EventRecover: "recover",
	EventHold: "hold", EventHoldCapped: "hold-capped", EventHoldEnd: "hold-end",
	EventReading: "reading", EventStaleReading: "stale-reading", EventLearned: "learned",
	EventSlot: "slot", EventSlotRelease: "slot-release", EventSlotAbandon: "slot-abandon", EventSlotExpire: "slot-expire",
	EventClass: "class", EventFail: "fail", EventSettleCapped: "settle-capped", EventRate: "rate", EventIgnored: "ignored",
	EventRepay: "repay", EventSettle: "settle", EventMismatch: "mismatch",
}

// String returns the kind's name, such as "wait" or "fallback".
func (k EventKind) String() string {
	if int(k) < len(eventKindNames) && eventKindNames[k] != "" {
		return eventKindNames[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

func (o Observer) emit(ctx context.Context, e Event) {
	if o != nil {
		o(ctx, e)
	}
}
