package pace

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Local paces events within one process, with one golang.org/x/time/rate
// limiter per key. A key's limiter is created on first use and dropped within
// a refill period (the time an empty bucket takes to fill, at least a second)
// of being full again, when a new one would behave the same; so a crawler
// that meets millions of hosts keeps only the recently busy ones.
//
// A Local is safe for concurrent use. Create it with NewLocal.
type Local struct {
	limit  Limit
	config commonConfig
	now    func() time.Time // time.Now, or a test's clock
	// emptyAt, if set, is when the buckets of keys met later were empty, or,
	// for the keys in floors, the later time there: a Redis limiter's
	// outage starts so, lest each process burst its share on top of what
	// Redis granted just before. floors is not changed after creation.
	emptyAt time.Time
	floors  map[string]time.Time
	refill  time.Duration // how long an empty bucket takes to fill
	seed    maphash.Seed
	shards  [localShards]localShard
}

// localShards spreads keys over independent locks, so that callers on
// different keys rarely wait for one another, and a sweep holds up only a
// small part of the keys.
const localShards = 32

type localShard struct {
	mu        sync.Mutex
	limiters  map[string]*localKey
	holds     map[string]time.Time // keys held until then
	nextSweep time.Time
}

// localKey is a key's limiter and the latest time a reservation was made
// at. x/time/rate takes a time before its last one for the last one and
// counts the time between twice, so no reservation or cancellation is made
// before it: a booking at a time ahead (the end of a hold, a slot Redis gave)
// makes the ones after it begin there too.
type localKey struct {
	lim  *rate.Limiter
	last time.Time
}

var _ Holder = (*Local)(nil)

// NewLocal returns a Local that gives each key the limit l.
func NewLocal(l Limit, opts ...Option) (*Local, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if l.kind != bucket {
		return nil, fmt.Errorf("pace: NewLocal(%s): windows need a Redis limiter; Local paces token buckets", l)
	}
	var config commonConfig
	for _, o := range opts {
		o.applyLocal(&config)
	}
	if err := config.validate(); err != nil {
		return nil, err
	}
	return newLocal(l, config, time.Now), nil
}

// newLocal returns a Local of a valid limit and configuration, on a clock.
func newLocal(l Limit, config commonConfig, now func() time.Time) *Local {
	loc := &Local{limit: l, config: config, now: now, seed: maphash.MakeSeed()}
	loc.refill = time.Duration(l.burst) * time.Duration(float64(l.period)/l.count)
	for i := range loc.shards {
		loc.shards[i].limiters = make(map[string]*localKey)
		loc.shards[i].holds = make(map[string]time.Time)
	}
	return loc
}

// Wait implements Limiter. It books cost tokens for key and sleeps until they
// are due; if ctx ends first, the tokens go back to the bucket.
func (loc *Local) Wait(ctx context.Context, key string, cost int) error {
	if err := checkWait(ctx, loc.limit.burst, key, cost); err != nil {
		return err
	}
	for {
		now := loc.now()
		budget := waitBudget(ctx, loc.config.maxWait, now)
		res, delay, ok := loc.reserve(key, cost, now, now, budget)
		if !ok {
			return refuse(ctx, loc.config.observer, "local", key, cost, delay, budget)
		}
		loc.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "local", Key: key, Cost: cost, Delay: delay})
		if err := sleep(ctx, key, delay); err != nil {
			loc.cancel(key, res, loc.now())
			loc.config.observer.emit(ctx, Event{Kind: EventCancel, Limiter: "local", Key: key, Cost: cost, Delay: delay, Err: err})
			return err
		}
		if delay == 0 || !loc.heldPast(key, now.Add(delay)) {
			return nil
		}
		// A hold came while this caller slept, and its slot lies before
		// the hold's end: it books anew, after the hold.
	}
}

