package pace

import (
	"context"
	"errors"
	"time"

	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
)

// A booker is what the wait loop asks of a limiter, Local or Redis: one
// loop for both (waitLoop), each with its own store.
type booker interface {
	// book books the wait of q, or refuses it: with a *deferral when it is
	// beyond the horizon of q's class only. It does not sleep.
	book(ctx context.Context, q request) (ticket, error)
	// lineUp waits for the turn of a request q its class kept out of the
	// schedule, whose wait comes within its horizon after earliest.
	lineUp(ctx context.Context, q request, earliest time.Duration) error
	// sleep sleeps for t's delay, unless ctx ends first or q's key is
	// retimed meanwhile (steer.ErrRetimed).
	sleep(ctx context.Context, q request, t ticket) error
	// rebook gives back what t booked before the retime err voided it.
	rebook(ctx context.Context, q request, t ticket, err error)
	// giveBack returns what t booked, for a caller whose wait ended early
	// with err, and returns err with anything that went wrong.
	giveBack(ctx context.Context, q request, t ticket, err error) error
	// keep reports whether t, slept, stands: no hold replaced its slot
	// meanwhile.
	keep(ctx context.Context, q request, t ticket) bool
	// observe is the limiter's observer.
	observe() Observer
}

// waitLoop books the wait of q on b and sleeps until it is due, booking
// anew after a hold that replaced its slot meanwhile, a retime that voided
// its booking, or its class's turn, and returns what it booked.
func waitLoop(ctx context.Context, b booker, q request) (ticket, error) {
	for turn := false; ; {
		qt := atTurn(q, turn)
		t, err := b.book(ctx, qt)
		if d, ok := asDeferral(err); ok {
			if err, turn = b.lineUp(ctx, qt, d.delay-qt.horizon), true; err == nil {
				continue // its turn has come
			}
		}
		if err != nil {
			return ticket{}, err
		}
		b.observe().emit(ctx, Event{Kind: EventWait, Limiter: t.limiter, Key: q.Key, Cost: q.Costs[0], Delay: t.delay, Err: t.cause})
		switch err := b.sleep(ctx, q, t); {
		case errors.Is(err, steer.ErrRetimed):
			b.rebook(ctx, q, t, err)
			continue // the key's pace changed while this caller slept
		case err != nil:
			return ticket{}, b.giveBack(ctx, q, t, err)
		}
		if b.keep(ctx, q, t) {
			return t, nil
		}
		// The upstream asked the fleet to hold off while this caller
		// slept: its slot belongs to a schedule the hold replaced.
	}
}

// request is one wait: what its booking needs, the horizon of its class (0
// for none; see Class), and what became of it so far.
type request struct {
	store.Request
	horizon  time.Duration
	own      time.Duration // the caller's budget, before its class narrowed it
	failures int           // its Redis calls that failed, unconfirmed, so far
}

// atTurn is q, with twice the horizon of its class when its turn has come
// (see Class).
func atTurn(q request, turn bool) request {
	if turn {
		q.horizon *= 2
	}
	return q
}

// refuseOrDefer refuses q's wait of delay, beyond budget, as limiter
// decided, and tells o: a *deferral, which o hears of when its line is
// joined, when it is beyond the horizon of q's class only.
func refuseOrDefer(ctx context.Context, o Observer, limiter string, q request, delay, budget time.Duration) error {
	if defers(delay, q.own, q.horizon) {
		return &deferral{delay: delay}
	}
	return refuse(ctx, o, limiter, q.Key, q.Costs[0], delay, budget)
}

// A ticket is a wait that a limiter granted: how long it is, who decided
// it, and what to give back should its caller stop waiting.
type ticket struct {
	limiter   string // "redis", "local" or "open"
	delay     time.Duration
	start     time.Time     // when the decision began, by the limiter's clock
	cause     error         // why Redis did not decide, if it did not
	booking   store.Booking // Redis's booking, when its Granted
	local     *Local        // the local limiter that booked the wait too, or nil
	res       localBooking
	listening bool // the key's rate listens for a success (see internal/steer)
}
