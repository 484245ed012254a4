package pace

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/outage"
	"github.com/fleetpace/pace/internal/store"
)

// The slots of a Redis limiter's cap of requests in flight live in Redis
// (see internal/store/lua/slots.lua): a lease per holder, a line of waiters. A request
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
	count uint64 // ids minted
}

// join mints an id for a request of the limiter member that joins a line, and returns
// it with the channel that tells it its slot.
func (w *slotWaiters) join(member string) (string, chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ids == nil {
		w.ids = make(map[string]chan struct{})
	}
	w.count++
	id := member + ":" + strconv.FormatUint(w.count, 10)
	told := make(chan struct{}, 1)
	w.ids[id] = told
	return id, told
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

// TakeSlot implements Slotter: one of the slots of the quota's cap in
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
	c.Name, c.Limit, c.Lease, c.Channel = limitName(r.cap.limit), r.cap.limit.burst, r.lease(), r.holdChannel()
	reply, err := r.store.Slots(ctx, key, c)
	if reply.Expired > 0 {
		r.config.observer.emit(ctx, Event{Kind: EventSlotExpire, Limiter: "redis", Key: key, Cost: int(reply.Expired)})
	}
	return reply, err
}

// lease is how long a slot outlives its holder's last renewal.
func (r *Redis) lease() time.Duration { return r.config.leaseOrDefault() }

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
