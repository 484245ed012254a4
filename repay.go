package pace

import (
	"context"

	"github.com/fleetpace/pace/internal/store"
)

// What a process granted alone during an outage, booked on the shared keys
// once it is back on Redis: the others may have spent the whole limit in
// Redis meanwhile, and an hourly or daily quota would otherwise lose its
// bound over its period by this process's share.

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
