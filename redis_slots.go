package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/pace/internal/outage"
	"github.com/fleetpace/pace/internal/store"
)

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
	case t.limiter != redisLimiter: // decided without Redis: the slot, as the FailurePolicy says, after the wait
		slot, err := r.TakeSlot(ctx, key)
		return slot, grant{t}, err
	}
	r.config.observer.emit(ctx, Event{Kind: EventSlot, Limiter: redisLimiter, Key: key, Cost: 1}) // no time in line
	return newSlot(ctx, redisSlots{r}, key, q.Take.ID, redisLimiter, r.lease(), r.config.observer), grant{t}, nil
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
	r.config.observer.emit(ctx, Event{Kind: EventSlot, Limiter: redisLimiter, Key: key, Cost: 1, Delay: r.now().Sub(start)})
	return newSlot(ctx, redisSlots{r}, key, id, redisLimiter, r.lease(), r.config.observer), nil
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
		r.config.observer.emit(ctx, Event{Kind: EventSlotExpire, Limiter: redisLimiter, Key: key, Cost: int(reply.Expired)})
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
