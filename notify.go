package pace

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A hold must stop every request of the fleet, also those already booked
// and asleep, in every process. So the hold script publishes each hold, and
// every Redis limiter listens: a caller that wakes to find that its slot lies
// before the end of a hold (both by Redis's clock) books again, after the
// hold, instead of going.

// heldKeys are the holds a process has heard of: when each ends, by
// Redis's clock.
type heldKeys struct {
	n  atomic.Int32 // len(m), read without the lock on every wake
	mu sync.Mutex
	m  map[string]heldKey
}

type heldKey struct {
	end    int64     // Redis's clock, in microseconds
	forget time.Time // by this process's clock: when the hold is surely over
}

// add notes that key is held until end (Redis's clock, in microseconds), a
// hold of d from now.
func (h *heldKeys) add(key string, end int64, d time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]heldKey)
	}
	for k, held := range h.m {
		if now.After(held.forget) {
			delete(h.m, k)
		}
	}
	if held, ok := h.m[key]; !ok || end > held.end {
		h.m[key] = heldKey{end: end, forget: now.Add(d + time.Second)}
	}
	h.n.Store(int32(len(h.m)))
}

// before reports whether a slot for key (Redis's clock, in microseconds)
// falls before the end of a hold: the booking predates the hold.
func (h *heldKeys) before(key string, slot int64) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	held, ok := h.m[key]
	return ok && slot < held.end
}

// subscriber is a client that can listen on Pub/Sub channels.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// parseHoldMessage reads what the hold script publishes: the key, a
// newline, the hold's end and its length, in microseconds of Redis's clock.
func parseHoldMessage(payload string) (key string, end int64, d time.Duration, ok bool) {
	key, rest, ok := strings.Cut(payload, "\n")
	endText, lengthText, ok2 := strings.Cut(rest, " ")
	end, err1 := strconv.ParseInt(endText, 10, 64)
	length, err2 := strconv.ParseInt(lengthText, 10, 64)
	if !ok || !ok2 || err1 != nil || err2 != nil || length <= 0 {
		return "", 0, 0, false
	}
	return key, end, time.Duration(length) * time.Microsecond, true
}

// listen starts, once, the subscription through which the limiter hears of
// the fleet's holds, on a goroutine of its own, so that no request waits for
// it. Close ends it.
func (r *Redis) listen() {
	r.listenOnce.Do(func() {
		s, ok := r.client.(subscriber)
		if !ok {
			return
		}
		ctx, stop := context.WithCancel(context.Background())
		r.stopListening = stop
		r.listening.Add(1)
		go func() {
			defer r.listening.Done()
			ps := s.Subscribe(ctx, r.holdChannel())
			defer ps.Close()
			messages := ps.Channel()
			for {
				select {
				case <-ctx.Done():
					return
				case msg, ok := <-messages:
					if !ok {
						return
					}
					if key, end, d, ok := parseHoldMessage(msg.Payload); ok {
						r.held.add(key, end, d)
					}
				}
			}
		}()
	})
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
	return nil
}
