package pace

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/store"
)

// A backend is a limiter of pace's own, Local or Redis: the Transport asks it
// one question per request and hands it the answer. It takes the request's
// slot under a cap in flight (TakeSlot), waits for its grant (waitGrant)
// or reserves its estimated costs (Reserve), heeds what the response says
// of the key (heed: holds, counters, refusals), and settles the
// reservation once the body ends (Settle). The protocol is unexported: a
// Limiter of a user's (a decorator, a test's fake) is waited on, and no
// more. A decorator that had to forward six interfaces to be steered was
// the widest seam of the package, and every new thing a response could say
// widened it; an Observer sees every decision without standing between
// the Transport and its limiter.
type backend interface {
	Limiter
	Acquire(ctx context.Context, key string, cost int) (*Slot, error)
	TakeSlot(ctx context.Context, key string) (*Slot, error)
	Hold(ctx context.Context, key string, h headers.Hold) error
	Reserve(ctx context.Context, key string, estimate Costs) (*Reservation, error)
	Settle(ctx context.Context, r *Reservation, actual Costs) error
	MaxCost() int
	// waitGrant waits as Wait does, and returns what it booked, by which
	// the response steers the key.
	waitGrant(ctx context.Context, key string, cost int) (grant, error)
	// admit takes a slot of at's key's cap in flight, when the quota has
	// one, and waits for cost under its rate limits, as Acquire does, and
	// returns the slot (nil without a cap) and what the wait booked: on
	// a pool, the key that can go soonest (see target).
	admit(ctx context.Context, at target, cost int) (*Slot, grant, error)
	// reserveFor reserves as Reserve does, on at (see target).
	reserveFor(ctx context.Context, at target, estimate Costs) (*Reservation, error)
	// heed applies w, what the response to the request granted as g
	// said of key (see pacing.heed), as far as h allows: its holds, its
	// counters, a refusal without a word. It runs past ctx's end; failures
	// reach the limiter's observer.
	heed(ctx context.Context, key string, g grant, w headers.Word, h heedScope)
	// longestHold is the longest hold the limiter sets (WithMaxHold).
	longestHold() time.Duration
	// unsettled tells the observer that res will not be settled: its
	// response's body was collected before it ended (see endingBody).
	unsettled(ctx context.Context, res *Reservation)
}

var (
	_ backend = (*Redis)(nil)
	_ backend = (*Local)(nil)
)

// backendOf returns l as a backend when l is pace's own limiter itself. A
// type of a user's that embeds *Redis or *Local (a decorator, the Go way)
// has the backend's methods too, promoted; taken for pace's own, its Wait
// would never be called. It is a Limiter of the user's, waited on.
func backendOf(l Limiter) (backend, bool) {
	switch p := l.(type) {
	case *Redis:
		return p, true
	case *Local:
		return p, true
	}
	return nil, false
}

// limiterType names l's type in an error that says it is not pace's own
// limiter, and, for a decorator that embeds one, what to pass instead.
func limiterType(l Limiter) string {
	if _, embeds := l.(backend); embeds {
		return fmt.Sprintf("%T, which embeds one but is a Limiter of yours, waited on and no more (pass the limiter it embeds)", l)
	}
	return fmt.Sprintf("%T", l)
}

// A grant is what a backend granted one wait (waitGrant), or one reservation
// (Reservation.granted): the booking that a response to its request
// steers. The zero grant is a wait no limiter booked.
type grant struct{ booking }

// heedScope says what a response may steer.
type heedScope struct {
	// holds: a Retry-After, or a body that says when to retry, holds the
	// key (see Transport.IgnoreHolds).
	holds bool
	// counters: the upstream's counters steer the key on a Redis (see
	// Transport.IgnoreCounters).
	counters bool
	// refusals: a refusal that the counters do not explain cuts the
	// key's rate (see Transport.IgnoreRefusals).
	refusals bool
}

// A target is what a wait books on: key; or, for a pool, whichever of
// its keys can go soonest, each asked from pool[first] on (key is then
// pool[first]).
type target struct {
	key   string
	pool  []string
	first int
}

// A booking is what one wait took of a key's schedule: how long the wait
// is, who decided it (Redis, a Local, or no one), and what to give back
// should its caller stop waiting.
type booking struct {
	limiter string        // "redis", "local" or "open"
	cause   error         // why Redis did not decide, if it did not
	redis   store.Booking // Redis's booking, when its Granted; a leased one's Now alone
	local   *Local        // the local limiter that booked the wait too, or nil
	leased  bool          // taken from a lease of the key's tokens (see redis_tokenlease.go)
	localBooking
}

// localBooking is what a wait booked that a Local, alone, fills in: a
// Local's Wait needs no more (nor to clear the rest of a booking).
type localBooking struct {
	key       string // the key booked: on a pool, the one that could go soonest
	delay     time.Duration
	start     time.Time // when the decision began, by the limiter's clock
	buckets   bucketsBooked
	listening bool // the key's rate listens for a success (see internal/steer)
}
