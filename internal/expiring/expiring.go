// Package expiring keeps per-key values that may each be forgotten after a
// time of their own, in constant time per insert (amortized), however many
// keys there are: the registry behind a process's holds, retimes and
// classes.
package expiring

import "time"

// A Map maps keys to values that each may be forgotten after a time of
// their own (an entry past it may be returned until it is swept, so its
// owner reads the value, not the time). Expired entries are swept when the
// map has doubled since the last sweep, so each insert costs constant time
// (amortized), and the map holds at most twice the keys alive at its last
// sweep. It is not safe for concurrent use: its owner keeps a lock. The
// zero Map is empty and ready.
type Map[V any] struct {
	m       map[string]entry[V]
	sweepAt int // the size at which the next insert sweeps
}

type entry[V any] struct {
	value V
	until time.Time // the entry may be forgotten once now is past it
}

// minSweep is the least size at which a Map sweeps.
const minSweep = 64

// Get returns key's value.
func (e *Map[V]) Get(key string) (V, bool) {
	x, ok := e.m[key]
	return x.value, ok
}

// Put sets key's value, to be forgotten after until.
func (e *Map[V]) Put(key string, value V, until, now time.Time) {
	if e.m == nil {
		e.m = make(map[string]entry[V])
	}
	if _, ok := e.m[key]; !ok && len(e.m) >= max(e.sweepAt, minSweep) {
		for k, x := range e.m {
			if now.After(x.until) {
				delete(e.m, k)
			}
		}
		e.sweepAt = 2 * len(e.m)
	}
	e.m[key] = entry[V]{value, until}
}

// Len returns how many entries the map holds, some of them maybe expired.
func (e *Map[V]) Len() int { return len(e.m) }

// Each calls f with each entry not expired at now.
func (e *Map[V]) Each(now time.Time, f func(key string, value V)) {
	for k, x := range e.m {
		if !now.After(x.until) {
			f(k, x.value)
		}
	}
}

// Latest keeps, for each key, the latest of the times heard for it (on a
// clock of its owner's, such as Redis's in microseconds), until it may be
// forgotten (by the process's clock). It is not safe for concurrent use.
type Latest struct{ times Map[int64] }

// Note notes at for key, to be forgotten after forget.
func (l *Latest) Note(key string, at int64, forget, now time.Time) {
	if old, ok := l.times.Get(key); !ok || at > old {
		l.times.Put(key, at, forget, now)
	}
}

// Get returns the latest time heard for key.
func (l *Latest) Get(key string) (int64, bool) { return l.times.Get(key) }

// Len returns how many keys it holds, some of them maybe expired.
func (l *Latest) Len() int { return l.times.Len() }
