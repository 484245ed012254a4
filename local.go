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
	// emptyAt, if set, is when the buckets of keys met later were empty: a
	// Redis limiter's fallback starts so, lest each process burst its share
	// on top of what Redis granted just before.
	emptyAt time.Time
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
	limiters  map[string]*rate.Limiter
	holds     map[string]time.Time // keys held until then
	nextSweep time.Time
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
	return newLocal(l, config), nil
}

// newLocal returns a Local of a valid limit and configuration.
func newLocal(l Limit, config commonConfig) *Local {
	loc := &Local{limit: l, config: config, now: time.Now, seed: maphash.MakeSeed()}
	loc.refill = time.Duration(l.burst) * time.Duration(float64(l.period)/l.count)
	for i := range loc.shards {
		loc.shards[i].limiters = make(map[string]*rate.Limiter)
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
	now := loc.now()
	shard := loc.shard(key)
	shard.mu.Lock()
	lim := shard.limiter(loc, key, now)
	// The booking may begin now, or at the end of a hold, or (for a Redis
	// limiter's fallback) when the buckets were empty. x/time/rate forgets a
	// time ahead of now unless the reservation is made at it.
	at := now
	if until, held := shard.holds[key]; held && until.After(at) {
		at = until
	}
	if loc.emptyAt.After(at) {
		at = loc.emptyAt
	}
	if at.Equal(now) && lim.AllowN(now, cost) {
		shard.mu.Unlock()
		loc.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "local", Key: key, Cost: cost})
		return nil
	}
	// Under the shard's lock nobody else can book on lim, so a reservation
	// cancelled at once is given back whole: nothing stays booked.
	r := lim.ReserveN(at, cost)
	delay := r.DelayFrom(now)
	if budget := waitBudget(ctx, loc.config.maxWait, now); budget != noBudget && delay > budget {
		r.CancelAt(now)
		shard.mu.Unlock()
		return refuse(ctx, loc.config.observer, "local", key, cost, delay, budget)
	}
	shard.mu.Unlock()
	loc.config.observer.emit(ctx, Event{Kind: EventWait, Limiter: "local", Key: key, Cost: cost, Delay: delay})
	if err := sleep(ctx, key, delay); err != nil {
		r.CancelAt(loc.now())
		loc.config.observer.emit(ctx, Event{Kind: EventCancel, Limiter: "local", Key: key, Cost: cost, Delay: delay, Err: err})
		return err
	}
	if shard.heldPast(key, now.Add(delay)) {
		// A hold came while this caller slept, and its slot lies before the
		// hold's end: it books anew, after the hold.
		return loc.Wait(ctx, key, cost)
	}
	return nil
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
	lim := shard.limiter(loc, key, now)
	changed := !shard.holds[key].After(until)
	if changed {
		shard.holds[key] = until
		lim.ReserveN(until, loc.limit.burst-1) // all but the token of the first grant after the hold
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

// heldPast reports whether key is held beyond slot.
func (s *localShard) heldPast(key string, slot time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, held := s.holds[key]
	return held && slot.Before(until)
}

// limiter returns key's limiter, creating it if needed. Once per refill
// period (at least a second) it first drops the limiters whose buckets are
// full again, since a new one would behave the same. The caller holds s.mu.
func (s *localShard) limiter(loc *Local, key string, now time.Time) *rate.Limiter {
	if !now.Before(s.nextSweep) {
		for k, lim := range s.limiters {
			if lim.TokensAt(now) >= float64(loc.limit.burst) {
				delete(s.limiters, k)
			}
		}
		for k, until := range s.holds {
			if !until.After(now) {
				delete(s.holds, k)
			}
		}
		s.nextSweep = now.Add(max(loc.refill, time.Second))
	}
	lim, ok := s.limiters[key]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(loc.limit.Rate()), loc.limit.burst)
		if !loc.emptyAt.IsZero() {
			lim.AllowN(loc.emptyAt, loc.limit.burst)
		}
		s.limiters[key] = lim
	}
	return lim
}
