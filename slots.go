package pace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/outage"
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
func waitWithSlot(ctx context.Context, l pacer, key string, cost int) error {
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
// for cost under its rate limits (see pacer.admit); if that fails, the
// slot goes back. Without a cap, the slot is one whose Release does
// nothing.
func acquire(ctx context.Context, l pacer, key string, cost int) (*Slot, error) {
	slot, _, err := l.admit(ctx, target{key: key}, cost)
	if err == nil && slot == nil {
		slot = &Slot{key: key}
	}
	return slot, err
}

// slotThenWait takes a slot of key from l, when its quota has a cap, in line
// if it must, then waits for cost under its rate limits, and returns both;
// if the wait fails, the slot goes back.
func slotThenWait(ctx context.Context, l pacer, key string, cost int) (*Slot, grant, error) {
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

// admitCapped is admit under a cap in flight. While Redis answers, a
// request under a cap with rates takes a free slot with its booking, in one
// script call (lua/take.lua); when none is free, or someone waits for one,
// it goes in line (TakeSlot), then waits.
func (r *Redis) admitCapped(ctx context.Context, key string, cost int) (*Slot, grant, error) {
	if !r.cap.rated {
		return slotThenWait(ctx, r, key, cost)
	}
	if err := checkWait(ctx, r.costCap, key, cost); err != nil {
		return nil, grant{}, err
	}
	q := request{Request: store.Request{Key: key, Costs: uniform(cost, len(r.limits))}}
	q.Take = store.SlotTake{ID: r.slotWaiters.mint(r.id), Cap: r.slotCap}
	q.horizon = horizonOf(ctx, &r.config.commonConfig, r.limits, &q.Costs)
	t, err := r.wait(ctx, q)
	switch {
	case errors.Is(err, errSlotBusy):
		return slotThenWait(ctx, r, key, cost)
	case err != nil:
		if mayHaveTaken(err) && r.failover.Mode() != outage.Outage {
			r.slotCall(context.WithoutCancel(ctx), key, store.SlotCall{Op: store.SlotRelease, ID: q.Take.ID})
		}
		return nil, grant{}, err
	case t.limiter != "redis": // decided without Redis: the slot, as the FailurePolicy says, after the wait
		slot, err := r.TakeSlot(ctx, key)
		return slot, grant{t}, err
	}
	r.config.observer.emit(ctx, Event{Kind: EventSlot, Limiter: "redis", Key: key, Cost: 1}) // no time in line
	return newSlot(ctx, redisSlots{r}, key, q.Take.ID, "redis", r.lease(), r.config.observer), grant{t}, nil
}

// mayHaveTaken reports whether a wait that took its slot with its booking
// (Redis.admit) and failed with err may hold the slot: not when its
// booking was refused, whose script frees any slot the request held
// (lua/take.lua), so that the common failure, a caller's deadline, costs
// no call to free it.
func mayHaveTaken(err error) bool {
	var refused *DeadlineError
	return !errors.As(err, &refused)
}

// The slots of a Redis limiter's cap of requests in flight live in Redis
// (see lua/slots.lua): a lease per holder, a line of waiters. A request
// takes a slot in one script call when one is free; else it joins the line
// and sleeps until the call that frees a slot hands it over and tells it on
// the hold channel, or until the first holder's lease may lapse, or a third
// of its own lease has passed (then it renews its place, and learns of a
// slot whose message it missed). While Redis is away, the FailurePolicy
// decides: FallbackLocal takes a slot of this process's share of the cap.

// slotWaiters are the requests of this process in line for a slot, by id,
// each told by a channel when the hold channel says its slot is there.
type slotWaiters struct {
	mu    sync.Mutex
	ids   map[string]chan struct{}
	count atomic.Uint64 // ids minted
}

// join mints an id for a request of the limiter member that joins a line, and returns
// it with the channel that tells it its slot.
func (w *slotWaiters) join(member string) (string, chan struct{}) {
	id := w.mint(member)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ids == nil {
		w.ids = make(map[string]chan struct{})
	}
	told := make(chan struct{}, 1)
	w.ids[id] = told
	return id, told
}

// mint returns a new id of a request of the limiter member, unique in the
// fleet.
func (w *slotWaiters) mint(member string) string {
	return member + ":" + strconv.FormatUint(w.count.Add(1), 10)
}

// leave forgets id.
func (w *slotWaiters) leave(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.ids, id)
}

// tell tells id, if it waits here, that its slot is there.
func (w *slotWaiters) tell(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if told, ok := w.ids[id]; ok {
		select {
		case told <- struct{}{}:
		default:
		}
	}
}

// parseSlotMessage reads what the slots script publishes when it hands a
// slot to a waiter: the key, a newline, "slot" and the waiter's id.
func parseSlotMessage(payload string) (id string, ok bool) {
	_, rest, ok := strings.Cut(payload, "\n")
	id, found := strings.CutPrefix(rest, "slot ")
	return id, ok && found && id != ""
}

// TakeSlot waits for a slot of key's cap, as Acquire does, but for no
// rate: the caller then waits with WithSlot's context (Wait, which takes
// and frees a slot of its own otherwise, or Reserve, which refuses a key
// with a cap otherwise), and must Release the slot. On a limiter without a
// cap, it returns a nil Slot. It takes one of the slots of the quota's cap in
// Redis, first come first served across the fleet, or, while Redis is away,
// as the FailurePolicy says: FallbackLocal takes a slot of this process's
// share of the cap.
func (r *Redis) TakeSlot(ctx context.Context, key string) (*Slot, error) {
	if !r.cap.capped {
		return nil, nil
	}
	r.listen()
	for failures := 0; ; failures++ {
		slot, err := r.trySlot(ctx, key, failures)
		if !errors.Is(err, errUnconfirmed) {
			return slot, err
		}
		// A place in line that the failed call may have left lapses
		// with its lease.
	}
}

// trySlot takes a slot of key as TakeSlot does, but that it returns
// errUnconfirmed when a Redis call failed and the breaker did not confirm
// an outage; failures are its failed calls so far.
func (r *Redis) trySlot(ctx context.Context, key string, failures int) (*Slot, error) {
	start := r.now()
	route, _, cause := r.failover.Route(start)
	if route == outage.WithoutRedis {
		return r.takeSlotWithout(ctx, key, cause)
	}
	id, told := r.slotWaiters.join(r.id)
	defer r.slotWaiters.leave(id)
	reply, err := r.slotCall(ctx, key, store.SlotCall{Op: store.SlotAcquire, ID: id, Probe: route == outage.ViaProbe})
	away, _, err := r.outcome(ctx, redisCall{key: key, cost: 1, route: route, began: start, failures: failures}, err)
	if err == nil {
		r.beat(ctx, reply.Now, start) // the fleet's size sets the share of the cap should Redis fail
		err = r.waitInLine(ctx, key, id, reply, told)
		if ctx.Err() == nil { // a caller that left the line is no outage
			away, _, err = r.outcome(ctx, redisCall{key: key, cost: 1, route: outage.ViaRedis, began: start, failures: failures}, err)
		}
	}
	if away {
		return r.takeSlotWithout(ctx, key, err)
	}
	if err != nil {
		return nil, err
	}
	r.config.observer.emit(ctx, Event{Kind: EventSlot, Limiter: "redis", Key: key, Cost: 1, Delay: r.now().Sub(start)})
	return newSlot(ctx, redisSlots{r}, key, id, "redis", r.lease(), r.config.observer), nil
}

// waitInLine waits until id, in key's line as reply says, holds a slot: told
// by the hold channel, or finding it at a renewal of its place. A request
// whose place lapsed (Redis lost it) joins the line again. If ctx ends
// first, id leaves the line, or frees the slot it was just given.
func (r *Redis) waitInLine(ctx context.Context, key, id string, reply store.SlotsReply, told <-chan struct{}) error {
	for reply.State != store.SlotHeld {
		timer := time.NewTimer(reply.NextCheck(r.lease()))
		select {
		case <-told:
			timer.Stop()
			return nil
		case <-ctx.Done():
			timer.Stop()
			_, err := r.slotCall(context.WithoutCancel(ctx), key, store.SlotCall{Op: store.SlotRelease, ID: id})
			return errors.Join(fmt.Errorf("pace: key %s: while in line for one of %d slots: %w", store.QuoteKey(key), r.cap.limit.burst, context.Cause(ctx)), err)
		case <-timer.C:
		}
		op := store.SlotWait
		if reply.State == store.SlotNone {
			op = store.SlotAcquire
		}
		var err error
		if reply, err = r.slotCall(ctx, key, store.SlotCall{Op: op, ID: id}); err != nil {
			return err
		}
	}
	return nil
}

// takeSlotWithout takes a slot of key while Redis is away (cause says why),
// as the FailurePolicy says: a slot of this process's share of the cap, no
// slot (FailOpen), or an error (FailClosed).
func (r *Redis) takeSlotWithout(ctx context.Context, key string, cause error) (*Slot, error) {
	switch r.config.policy {
	case FailOpen:
		return &Slot{key: key}, nil
	case FailClosed:
		return nil, r.unavailable(ctx, key, 1, cause)
	}
	return r.fallbackSlots.acquire(ctx, key, max(r.cap.limit.burst/max(r.fleet.Size(), 1), 1))
}

// slotCall calls the slots script to do c's op for key's request c.ID,
// under the quota's cap. Slots of others that lapsed are reported to the
// observer.
func (r *Redis) slotCall(ctx context.Context, key string, c store.SlotCall) (store.SlotsReply, error) {
	c.Cap = r.slotCap
	reply, err := r.store.Slots(ctx, key, c)
	if reply.Expired > 0 {
		r.config.observer.emit(ctx, Event{Kind: EventSlotExpire, Limiter: "redis", Key: key, Cost: int(reply.Expired)})
	}
	return reply, err
}

// lease is how long a slot outlives its holder's last renewal.
func (r *Redis) lease() time.Duration { return r.config.lease }

// redisSlots is the slotOwner of a Redis limiter's slots.
type redisSlots struct{ r *Redis }

func (o redisSlots) renew(ctx context.Context, key, id string) error {
	_, err := o.r.slotCall(ctx, key, store.SlotCall{Op: store.SlotRenew, ID: id})
	return err
}

func (o redisSlots) release(ctx context.Context, key, id string) error {
	_, err := o.r.slotCall(ctx, key, store.SlotCall{Op: store.SlotRelease, ID: id})
	return err
}

// semaphore keeps the slots of a cap of requests in flight in this process,
// by key: leases on the process's clock, and a line of waiters, first come
// first served. Local uses it, and a Redis limiter while Redis is away.
type semaphore struct {
	lease    time.Duration
	now      func() time.Time
	observer Observer
	limiter  string // "local", for events

	mu     sync.Mutex
	keys   map[string]*slotLine
	minted uint64 // ids handed out
}

// slotLine is one key's slots: who holds one until when, who waits, and
// the cap (as the last to join gave it).
type slotLine struct {
	held  map[string]time.Time
	line  []*slotWaiter
	limit int
}

type slotWaiter struct {
	id      string
	granted chan struct{} // closed when the waiter holds a slot
}

func newSemaphore(lease time.Duration, now func() time.Time, o Observer, limiter string) *semaphore {
	return &semaphore{lease: lease, now: now, observer: o, limiter: limiter, keys: make(map[string]*slotLine)}
}

// acquire waits for one of limit slots of key, first come first served,
// until ctx ends, and returns the slot.
func (s *semaphore) acquire(ctx context.Context, key string, limit int) (*Slot, error) {
	start := s.now()
	w, next := s.join(ctx, key, limit, start)
	for waiting := true; waiting; {
		timer := time.NewTimer(next)
		select {
		case <-w.granted:
			waiting = false
		case <-ctx.Done():
			timer.Stop()
			s.release(ctx, key, w.id) // it may have been granted meanwhile
			return nil, fmt.Errorf("pace: key %s: while waiting for one of %d slots: %w", store.QuoteKey(key), limit, context.Cause(ctx))
		case <-timer.C:
			next = s.check(ctx, key)
		}
		timer.Stop()
	}
	s.observer.emit(ctx, Event{Kind: EventSlot, Limiter: s.limiter, Key: key, Cost: 1, Delay: s.now().Sub(start)})
	return newSlot(ctx, s, key, w.id, s.limiter, s.lease, s.observer), nil
}

// join puts a new waiter in key's line, and hands out the free slots. It
// returns the waiter, and when the first lease may lapse (a lease at most).
func (s *semaphore) join(ctx context.Context, key string, limit int, now time.Time) (*slotWaiter, time.Duration) {
	s.mu.Lock()
	l := s.keys[key]
	if l == nil {
		l = &slotLine{held: make(map[string]time.Time)}
		s.keys[key] = l
	}
	l.limit = limit
	s.minted++
	w := &slotWaiter{id: strconv.FormatUint(s.minted, 10), granted: make(chan struct{})}
	l.line = append(l.line, w)
	next, expired := s.handOut(key, l, now)
	s.mu.Unlock()
	s.expired(ctx, key, expired)
	return w, next
}

// expired tells the observer of n slots of key that lapsed.
func (s *semaphore) expired(ctx context.Context, key string, n int) {
	if n > 0 {
		s.observer.emit(ctx, Event{Kind: EventSlotExpire, Limiter: s.limiter, Key: key, Cost: n})
	}
}

// check hands out the slots of key whose leases lapsed, and returns when
// the next may lapse.
func (s *semaphore) check(ctx context.Context, key string) time.Duration {
	s.mu.Lock()
	l := s.keys[key]
	if l == nil {
		s.mu.Unlock()
		return s.lease
	}
	next, expired := s.handOut(key, l, s.now())
	s.mu.Unlock()
	s.expired(ctx, key, expired)
	return next
}

// handOut ends the leases of l that lapsed by now, gives the free slots to
// the first in line, and returns when the first lease left may lapse, and
// how many lapsed. The caller holds s.mu.
func (s *semaphore) handOut(key string, l *slotLine, now time.Time) (next time.Duration, expired int) {
	next = s.lease
	for id, end := range l.held {
		if !end.After(now) {
			delete(l.held, id)
			expired++
			continue
		}
		next = min(next, end.Sub(now))
	}
	for len(l.held) < l.limit && len(l.line) > 0 {
		w := l.line[0]
		l.line = l.line[1:]
		l.held[w.id] = now.Add(s.lease)
		close(w.granted)
	}
	if len(l.held) == 0 && len(l.line) == 0 {
		delete(s.keys, key)
	}
	return next, expired
}

// renew implements slotOwner.
func (s *semaphore) renew(_ context.Context, key, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.keys[key]
	if l == nil {
		l = &slotLine{held: make(map[string]time.Time)}
		s.keys[key] = l
	}
	l.held[id] = s.now().Add(s.lease)
	return nil
}

// release implements slotOwner: it frees key's slot id, or takes id out
// of the line, and hands the free slots out.
func (s *semaphore) release(ctx context.Context, key, id string) error {
	s.mu.Lock()
	l := s.keys[key]
	if l == nil {
		s.mu.Unlock()
		return nil
	}
	delete(l.held, id)
	for i, w := range l.line {
		if w.id == id {
			l.line = append(l.line[:i], l.line[i+1:]...)
			break
		}
	}
	_, expired := s.handOut(key, l, s.now())
	s.mu.Unlock()
	s.expired(ctx, key, expired)
	return nil
}
