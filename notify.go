package pace

import (
	"context"
	"math"
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
	n  atomic.Int32 // how many, read without the lock on every wake
	mu sync.Mutex
	m  latestHeard
}

// add notes that key is held until end (Redis's clock, in microseconds), a
// hold of d from now.
func (h *heldKeys) add(key string, end int64, d time.Duration, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.note(key, end, now.Add(d+time.Second), now)
	h.n.Store(int32(h.m.times.len()))
}

// before reports whether a slot for key (Redis's clock, in microseconds)
// falls before the end of a hold: the booking predates the hold.
func (h *heldKeys) before(key string, slot int64) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	end, ok := h.m.latest(key)
	return ok && slot < end
}

// A retime voids the bookings made before it: their callers, asleep in any
// process, wake and book anew, at the new pace. The sync script publishes
// "KEY\nretime AT" on the hold channel when the interval a key learned
// changed (internal/store/lua/sync.lua, which takes the bookings out of the schedule
// itself), and the refused script "KEY\nrate AT" when a refusal cut the
// key's rate (internal/store/lua/refused.lua: the callers give their bookings back); AT
// is by Redis's clock, in microseconds. Each limiter notes when each key
// was retimed, and wakes its sleepers, which book anew if theirs was.
type retimes struct {
	mu   sync.Mutex
	wake chan struct{} // closed at the next retime
	keys latestHeard   // retimes of learned limits
	cuts latestHeard   // retimes of cut rates
	told latestHeard   // bookings whose success this process told Redis of (see news)
}

// signal returns a channel that is closed at the next retime of any key.
func (r *retimes) signal() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

// add notes that key was retimed at at (its rate cut, when cut), and wakes
// the sleepers.
func (r *retimes) add(key string, at int64, cut bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	heard := &r.keys
	if cut {
		heard = &r.cuts
	}
	heard.note(key, at, now.Add(time.Minute), now)
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// after reports whether key was retimed after a booking decided at booked
// (Redis's clock, in microseconds), and whether by a cut of its rate.
func (r *retimes) after(key string, booked int64) (retimed, cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	learned, ok1 := r.keys.latest(key)
	recut, ok2 := r.cuts.latest(key)
	cut = ok2 && recut > booked
	return cut || (ok1 && learned > booked), cut
}

// news reports whether the success of a request booked at booked, while
// key's rate listened for one (see refusals.go), is news to Redis: unless
// the refused script would ignore it (a booking before the latest cut this
// process heard of), or this process has told it of a success since that
// cut already. Each request a cut woke books anew while the rate listens:
// without this, each of them would tell. A success told is noted at once,
// so that the others of its cut stay silent while it is told.
func (r *retimes) news(key string, booked int64, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cut, known := r.cuts.latest(key)
	if !known {
		return true // the cut came before this process listened, or its message was lost
	}
	if told, ok := r.told.latest(key); booked < cut || ok && told >= cut {
		return false
	}
	r.told.note(key, booked, now.Add(time.Minute), now)
	return true
}

// latestHeard keeps, for each key, the latest of the times heard for it
// (Redis's clock, in microseconds), until it may be forgotten (by this
// process's clock).
type latestHeard struct{ times expiringMap[int64] }

// note notes at for key, to be forgotten after forget.
func (l *latestHeard) note(key string, at int64, forget, now time.Time) {
	if old, ok := l.times.get(key); !ok || at > old {
		l.times.put(key, at, forget, now)
	}
}

// latest returns the latest time heard for key.
func (l *latestHeard) latest(key string) (int64, bool) { return l.times.get(key) }

// sleep sleeps for delay, unless ctx ends first, or key is retimed
// meanwhile, after a booking decided at booked (on the clock of the
// retimes, in microseconds): then it returns errRetimed, or errRecut for a
// cut of the key's rate.
func (r *retimes) sleep(ctx context.Context, key string, delay time.Duration, booked int64) error {
	if delay <= 0 {
		return nil // inlined: a grant at once costs no call
	}
	return r.sleepFor(ctx, key, delay, booked)
}

// sleepFor is sleep's wait, for a delay above zero.
func (r *retimes) sleepFor(ctx context.Context, key string, delay time.Duration, booked int64) error {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		wake := r.signal()
		if retimed, cut := r.after(key, booked); cut {
			return errRecut
		} else if retimed {
			return errRetimed
		}
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return waitEnded(ctx, key, delay)
		case <-wake:
		}
	}
}

// parseRetimeMessage reads what the sync and refused scripts publish on a
// retime: the key, a newline, "retime" or "rate" (cut says which) and its
// time, in microseconds of Redis's clock.
func parseRetimeMessage(payload string) (key string, at int64, cut, ok bool) {
	key, rest, ok := strings.Cut(payload, "\n")
	atText, found := strings.CutPrefix(rest, "retime ")
	if !found {
		atText, cut = strings.CutPrefix(rest, "rate ")
	}
	at, err := strconv.ParseInt(atText, 10, 64)
	return key, at, cut, ok && (found || cut) && err == nil
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
		ps := s.Subscribe(ctx) // no channel yet: no I/O on the caller's goroutine
		r.stopListening = func() {
			stop()
			ps.Close()
		}
		r.listening.Go(func() { r.receiveHolds(ctx, ps) })
	})
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
			} else if key, at, cut, ok := parseRetimeMessage(m.Payload); ok {
				r.retimes.add(key, at, cut, r.now())
			} else if id, ok := parseSlotMessage(m.Payload); ok {
				r.slotWaiters.tell(id)
			}
		}
	}
}

// missedHolds reports whether a caller booked at start may have missed a
// hold's message: the subscription broke after it.
func (r *Redis) missedHolds(start time.Time) bool {
	return r.resubscribed.Load() > start.UnixNano()
}

// heard notes a hold of key that ends at end (Redis's clock, in
// microseconds), a hold of d from now.
func (r *Redis) heard(key string, end int64, d time.Duration) {
	now := r.now()
	r.held.add(key, end, d, now)
	r.failover.Held(key, now.Add(d), now)
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
