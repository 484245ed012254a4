package pace

import "time"

// expiringMap maps keys to values that each may be forgotten after a time
// of their own (an entry past it may be returned until it is swept, so its
// owner reads the value, not the time). Expired entries are swept when the
// map has doubled since the last sweep, so each insert costs constant time
// (amortized), however many keys there are, and the map holds at most
// twice the keys alive at its last sweep. It is not safe for concurrent
// use: its owner keeps a lock.
type expiringMap[V any] struct {
	m       map[string]expiring[V]
	sweepAt int // the size at which the next insert sweeps
}

type expiring[V any] struct {
	value V
	until time.Time // the entry may be forgotten once now is past it
}

// minSweep is the least size at which an expiringMap sweeps.
const minSweep = 64

// get returns key's value.
func (e *expiringMap[V]) get(key string) (V, bool) {
	x, ok := e.m[key]
	return x.value, ok
}

// put sets key's value, to be forgotten after until.
func (e *expiringMap[V]) put(key string, value V, until, now time.Time) {
	if e.m == nil {
		e.m = make(map[string]expiring[V])
	}
	if _, ok := e.m[key]; !ok && len(e.m) >= max(e.sweepAt, minSweep) {
		for k, x := range e.m {
			if now.After(x.until) {
				delete(e.m, k)
			}
		}
		e.sweepAt = 2 * len(e.m)
	}
	e.m[key] = expiring[V]{value, until}
}

// len returns how many entries the map holds, some of them maybe expired.
func (e *expiringMap[V]) len() int { return len(e.m) }

// each calls f with each entry not expired at now.
func (e *expiringMap[V]) each(now time.Time, f func(key string, value V)) {
	for k, x := range e.m {
		if !now.After(x.until) {
			f(k, x.value)
		}
	}
}
