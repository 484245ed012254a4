package pace

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/fleetpace/pace/internal/store"
)

// A Syncer is a Reserver that the upstream's counters can steer: Redis. A
// Transport whose Limiter is a Syncer reads every response's counters
// (ParseReadings) and syncs the request's key with them by itself; a
// caller with a client of its own reserves each request and syncs it.
type Syncer interface {
	Reserver
	// Sync steers the key of r, whose response said what readings say,
	// for the whole fleet (see Redis.Sync); refused says the upstream
	// refused the request (a 429).
	Sync(ctx context.Context, r *Reservation, readings []Reading, refused bool) error
}

// steering is what one reading tells one limit of the quota.
type steering struct {
	store.Steer
	header  string // the header or field the reading came from
	bounded bool   // the limit's bounds changed the interval advertised
}

// syncEvery is how often, at most, a process steers one key, unless a
// limit advertised changed or the upstream refused a request: each sync is
// a script call of its own, beside the requests'. A process does not sync
// a reading it can tell is stale.
const syncEvery = 50 * time.Millisecond

// Sync implements Syncer; refused says the upstream refused the request (a
// 429), so that its units, which it did not spend, count as such. Each reading steers the bucket of the quota named
// like it (or, when the response has one reading and the quota one limit,
// that limit), in one script call, atomic, on Redis's clock:
//
//   - the units the fleet booked after the request res are taken off what
//     the reading says is left: the upstream had not counted them;
//   - what else went since the last reading, beyond the fleet's own
//     bookings, others spent (a consumer pace does not see, or a rate set
//     higher than the upstream's): the bucket keeps an estimate of their
//     rate, averaged over about half a second, and the fleet books at the
//     limit's rate less theirs, leaving them what they spend in the next
//     50 ms (for a window, until its reset); when they stop, the estimate
//     decays and the fleet speeds up again;
//   - for a quota that refills (Reading.Refills, a token bucket upstream),
//     the bucket's level becomes what is left for the fleet;
//   - for a window, what is left for the fleet is spread evenly until the
//     window resets, one request at a time, instead of a burst and then a
//     stall; once none is left, requests wait for the reset and then go at
//     the limit's rate, as after a Hold; while others seem to spend all
//     that is left, one request a second goes, to hear whether they still
//     do;
//   - a limit that learns (Limit.Learn) adopts the rate the reading
//     advertises.
//
// A reading applies only when its request went no sooner than the request
// of the last reading applied to the bucket: an older one, come late,
// never loosens the state, and readings from many processes at once
// converge. Sliding and fixed windows (Window, FixedWindow) are not
// steered; a reading whose name matches no token bucket is ignored. A
// process syncs one key at most every 50 ms; readings in between are
// dropped. The observer hears each reading applied (EventReading), ignored
// as stale (EventStaleReading), and each limit learned (EventLearned), with
// the header that said so.
//
// The steering assumes the limit's burst is the upstream's (for a quota
// that refills) and keeps the steered bucket for at least a minute after
// its last reading.
func (r *Redis) Sync(ctx context.Context, res *Reservation, readings []Reading, refused bool) error {
	if res == nil || res.limiter != r {
		return &requestError{"pace: Sync: a reservation this limiter did not make"}
	}
	return r.sync(ctx, res.key, res.ticket.booking, readings, refused, r.now())
}

// sync steers key by the readings of the response to the request booked as
// b, which arrived at arrival; refused, the request was refused (a 429).
// Readings of a refusal are never dropped: they account for units not
// spent. Readings this process can tell are stale are dropped unasked.
func (r *Redis) sync(ctx context.Context, key string, b store.Booking, readings []Reading, refused bool, arrival time.Time) error {
	if !b.Granted {
		return nil // booked without Redis
	}
	now := r.now()
	var steers []steering
	var reply store.SyncReply
	_, err := r.shared(ctx, key, false, func() (err error) {
		steers = r.steerings(ctx, key, readings, now.Sub(arrival))
		if len(steers) == 0 || !r.syncs.due(key, b, steers, refused, now) {
			steers = nil
			return nil
		}
		reply, err = r.store.Sync(ctx, key, b, plainSteers(steers), refused, r.holdChannel())
		return err
	})
	if steers == nil {
		return nil // nothing to steer, or Redis away
	}
	if err != nil {
		return err
	}
	r.syncs.note(key, steers, reply, now)
	for i, st := range steers {
		kinds := [...][]EventKind{{EventStaleReading}, {EventReading}, {EventReading, EventLearned}}[min(reply.Results[i], 2)]
		for _, kind := range kinds {
			e := Event{Kind: kind, Limiter: "redis", Key: key, Cost: int(st.Remaining), Delay: st.Reset, Reason: st.header}
			if kind == EventLearned && st.bounded {
				e.Reason += " (kept within " + r.limits[st.Limit].learnText()[len(" learn"):] + ")"
			}
			r.config.observer.emit(ctx, e)
		}
	}
	return nil
}