// reserve books cost tokens for key at notBefore or later (and after any
// hold), and returns the reservation and the delay from now until it is
// due. When that delay would exceed budget, it books nothing and returns
// false with the delay. A grant due at once may come without a reservation
// (nil): there is nothing to give back.
func (loc *Local) reserve(key string, cost int, now, notBefore time.Time, budget time.Duration) (*rate.Reservation, time.Duration, bool) {
	shard := loc.shard(key)
	shard.mu.Lock()
	k := shard.limiter(loc, key, now)
	// x/time/rate forgets a time ahead of now unless the reservation is
	// made at it: the booking begins at the latest of now, notBefore, the
	// end of a hold and the key's last reservation.
	at := latest(k.last, notBefore)
	if len(shard.holds) > 0 {
		at = latest(at, shard.holds[key])
	}
	if !at.After(now) {
		at = now
		if k.last = now; k.lim.AllowN(now, cost) {
			shard.mu.Unlock()
			return nil, 0, true
		}
	}
	// Under the shard's lock nobody else can book on the limiter, so a
	// reservation cancelled at once is given back whole.
	k.last = at
	r := k.lim.ReserveN(at, cost)
	delay := r.DelayFrom(now)
	if delay > budget {
		r.CancelAt(at)
		r = nil
	}
	shard.mu.Unlock()
	return r, delay, r != nil
}

// cancel gives back reservation r of key, at now or, if that is earlier,
// at the key's last reservation time. It does nothing for a nil r.
func (loc *Local) cancel(key string, r *rate.Reservation, now time.Time) {
	if r == nil {
		return
	}
	shard := loc.shard(key)
	shard.mu.Lock()
	defer shard.mu.Unlock()
	if k, ok := shard.limiters[key]; ok {
		k.last = latest(now, k.last)
		r.CancelAt(k.last)
	}
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Hold implements Holder: the next wait for key ends no sooner than h.For
// from now, and the ones after it follow at the rate.
func (loc *Local) Hold(ctx context.Context, key string, h Hold) error {
	if err := checkHold(key, h); err != nil {
		return err
	}
	now := loc.now()
	until := now.Add(h.For)
	shard := loc.shard(key)
	shard.mu.Lock()
	k := shard.limiter(loc, key, now)
	changed := !shard.holds[key].After(until)
	if changed {
		shard.holds[key] = until
		k.last = latest(until, k.last)
		k.lim.ReserveN(k.last, loc.limit.burst-1) // all but the token of the first grant after the hold
	}
	shard.mu.Unlock()
	reportHold(ctx, loc.config.observer, "local", key, h, changed)
	return nil
}

func (loc *Local) shard(key string) *localShard {
	return &loc.shards[maphash.String(loc.seed, key)%localShards]
}

// Len returns how many keys have a limiter at the moment.
func (loc *Local) Len() int {
	n := 0
	for i := range loc.shards {
		s := &loc.shards[i]
		s.mu.Lock()
		n += len(s.limiters)
		s.mu.Unlock()
	}
	return n
}

// heldPast reports whether key is held beyond slot: a booking at slot was
// made before the hold.
func (loc *Local) heldPast(key string, slot time.Time) bool {
	s := loc.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	until, held := s.holds[key]
	return held && slot.Before(until)
}

// limiter returns key's limiter, creating it if needed. Once per refill
// period (at least a second) it first drops the limiters whose buckets are
// full again, since a new one would behave the same. The caller holds s.mu.
func (s *localShard) limiter(loc *Local, key string, now time.Time) *localKey {
	if !now.Before(s.nextSweep) {
		for name, k := range s.limiters {
			if !k.last.After(now) && k.lim.TokensAt(now) >= float64(loc.limit.burst) {
				delete(s.limiters, name)
			}
		}
		for k, until := range s.holds {
			if !until.After(now) {
				delete(s.holds, k)
			}
		}
		s.nextSweep = now.Add(max(loc.refill, time.Second))
	}
	k, ok := s.limiters[key]
	if !ok {
		k = &localKey{lim: rate.NewLimiter(rate.Limit(loc.limit.Rate()), loc.limit.burst)}
		if !loc.emptyAt.IsZero() {
			k.last = latest(loc.emptyAt, loc.floors[key])
			k.lim.AllowN(k.last, loc.limit.burst)
		}
		s.limiters[key] = k
	}
	return k
}
