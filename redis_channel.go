package pace

import (
	"context"
	"math"
	"time"

	"github.com/fleetpace/pace/internal/steer"
	"github.com/redis/go-redis/v9"
)

// The fleet's channel: one Pub/Sub channel per prefix, on which the
// scripts publish what every process must hear at once: each hold (see
// redis_hold.go), each retime of a key (internal/steer), and each slot handed to
// a process's waiter (redis_slots.go). Each Redis limiter listens on a
// goroutine of its own.

// subscriber is a client that can listen on Pub/Sub channels.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// subscribe starts the subscription through which the limiter hears of
// the fleet's holds, on a goroutine of its own, so that no request waits
// for it (see listen). Close ends it.
func (r *Redis) subscribe() {
	s, ok := r.client.(subscriber)
	if !ok {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	ps := s.Subscribe(ctx) // no channel yet: no I/O on the caller's goroutine
	r.stopListening = func() {
		stop()
		ps.Close()
	}
	r.listening.Go(func() { r.receiveHolds(ctx, ps) })
}

// Resubscribing after a broken subscription waits from minResubscribe,
// doubling up to maxResubscribe, while Redis stays away.
const (
	minResubscribe = 10 * time.Millisecond
	maxResubscribe = 100 * time.Millisecond
)

// receiveHolds reads the hold channel until ctx ends. After a broken
// connection, go-redis subscribes again on the next Receive, and messages
// published in between are lost to this process: so resubscribed says, from
// the break on, that the subscription is broken, and then since when it
// stands again. A caller booked before that reads its key's hold from Redis
// when it wakes (replacedByHold).
func (r *Redis) receiveHolds(ctx context.Context, ps *redis.PubSub) {
	err := ps.Subscribe(ctx, r.holdChannel())
	for retry := minResubscribe; ctx.Err() == nil; {
		if err != nil {
			r.resubscribed.Store(math.MaxInt64)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, maxResubscribe)
		}
		var msg any
		msg, err = ps.Receive(ctx)
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && r.resubscribed.Load() == math.MaxInt64 {
				r.resubscribed.Store(r.now().UnixNano())
				retry = minResubscribe
			}
		case *redis.Message:
			if key, end, d, ok := parseHoldMessage(m.Payload); ok {
				r.heard(key, end, d)
			} else if key, at, after, cut, ok := steer.ParseMessage(m.Payload); ok {
				r.retimes.Add(key, at, after, cut, r.now())
				r.voidLeases(key)
			} else if id, ok := parseSlotMessage(m.Payload); ok {
				r.slotWaiters.tell(id)
			}
		}
	}
}

// holdChannel is the Pub/Sub channel of the limiter's holds.
func (r *Redis) holdChannel() string { return r.config.prefix + "holds" }

// Close stops the limiter listening for the fleet's holds and waits until it
// has. A limiter that lives as long as its process need not be closed. Close
// does not close the client.
func (r *Redis) Close() error {
	r.listenOnce.Do(func() {}) // no listening after Close
	if r.stopListening != nil {
		r.stopListening()
	}
	r.listening.Wait()
	r.tokens.refills.Wait()
	r.failover.Close()
	return nil
}
