package pace

import (
	"context"
	"sync"

	"github.com/fleetpace/pace/internal/store"
)

// What a process granted alone during an outage, booked on the shared keys
// once it is back on Redis: the others may have spent the whole limit in
// Redis meanwhile, and an hourly or daily quota would otherwise lose its
// bound over its period by this process's share.

// maxDebtKeys bounds the keys an outage's debts are kept for: the busiest
// a crawler meets in an outage of a few minutes; the debts of keys met
// after them are not kept.
const maxDebtKeys = 10000

// outageDebts are the costs an outage's local limiter granted, per key, less the
// credits of their settlements. They are kept from an outage's start to the
// end of its return to Redis (and of every outage that begins meanwhile);
// the grants of the return were booked in Redis too.
type outageDebts struct {
	mu      sync.Mutex
	owed    map[string]store.LimitCosts
	keeping bool // an outage is under way, or being returned from
}

// owe adds costs (fewer, for a settlement's credit) to what key owes,
// while an outage is under way or being returned from.
func (d *outageDebts) owe(key string, costs, less store.LimitCosts) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.keeping {
		return
	}
	if d.owed == nil {
		d.owed = make(map[string]store.LimitCosts)
	}
	c, ok := d.owed[key]
	if !ok && len(d.owed) >= maxDebtKeys {
		return
	}
	for i := range c {
		c[i] += costs[i] - less[i]
	}
	d.owed[key] = c
}

// open begins keeping debts: an outage began.
func (d *outageDebts) open() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.keeping = true
}

// close stops keeping debts and returns those kept: the process is back
// on Redis.
func (d *outageDebts) close() map[string]store.LimitCosts {
	d.mu.Lock()
	defer d.mu.Unlock()
	owed := d.owed
	d.owed, d.keeping = nil, false
	return owed
}

// repay books each key's debt on Redis (see repay.lua), one call a key,
// and tells the observer what each key took. A call that fails ends the
// repayment: Redis is away again, and the next outage's debts are its own.
func (r *Redis) repay(ctx context.Context, owed map[string]store.LimitCosts) {
	for key, costs := range owed {
		took, err := r.store.Repay(ctx, key, costs)
		r.config.observer.emit(ctx, Event{Kind: EventRepay, Limiter: "redis", Key: key, Cost: took[0], Err: err})
		if store.IsOutage(err) {
			return
		}
	}
}
