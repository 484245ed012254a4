package pace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// WithSlot returns ctx marked as the context of a request that holds slot
// (from TakeSlot): Local's and Redis's waits for the slot's key, with it, take no
// slot of their own. A nil slot leaves ctx as it is.
func WithSlot(ctx context.Context, slot *Slot) context.Context {
	if slot == nil {
		return ctx
	}
	return holdingSlot(ctx, slot.key)
}

// WithBodyAlwaysClosed returns ctx marked as the context of a request
// whose response body the caller always closes, however slowly it reads it:
// a proxy that copies the body to its own client (httputil.ReverseProxy
// closes it as it returns). Under a cap in flight, a Transport's request
// with it holds its slot until the body ends or closes; without it, a body
// that shows no sign of life for a lease lets its slot lapse, which is
// what a forgotten body needs, and what a proxy whose client paused
// reading must not have: its upstream still sends.
func WithBodyAlwaysClosed(ctx context.Context) context.Context {
	return context.WithValue(ctx, alwaysClosedMark{}, true)
}

// alwaysClosedMark marks a context of WithBodyAlwaysClosed.
type alwaysClosedMark struct{}

// bodyAlwaysClosed reports whether ctx is marked by WithBodyAlwaysClosed.
func bodyAlwaysClosed(ctx context.Context) bool {
	closed, _ := ctx.Value(alwaysClosedMark{}).(bool)
	return closed
}

// A Slot is one request's place under a cap of requests in flight. Its
// lease is renewed every third of the lease (see WithLease) until Release.
// It is safe for concurrent use.
type Slot struct {
	key      string
	id       string
	owner    slotOwner // nil when no cap took a slot
	lease    time.Duration
	limiter  string // "redis" or "local", for events
	observer Observer
	ctx      context.Context // for events; never cancelled

	calls    sync.Mutex // one renewal or release at a time
	mu       sync.Mutex
	timer    *time.Timer
	released bool

	watched  atomic.Bool  // the request's end is watched (a Transport's body): idle slots lapse
	lastUse  atomic.Int64 // UnixNano of the request's last sign of life, when watched
	inFlight atomic.Int32 // uses under way (a RoundTrip, a Read)
}

// slotOwner keeps the slots of one limiter: in Redis, or in this process.
type slotOwner interface {
	// renew extends the lease of key's slot id, taking it again if it
	// lapsed.
	renew(ctx context.Context, key, id string) error
	// release frees key's slot id.
	release(ctx context.Context, key, id string) error
}

// newSlot returns the slot id of key, held from now, and starts renewing it.
func newSlot(ctx context.Context, owner slotOwner, key, id, limiter string, lease time.Duration, o Observer) *Slot {
	s := &Slot{key: key, id: id, owner: owner, lease: lease, limiter: limiter, observer: o, ctx: context.WithoutCancel(ctx)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = time.AfterFunc(lease/3, s.renew)
	return s
}

// Key returns the key the slot was taken under.
func (s *Slot) Key() string { return s.key }

// Release frees the slot for the next request in line, in the whole fleet.
// Only the first call does anything. It returns what went wrong, which the
// limiter's observer hears too: a slot Redis could not be told of lapses
// at the end of its lease.
func (s *Slot) Release() error {
	if s == nil || s.owner == nil || !s.stop() {
		return nil
	}
	s.calls.Lock()
	defer s.calls.Unlock()
	err := s.owner.release(s.ctx, s.key, s.id)
	s.observer.emit(s.ctx, Event{Kind: EventSlotRelease, Limiter: s.limiter, Key: s.key, Cost: 1, Err: err})
	return err
}

// stop ends the renewals, once: it reports whether this call did.
func (s *Slot) stop() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return false
	}
	s.released = true
	s.timer.Stop()
	return true
}

// renew extends the lease, unless the slot was released, or its request's
// end is watched and it gave no sign of life for a lease: then the slot is
// left to lapse, and the observer hears of it.
func (s *Slot) renew() {
	if idle := s.idle(time.Now()); idle >= s.lease {
		if s.stop() {
			err := fmt.Errorf("pace: key %s: a response body idle for %v and never closed: its slot lapses", store.QuoteKey(s.key), idle.Round(time.Millisecond))
			s.observer.emit(s.ctx, Event{Kind: EventSlotAbandon, Limiter: s.limiter, Key: s.key, Cost: 1, Delay: idle, Err: err})
		}
		return
	}
	s.calls.Lock()
	defer s.calls.Unlock()
	s.mu.Lock()
	released := s.released
	s.mu.Unlock()
	if released {
		return
	}
	s.owner.renew(s.ctx, s.key, s.id) // a failure reaches the observer; the next renewal tries again
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.released {
		s.timer.Reset(s.lease / 3)
	}
}

// watch starts watching the slot's request for signs of life (use): from
// now on, a slot whose request shows none for a lease lapses.
func (s *Slot) watch(now time.Time) {
	if s != nil {
		s.lastUse.Store(now.UnixNano())
		s.watched.Store(true)
	}
}

