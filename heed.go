package pace

import (
	"context"
	"time"
)

// heeder is a limiter that takes the upstream's word for its keys, one
// response at a time: Local and Redis. A Transport waits on it with
// waitTicket, and hands it what each response said with heed.
type heeder interface {
	// waitTicket waits as Wait does, and returns what it booked.
	waitTicket(ctx context.Context, key string, cost int) (ticket, error)
	// heed applies w, what the response to the request booked as t said of
	// key, as far as o allows. Failures reach the limiter's observer.
	heed(ctx context.Context, key string, t ticket, w word, o heeding)
	// holdBound is the longest anything a response says may delay a key.
	holdBound() time.Duration
}

// heeding says what a response may steer besides holds: the upstream's
// counters (Transport.IgnoreCounters) and refusals.
type heeding struct {
	counters, refusals bool
}

var (
	_ heeder = (*Redis)(nil)
	_ heeder = (*Local)(nil)
)

func (r *Redis) holdBound() time.Duration   { return r.config.holdBound() }
func (loc *Local) holdBound() time.Duration { return loc.config.holdBound() }

// heed implements heeder: the holds first, since a hold takes the key's
// next reading afresh, then the counters (see Sync), then, for a request
// Redis booked, a refusal that neither explains to the key's rate, or a
// success it listens for (see refusals.go).
func (r *Redis) heed(ctx context.Context, key string, t ticket, w word, o heeding) {
	for _, h := range w.holds {
		r.Hold(ctx, key, h)
	}
	if o.counters && len(w.readings) > 0 {
		r.sync(ctx, key, t.booking, w.readings, w.refused, w.at)
	}
	served := !w.refused && t.listening
	if !o.refusals || !t.booking.granted || (!served && (!w.refused || w.explained(r.namedLimits))) {
		return
	}
	if down, _ := r.failover.down(); down {
		return // the outage's pacing has no rate of the key's
	}
	began := r.now()
	if served && !r.retimes.news(key, t.booking.now, began) {
		return
	}
	share, _, err := r.store.refused(ctx, key, t.booking, served, r.holdChannel())
	switch {
	case isOutage(err):
		r.failed(ctx, key, 0, failedCall{began: began, failures: 1, err: err})
	case share > 0:
		reportRate(ctx, r.config.observer, "redis", key, share, w.status)
	}
}

// heed implements heeder: the holds, then a refusal that neither explains
// to the key's rate, or a success it listens for (see refusals.go). Local
// is not steered by counters.
func (loc *Local) heed(ctx context.Context, key string, t ticket, w word, o heeding) {
	for _, h := range w.holds {
		loc.Hold(ctx, key, h)
	}
	served := !w.refused && t.listening
	if !o.refusals || t.local != loc || (!served && (!w.refused || w.explained(loc.namedLimits))) {
		return
	}
	now := loc.now()
	shard := loc.shard(key)
	shard.mu.Lock()
	k := shard.limiter(loc, key, now)
	if served {
		k.rate.served(t.start.UnixMicro())
		shard.mu.Unlock()
		return
	}
	cut, share := k.rate.refused(now.UnixMicro(), t.start.UnixMicro()), k.rate.bottom
	shard.mu.Unlock()
	if cut {
		loc.retimes.add(key, now.UnixMicro(), true, now) // its sleepers book anew
		reportRate(ctx, loc.config.observer, "local", key, share, w.status)
	}
}
