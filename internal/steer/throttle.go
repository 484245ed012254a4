package steer

import (
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/expiring"
	"github.com/fleetpace/pace/internal/store"
)

// SyncEvery is how often, at most, a process steers one key, unless a
// limit advertised changed or the upstream refused a request: each sync is
// a script call of its own, beside the requests'. A process does not sync
// a reading it can tell is stale.
const SyncEvery = 50 * time.Millisecond

// A Throttle says, per key, whether a sync is due: one that may apply (of
// a request booked after the last reading applied, as far as this process
// knows), at most one every SyncEvery, or one that must be heard (a
// refusal, or a limit advertised anew). It forgets a key a minute after its
// last sync. The zero Throttle is ready.
type Throttle struct {
	mu   sync.Mutex
	keys expiring.Map[*throttled]
}

// throttled is what a process knows of a key's steering: when its next
// sync is due, when it last synced, the intervals it last heard advertised and each bucket's
// SYNCED after its last sync, by limit.
type throttled struct {
	next, last      time.Time
	learned, synced [store.MaxLimits]int64
	known           bool // synced is known
}

// forgetAfter is how long a Throttle keeps a key after its last sync.
const forgetAfter = time.Minute

// Due reports whether to sync steers at now, of the request booked as b
// (refused, if the upstream refused it), and if so notes it.
func (t *Throttle) Due(key string, b store.Booking, steers []store.Steer, refused bool, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.entry(key, now)
	heard, fresh := refused, !k.known
	for _, st := range steers {
		heard = heard || (st.Learned > 0 && st.Learned != k.learned[st.Limit])
		k.learned[st.Limit] = st.Learned
		fresh = fresh || b.Booked[st.Limit] > k.synced[st.Limit]
	}
	if !heard && (!fresh || now.Before(k.next)) {
		return false
	}
	k.next, k.last = now.Add(SyncEvery), now
	t.keys.Put(key, k, now.Add(forgetAfter), now)
	return true
}

// Note notes what a sync of key for steers replied.
func (t *Throttle) Note(key string, steers []store.Steer, reply store.SyncReply, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.entry(key, now)
	for i, st := range steers {
		k.synced[st.Limit] = reply.Synced[i]
	}
	k.known = true
}

// entry returns key's entry, new if it has none or has not synced for
// forgetAfter.
func (t *Throttle) entry(key string, now time.Time) *throttled {
	k, ok := t.keys.Get(key)
	if !ok || now.Sub(k.last) > forgetAfter {
		k = &throttled{last: now}
		t.keys.Put(key, k, now.Add(forgetAfter), now)
	}
	return k
}
