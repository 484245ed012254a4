package pace

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

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
