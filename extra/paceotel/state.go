package paceotel

import (
	"sync"
	"sync/atomic"
	"time"
)

// sleepers are the callers asleep: when each wakes, in UnixNano. Each
// operation first forgets those that woke, so that the sleepers stay as
// many as the callers asleep whether or not a reader ever counts them (a
// no-op MeterProvider never does). Each wake is in two heaps, one that
// finds the earliest (the next to wake) and one that finds the latest (the
// one a cancellation forgets), and every operation takes O(log n).
type sleepers struct {
	mu    sync.Mutex
	wakes []sleeper // by id; the ids in free are unused
	free  []int32
	heaps [2][]int32 // sleepers' ids as binary heaps: by side, the earliest wake on top, or the latest
}

// A sleeper is one caller's wake, and where it is in each heap.
type sleeper struct {
	wake int64
	at   [2]int
}

const (
	earliest = 0
	latest   = 1
)

// add notes a caller asleep until wake; now is the time.
func (s *sleepers) add(now, wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget(now.UnixNano())
	var id int32
	if n := len(s.free); n > 0 {
		id, s.free = s.free[n-1], s.free[:n-1]
	} else {
		id = int32(len(s.wakes))
		s.wakes = append(s.wakes, sleeper{})
	}
	s.wakes[id].wake = wake.UnixNano()
	for side := range s.heaps {
		s.heaps[side] = append(s.heaps[side], id)
		s.wakes[id].at[side] = len(s.heaps[side]) - 1
		s.up(side, len(s.heaps[side])-1)
	}
}

// cancel notes that a caller woke before its time, at now: the one that
// would have slept the longest is forgotten, as the observer cannot tell
// which it was.
func (s *sleepers) cancel(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget(now.UnixNano())
	if len(s.heaps[latest]) > 0 {
		s.remove(s.heaps[latest][0])
	}
}

// count returns how many callers are asleep at now.
func (s *sleepers) count(now time.Time) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget(now.UnixNano())
	return int64(len(s.heaps[earliest]))
}

// forget removes the sleepers awake at now. The caller holds s.mu.
func (s *sleepers) forget(now int64) {
	for h := &s.heaps[earliest]; len(*h) > 0 && s.wakes[(*h)[0]].wake <= now; {
		s.remove((*h)[0])
	}
}

// remove takes sleeper id out of both heaps. The caller holds s.mu.
func (s *sleepers) remove(id int32) {
	for side := range s.heaps {
		i, last := s.wakes[id].at[side], len(s.heaps[side])-1
		s.swap(side, i, last)
		s.heaps[side] = s.heaps[side][:last]
		if i < last {
			s.down(side, i)
			s.up(side, i)
		}
	}
	s.free = append(s.free, id)
}

// before says whether, in the heap of side, the sleeper at i goes before
// the one at j.
func (s *sleepers) before(side, i, j int) bool {
	a, b := s.wakes[s.heaps[side][i]].wake, s.wakes[s.heaps[side][j]].wake
	if side == latest {
		return a > b
	}
	return a < b
}

// swap swaps the sleepers at i and j in the heap of side.
func (s *sleepers) swap(side, i, j int) {
	h := s.heaps[side]
	h[i], h[j] = h[j], h[i]
	s.wakes[h[i]].at[side], s.wakes[h[j]].at[side] = i, j
}

// up moves the sleeper at i up the heap of side to its place.
func (s *sleepers) up(side, i int) {
	for ; i > 0 && s.before(side, i, (i-1)/2); i = (i - 1) / 2 {
		s.swap(side, i, (i-1)/2)
	}
}

// down moves the sleeper at i down the heap of side to its place.
func (s *sleepers) down(side, i int) {
	for {
		first := i
		for _, child := range [2]int{2*i + 1, 2*i + 2} {
			if child < len(s.heaps[side]) && s.before(side, child, first) {
				first = child
			}
		}
		if first == i {
			return
		}
		s.swap(side, i, first)
		i = first
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
	swept  int // how many shares the last sweep left
}

type rateShare struct {
	share float64
	until time.Time // back at 1 by then
}

// set notes, at now, that key goes at share until until (share 1:
// recovered). The shares back at their configured rates are swept once
// the map has doubled since the last sweep, so that they stay as many as
// the keys cut lately, whether or not a reader ever reads them, at an
// amortized O(1) a call.
func (r *rates) set(now time.Time, key string, share float64, until time.Time) {
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
	if len(r.shares) > 2*r.swept+16 {
		r.sweep(now)
	}
}

// sweep forgets the shares back at their configured rates at now. The
// caller holds r.mu.
func (r *rates) sweep(now time.Time) {
	for key, s := range r.shares {
		if !now.Before(s.until) {
			delete(r.shares, key)
		}
	}
	r.swept = len(r.shares)
}

// each calls f for each key's share at now (for all keys, 1 when none was
// cut), and forgets those back at their configured rate.
func (r *rates) each(now time.Time, f func(key string, share float64)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweep(now)
	if _, ok := r.shares[""]; !ok && len(r.shares) == 0 {
		f("", 1)
	}
	for key, s := range r.shares {
		f(key, s.share)
	}
}