// steerings returns what readings tell the limits of key they steer,
// elapsed after the response arrived. A reading that resets, or (for a
// limit that learns) whose window ends, beyond the limiter's MaxHold is
// the response's foreign data, which the observer hears ignored.
func (r *Redis) steerings(ctx context.Context, key string, readings []Reading, elapsed time.Duration) []steering {
	bound := r.config.holdBound()
	var steers []steering
	for _, reading := range readings {
		i := r.limitOf(reading.Name, reading.own, len(readings) == 1)
		if i < 0 || r.limits[i].kind != bucket || reading.Reset <= elapsed {
			continue
		}
		l := r.limits[i]
		learns, window := l.learn.on && reading.Limit > 0, cmp.Or(reading.Window, l.period)
		if reading.Reset > bound || (learns && window > bound) {
			r.config.observer.emit(ctx, Event{Kind: EventIgnored, Limiter: "redis", Key: key, Delay: max(reading.Reset, window), Reason: reading.Header})
			continue
		}
		st := steering{Steer: store.Steer{Limit: i, Remaining: reading.Remaining, Reset: reading.Reset - elapsed, Refills: reading.Refills}, header: reading.Header}
		if learns {
			st.Learned, st.bounded = l.learned(reading.Limit, window, bound)
		}
		steers = append(steers, st)
	}
	return steers
}

// throttle says, per key, whether a sync is due: one that may apply (of a
// request booked after the last reading applied, as far as this process
// knows), at most one every syncEvery, or one that must be heard (a
// refusal, or a limit advertised anew). It forgets keys not synced for a
// minute, once a second.
type throttle struct {
	mu        sync.Mutex
	keys      map[string]*throttled
	nextSweep time.Time
}

// throttled is what a process knows of a key's steering: when its next
// sync is due, when it last synced, the intervals it last heard advertised
// and each bucket's SYNCED after its last sync, by limit.
type throttled struct {
	next, last      time.Time
	learned, synced [store.MaxLimits]int64
	known           bool // synced is known
}

// due reports whether to sync steers at now, of the request booked as b
// (refused, if the upstream refused it), and if so notes it.
func (t *throttle) due(key string, b store.Booking, steers []steering, refused bool, now time.Time) bool {
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
	k.next, k.last = now.Add(syncEvery), now
	return true
}

// note notes what a sync of key for steers replied.
func (t *throttle) note(key string, steers []steering, reply store.SyncReply, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.entry(key, now)
	for i, st := range steers {
		k.synced[st.Limit] = reply.Synced[i]
	}
	k.known = true
}

// entry returns key's entry, and forgets the keys not synced for a minute.
func (t *throttle) entry(key string, now time.Time) *throttled {
	if !now.Before(t.nextSweep) {
		for k, e := range t.keys {
			if now.Sub(e.last) > time.Minute {
				delete(t.keys, k)
			}
		}
		t.nextSweep = now.Add(time.Second)
	}
	if t.keys == nil {
		t.keys = make(map[string]*throttled)
	}
	k, ok := t.keys[key]
	if !ok {
		k = &throttled{last: now}
		t.keys[key] = k
	}
	return k
}

// plainSteers are what steers tell the store.
func plainSteers(steers []steering) []store.Steer {
	plain := make([]store.Steer, len(steers))
	for i, st := range steers {
		plain[i] = st.Steer
	}
	return plain
}