// use notes that the request is alive: begin is true as a use begins
// (a Read), false as it ends.
func (s *Slot) use(begin bool, now time.Time) {
	if s == nil {
		return
	}
	if begin {
		s.inFlight.Add(1)
	} else {
		s.inFlight.Add(-1)
	}
	s.lastUse.Store(now.UnixNano())
}

// idle is how long the watched request has shown no sign of life; 0 when
// it is not watched or a use is under way.
func (s *Slot) idle(now time.Time) time.Duration {
	if !s.watched.Load() || s.inFlight.Load() > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, s.lastUse.Load()))
}

// errCapped is the error of Wait and Reserve on a limiter whose quota caps
// requests in flight: they cannot say when the request ends.
func errCapped(key string, limit Limit) error {
	return &requestError{fmt.Sprintf("pace: key %s: the quota caps requests in flight (%s): take a slot with Acquire (a Transport does), not Wait or Reserve", store.QuoteKey(key), limit)}
}

// slotCap is a limiter's cap of requests in flight, when its quota has one.
type slotCap struct {
	limit  Limit
	capped bool // the quota has a cap
	rated  bool // the quota has rate limits too
}

// newSlotCap splits a checked quota into its rate limits and its cap.
func newSlotCap(limits []Limit) ([]Limit, slotCap) {
	rates, limit, capped := splitCap(limits)
	return rates, slotCap{limit: limit, capped: capped, rated: len(rates) > 0}
}

// keptCap is c, the cap of a limiter whose configuration is config: none
// for a dry run (see WithDryRun), which may not be of a cap alone, whose
// dry run would record nothing.
func keptCap(c slotCap, config *commonConfig) (slotCap, error) {
	switch {
	case !config.dryRun:
		return c, nil
	case !c.rated:
		return c, fmt.Errorf("pace: WithDryRun on a quota of a cap in flight alone (%s): a dry run records the waits of rate limits", c.limit)
	}
	return slotCap{rated: true}, nil
}

// smallestBurst is the most a request may cost under every limit of rates:
// their smallest burst or window count, or, without any, no bound.
func smallestBurst(rates []Limit) int {
	least := math.MaxInt
	for _, l := range rates {
		least = min(least, l.burst)
	}
	return least
}

// check reports a wait or reservation that a cap forbids: on a capped
// quota, one whose context does not carry a slot of key (see holdingSlot).
func (c *slotCap) check(ctx context.Context, key string) error {
	if c.needsSlot(ctx, key) {
		return errCapped(key, c.limit)
	}
	return nil
}

// needsSlot reports whether the quota has a cap and ctx carries no slot of
// key.
func (c *slotCap) needsSlot(ctx context.Context, key string) bool {
	return c.capped && ctx.Value(slotMark{}) != key
}

// waitWithSlot is Wait on a capped quota for a caller that holds no slot
// of key: it takes one, waits for cost under the rates, and frees it.
func waitWithSlot(ctx context.Context, l backend, key string, cost int) error {
	if err := checkWait(ctx, l.MaxCost(), key, cost); err != nil {
		return err
	}
	slot, err := acquire(ctx, l, key, cost)
	if err == nil {
		slot.Release()
	}
	return err
}

// slotMark marks a context whose request holds a slot of a key (its value):
// Wait and Reserve then pace it by the rate limits alone.
type slotMark struct{}

// holdingSlot returns ctx marked as the context of a request that holds a
// slot of key.
func holdingSlot(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, slotMark{}, key)
}

// acquire takes a slot of key from l, when its quota has a cap, then waits
// for cost under its rate limits (see backend.admit); if that fails, the
// slot goes back. Without a cap, the slot is one whose Release does
// nothing.
func acquire(ctx context.Context, l backend, key string, cost int) (*Slot, error) {
	slot, _, err := l.admit(ctx, target{key: key}, cost)
	if err == nil && slot == nil {
		slot = &Slot{key: key}
	}
	return slot, err
}

// slotThenWait takes a slot of key from l, when its quota has a cap, in line
// if it must, then waits for cost under its rate limits, and returns both;
// if the wait fails, the slot goes back.
func slotThenWait(ctx context.Context, l backend, key string, cost int) (*Slot, grant, error) {
	slot, err := l.TakeSlot(ctx, key)
	if err != nil {
		return nil, grant{}, err
	}
	g, err := l.waitGrant(WithSlot(ctx, slot), key, cost)
	if err != nil {
		slot.Release()
		return nil, grant{}, err
	}
	return slot, g, nil
}

// errSlotBusy says that a booking that would have taken a slot of its
// key's cap with it found none free, and booked nothing.
var errSlotBusy = errors.New("pace: no slot free")

// The slots of a Redis limiter's cap of requests in flight live in Redis
// (see lua/slots.lua): a lease per holder, a line of waiters. A request
// takes a slot in one script call when one is free; else it joins the line
// and sleeps until the call that frees a slot hands it over and tells it on
// the hold channel, or until the first holder's lease may lapse, or a third
// of its own lease has passed (then it renews its place, and learns of a
// slot whose message it missed). While Redis is away, the FailurePolicy
// decides: FallbackLocal takes a slot of this process's share of the cap.
