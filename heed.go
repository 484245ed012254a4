package pace

import (
	"context"
	"net/http"
	"time"
)

// A Heeder is a Limiter that takes the upstream's word for its keys, one
// response at a time: Local and Redis are. A Transport waits on it with
// WaitGrant and hands it each response with Heed; a decorator that forwards
// both (and Reserve, Settle, Hold and TakeSlot, as its limiter has them)
// is heeded as the limiter it wraps.
type Heeder interface {
	Limiter
	// WaitGrant waits as Wait does, and returns what it granted.
	WaitGrant(ctx context.Context, key string, cost int) (Grant, error)
	// Heed applies what resp, the response to the request granted as g,
	// which arrived at arrival, says of key, as far as h allows: its holds
	// (ParseHold), its counters (ParseReadings), a refusal without a word.
	// It runs past ctx's end; failures reach the limiter's observer.
	Heed(ctx context.Context, key string, g Grant, resp *http.Response, arrival time.Time, h Heeding)
}

// A Grant is what a Heeder granted one wait (WaitGrant), or one
// reservation (Reservation.Grant): the booking that a response to its
// request steers. The zero Grant is a wait no limiter booked.
type Grant struct{ t ticket }

// Heeding says what a response may steer besides its holds.
type Heeding struct {
	// Counters: the upstream's counters steer the key on a Redis (see
	// Transport.IgnoreCounters).
	Counters bool
	// Refusals: a refusal that neither a Retry-After nor the counters
	// explain cuts the key's rate (see Transport.IgnoreRefusals).
	Refusals bool
}

var (
	_ Heeder = (*Redis)(nil)
	_ Heeder = (*Local)(nil)
)

// Heed implements Heeder.
func (r *Redis) Heed(ctx context.Context, key string, g Grant, resp *http.Response, arrival time.Time, h Heeding) {
	r.heed(context.WithoutCancel(ctx), key, g.t, hear(resp, arrival, r.config.holdBound()), h)
}

// Heed implements Heeder.
func (loc *Local) Heed(ctx context.Context, key string, g Grant, resp *http.Response, arrival time.Time, h Heeding) {
	loc.heed(context.WithoutCancel(ctx), key, g.t, hear(resp, arrival, loc.config.holdBound()), h)
}

// heed applies w: the holds first, since a hold takes the key's
// next reading afresh, then the counters (see Sync), then, for a request
// Redis booked, a refusal that neither explains to the key's rate, or a
// success it listens for (see refusals.go).
func (r *Redis) heed(ctx context.Context, key string, t ticket, w word, o Heeding) {
	for _, h := range w.holds {
		r.Hold(ctx, key, h)
	}
	if o.Counters && len(w.readings) > 0 {
		r.sync(ctx, key, t.booking, w.readings, w.refused, w.at)
	}
	served := !w.refused && t.listening
	if !o.Refusals || !t.booking.Granted || (!served && (!w.refused || w.explained(r.namedLimits))) {
		return
	}
	var share int64
	r.shared(ctx, key, false, func() (err error) { // away, the outage's pacing has no rate of the key's
		if served && !r.retimes.news(key, t.booking.Now, r.now()) {
			return nil
		}
		share, _, err = r.store.Refused(ctx, key, t.booking, served, r.holdChannel())
		return err
	})
	if share > 0 {
		reportRate(ctx, r.config.observer, "redis", key, share, w.status)
	}
}

// heed applies w: the holds, then a refusal that neither explains
// to the key's rate, or a success it listens for (see refusals.go). Local
// is not steered by counters.
func (loc *Local) heed(ctx context.Context, key string, t ticket, w word, o Heeding) {
	for _, h := range w.holds {
		loc.Hold(ctx, key, h)
	}
	served := !w.refused && t.listening
	if !o.Refusals || t.local != loc || (!served && (!w.refused || w.explained(loc.namedLimits))) {
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
