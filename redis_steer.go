package pace

import (
	"cmp"
	"context"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/steer"
	"github.com/fleetpace/pace/internal/store"
)

// steering is what one reading tells one limit of the quota.
type steering struct {
	store.Steer
	header  string // the header or field the reading came from
	bounded bool   // the limit's bounds changed the interval advertised
}

// Sync steers the key of res, whose response said what readings say, for
// the whole fleet: a Transport on a Redis reads every response's counters
// (headers.ParseReadings) and syncs the request's key with them by itself; a caller
// with a client of its own reserves each request and syncs it. refused says the upstream refused the request (a
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
//   - for a quota that refills (headers.Reading.Refills, a token bucket upstream),
//     the bucket's level becomes what is left for the fleet, with what the
//     quota refilled since the request went; one that says so but counts
//     down as a window does, two readings in a row, is read as a window
//     (as a level alone where no reading said more than a second);
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
// process syncs one key at most every 50 ms (steer.SyncEvery); readings in between are
// dropped. The observer hears each reading applied (EventReading), ignored
// as stale (EventStaleReading), and each limit learned (EventLearned), with
// the header that said so.
//
// The steering assumes the limit's burst is the upstream's (for a quota
// that refills) and keeps the steered bucket for at least a minute after
// its last reading.
func (r *Redis) Sync(ctx context.Context, res *Reservation, readings []headers.Reading, refused bool) error {
	if res == nil || res.limiter != r {
		return &requestError{"pace: Sync: a reservation this limiter did not make"}
	}
	now := r.now()
	return r.sync(ctx, res.key, res.booked.redis, r.windows.Read(res.key, readings, now), refused, now)
}

// sync steers key by the readings of the response to the request booked as
// b, which arrived at arrival; refused, the request was refused (a 429).
// Readings of a refusal are never dropped: they account for units not
// spent. Readings this process can tell are stale are dropped unasked.
func (r *Redis) sync(ctx context.Context, key string, b store.Booking, readings []headers.Reading, refused bool, arrival time.Time) error {
	if !b.Granted {
		return nil // booked without Redis
	}
	now := r.now()
	return r.shared(ctx, key, false, func() error {
		steers := r.steerings(ctx, key, readings, now.Sub(arrival))
		plain := plainSteers(steers)
		if len(steers) == 0 || !r.syncs.Due(key, b, plain, refused, now) {
			return nil // nothing to steer
		}
		reply, err := r.store.Sync(ctx, key, b, plain, refused, r.holdChannel())
		if err != nil {
			return err
		}
		r.syncs.Note(key, plain, reply, now)
		r.reportSteers(ctx, key, steers, reply)
		return nil
	}, nil)
}

// reportSteers tells the observer what each of steers did to key, as the
// sync's reply says.
func (r *Redis) reportSteers(ctx context.Context, key string, steers []steering, reply store.SyncReply) {
	for i, st := range steers {
		kinds := [...][]EventKind{{EventStaleReading}, {EventReading}, {EventReading, EventLearned}}[min(reply.Results[i], 2)]
		for _, kind := range kinds {
			e := Event{Kind: kind, Limiter: redisLimiter, Key: key, Cost: int(st.Remaining), Delay: st.Reset, Reason: st.header}
			if kind == EventLearned && st.bounded {
				e.Reason += " (kept within " + r.limits[st.Limit].learnText()[len(" learn"):] + ")"
			}
			r.config.observer.emit(ctx, e)
		}
	}
}

// steerings returns what readings tell the limits of key they steer,
// elapsed after the response arrived. A reading that resets, or (for a
// limit that learns) whose window ends, beyond the limiter's MaxHold is
// the response's foreign data, which the observer hears ignored.
func (r *Redis) steerings(ctx context.Context, key string, readings []headers.Reading, elapsed time.Duration) []steering {
	bound := r.config.maxHold
	var steers []steering
	for _, reading := range readings {
		i := r.limitOf(reading.Name, reading.OwnQuota, len(readings) == 1)
		if i < 0 || r.limits[i].kind != bucket || reading.Reset <= elapsed {
			continue
		}
		l := r.limits[i]
		learns, window := l.learn.on && reading.Limit > 0, cmp.Or(reading.Window, l.period)
		if reading.Reset > bound || (learns && window > bound) {
			r.config.observer.emit(ctx, Event{Kind: EventIgnored, Limiter: redisLimiter, Key: key, Delay: max(reading.Reset, window), Reason: reading.Header})
			continue
		}
		st := steering{Steer: store.Steer{Limit: i, Remaining: reading.Remaining, Reset: reading.Reset - elapsed, Refills: refills(reading, l), Rounded: reading.Rounded(), Early: reading.Early, Size: reading.Limit}, header: reading.Header}
		if learns {
			st.Learned, st.bounded = l.learned(reading.Limit, window, bound)
		}
		steers = append(steers, st)
	}
	return steers
}

// refills reports whether reading is of a quota that refills: it says so,
// or it is a bucket's level alone (see bucketLevel). A window's last second
// cannot be told from a bucket's level otherwise, and the refills since
// its request go only to a bucket's.
func refills(reading headers.Reading, l Limit) bool {
	return reading.Refills || bucketLevel(reading, l)
}

