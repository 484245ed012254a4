package paceotel

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// sleepers are the callers asleep: when each wakes, in UnixNano, as a
// binary min-heap.
type sleepers struct {
	mu    sync.Mutex
	wakes []int64
}

// add notes a caller asleep until wake.
func (s *sleepers) add(wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakes = append(s.wakes, wake.UnixNano())
	for i := len(s.wakes) - 1; i > 0 && s.wakes[(i-1)/2] > s.wakes[i]; i = (i - 1) / 2 {
		s.wakes[i], s.wakes[(i-1)/2] = s.wakes[(i-1)/2], s.wakes[i]
	}
}

// cancel notes that a caller woke before its time: the one that would have
// slept the longest is forgotten, as the observer cannot tell which it was.
func (s *sleepers) cancel() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.wakes) == 0 {
		return
	}
	// The latest wake is a leaf: removing it and sifting up the leaf put in
	// its place keeps the heap.
	i := len(s.wakes)/2 + slices.Index(s.wakes[len(s.wakes)/2:], slices.Max(s.wakes[len(s.wakes)/2:]))
	last := len(s.wakes) - 1
	s.wakes[i] = s.wakes[last]
	s.wakes = s.wakes[:last]
	for ; i > 0 && i < len(s.wakes) && s.wakes[(i-1)/2] > s.wakes[i]; i = (i - 1) / 2 {
		s.wakes[i], s.wakes[(i-1)/2] = s.wakes[(i-1)/2], s.wakes[i]
	}
}

// count returns how many callers are asleep at now, and forgets those that
// woke.
func (s *sleepers) count(now time.Time) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.wakes) > 0 && s.wakes[0] <= now.UnixNano() {
		s.pop()
	}
	return int64(len(s.wakes))
}

// pop removes the earliest wake. The caller holds s.mu.
func (s *sleepers) pop() {
	last := len(s.wakes) - 1
	s.wakes[0] = s.wakes[last]
	s.wakes = s.wakes[:last]
	for i := 0; ; {
		least := i
		for _, child := range []int{2*i + 1, 2*i + 2} {
			if child < len(s.wakes) && s.wakes[child] < s.wakes[least] {
				least = child
			}
		}
		if least == i {
			return
		}
		s.wakes[i], s.wakes[least] = s.wakes[least], s.wakes[i]
		i = least
	}
}

// unavailable says whether the limiter paces without Redis.
type unavailable struct{ down atomic.Bool }

func (u *unavailable) set(down bool) { u.down.Store(down) }

func (u *unavailable) value() int64 {
	if u.down.Load() {
		return 1
	}
	return 0
}

// rates are the shares of their configured rates that keys go at after
// refusals, until each is back at its configured rate (its share is then
// 1, and forgotten), by key: "" for all keys, when the observer does not
// tell keys apart.
type rates struct {
	mu     sync.Mutex
	shares map[string]rateShare
}

type rateShare struct {
	share float64
	until time.Time // back at 1 by then
}

// set notes that key goes at share until until (share 1: recovered).
func (r *rates) set(key string, share float64, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shares == nil {
		r.shares = make(map[string]rateShare)
	}
	if share >= 1 {
		delete(r.shares, key)
		return
	}
	r.shares[key] = rateShare{share, until}
}

// each calls f for each key's share at now (for all keys, 1 when none was
// cut), and forgets those back at their configured rate.
func (r *rates) each(now time.Time, f func(key string, share float64)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, s := range r.shares {
		if !now.Before(s.until) {
			delete(r.shares, key)
		}
	}
	if _, ok := r.shares[""]; !ok && len(r.shares) == 0 {
		f("", 1)
	}
	for key, s := range r.shares {
		f(key, s.share)
	}
}