// bucketLevel reports whether reading, of l, is a level alone (Rounded)
// whose limit is no more than l's burst and less than a second of l's
// rate: a token bucket's size and its time until full, as API gateways
// state theirs (a window of a second states its count, a second of the
// rate or more). Said in a Unix time, rounded up to the upstream's next
// second, the reset of such a bucket, empty, may be nearly two seconds
// away when it is full again in less than one: it holds nothing (a strict
// bucket of 50/s burst 20 in GitHub's fields, in the simulator, held until
// then: 73.6% served; 97.3% now).
func bucketLevel(reading headers.Reading, l Limit) bool {
	size := float64(reading.Limit)
	return reading.Rounded() && size > 0 && size <= float64(l.burst) && size*float64(l.period) < l.count*float64(time.Second)
}

// plainSteers are what steers tell the store.
func plainSteers(steers []steering) []store.Steer {
	plain := make([]store.Steer, len(steers))
	for i, st := range steers {
		plain[i] = st.Steer
	}
	return plain
}

// longestHold implements backend.
func (r *Redis) longestHold() time.Duration { return r.config.maxHold }

// heed implements backend: it applies w, what the response to the request
// granted as g said, past ctx's end: the holds first, since a hold takes
// the key's next reading afresh, then the counters (see Sync), then, for a
// request Redis booked, a refusal that neither explains to the key's rate,
// or a success it listens for (see internal/steer). A dry run heeds
// nothing.
func (r *Redis) heed(ctx context.Context, key string, g grant, w headers.Word, o heedScope) {
	if r.config.dryRun {
		return // see WithDryRun
	}
	ctx, t := context.WithoutCancel(ctx), g.booking
	if t.leased && (w.Refused || len(w.Holds) > 0 || len(w.Readings) > 0) {
		r.voidLeases(key) // the key books in Redis, where each loop steers it
	}
	counters := o.counters && len(w.Readings) > 0
	if counters {
		w.Readings = r.windows.Read(key, w.Readings, w.At) // as the quotas they are about are
		r.boundResets(key, &w)
	}
	before := heldBefore(w, func(h headers.Hold) (int64, error) { return r.hold(ctx, key, h) })
	if counters {
		r.sync(ctx, key, t.redis, w.Readings, w.Refused, w.At)
	}
	if o.refusals {
		r.heedRate(ctx, key, t, w, before)
	}
}

// boundResets bounds the resets of w's readings of key's buckets said in
// whole seconds by the bucket's period (see steer.Phases), and shortens the
// holds they asked for alike. A reading of a bucket's size (its burst, or
// nginx's burst and one) keeps its reset, a bucket's time until full and
// no window's, unless the phases tell a level alone: the reset moved later
// while the units were spent and none came back, as no window's does (a
// strict bucket of 10/s burst 16 in GitHub's fields held the fleet until
// it was full each time it ran out: 69.6% served in 4 s, 96.4% now).
func (r *Redis) boundResets(key string, w *headers.Word) {
	bound := func(reading headers.Reading) headers.Reading {
		i := r.limitOf(reading.Name, reading.OwnQuota, len(w.Readings) == 1)
		if i < 0 || r.limits[i].kind != bucket {
			return reading
		}
		b := r.phases.Bound(key, reading, w.At, r.limits[i].period, r.limits[i].count)
		if reading.Limit <= int64(r.limits[i].burst)+1 && b.Early != b.Reset {
			return reading // a bucket's size, and not a level alone
		}
		return b
	}
	for i, reading := range w.Readings {
		w.Readings[i] = bound(reading)
	}
	holds := w.Holds[:0]
	for _, h := range w.Holds {
		if h.Reading != nil {
			b := bound(*h.Reading)
			if b.Reset <= b.Early {
				continue // it may be now, as of a reading that holds nothing (see headers.Hear)
			}
			h.For, h.Reading = min(h.For, b.Reset), &b
		}
		holds = append(holds, h)
	}
	w.Holds = holds
}

// heedRate tells key's rate what became of the request booked as t, as w
// says: refused without counters that explain it (after w's holds, the one
// before them ending at before), or served while the rate listens for a
// success.
func (r *Redis) heedRate(ctx context.Context, key string, t booking, w headers.Word, before int64) {
	served := !w.Refused && t.listening
	booked := t.redis.Granted || t.leased // a leased token was booked with its lease, at t.redis.Now
	if !booked || (!served && (!w.Refused || r.namedLimits.explains(w))) {
		return
	}
	r.shared(ctx, key, false, func() error { // away, the outage's pacing has no rate of the key's
		if served && !r.retimes.News(key, t.redis.Now, r.now()) {
			return nil
		}
		fraction, _, err := r.store.Refused(ctx, key, t.redis, served, before, r.holdChannel())
		if fraction > 0 {
			reportRate(ctx, r.config.observer, redisLimiter, key, fraction, w.Status)
		}
		return err
	}, nil)
}

// sleepUnlessRetimed sleeps for delay, unless ctx ends first, or key is
// retimed meanwhile, after a booking decided at booked (on the clock of
// the retimes, in microseconds): then it returns steer.ErrRetimed, or
// steer.ErrRecut for a cut of the key's rate.
func sleepUnlessRetimed(ctx context.Context, rt *steer.Retimes, key string, delay time.Duration, booked int64) error {
	if delay <= 0 {
		return nil // inlined: a grant at once costs no call
	}
	return sleepRetimed(ctx, rt, key, delay, booked)
}

// sleepRetimed is sleepUnlessRetimed's wait, for a delay above zero.
func sleepRetimed(ctx context.Context, rt *steer.Retimes, key string, delay time.Duration, booked int64) error {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		wake := rt.Wake()
		if err := rt.After(key, booked, booked+delay.Microseconds()); err != nil {
			return err
		}
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return waitEnded(ctx, key, delay)
		case <-wake:
		}
	}
}
