package outage

import (
	"sync"

	"github.com/fleetpace/pace/internal/store"
)

// MaxDebtKeys bounds the keys an outage's debts are kept for: the busiest
// a crawler meets in an outage of a few minutes; the debts of keys met
// after them are not kept.
const MaxDebtKeys = 10000

// debts are the costs an outage's local limiter granted, per key, less the
// credits of their settlements. They are kept from an outage's start to the
// end of its return to Redis (and of every outage that begins meanwhile);
// the grants of the return were booked in Redis too.
type debts struct {
	mu      sync.Mutex
	owed    map[string]store.LimitCosts
	keeping bool // an outage is under way, or being returned from
}

// owe adds costs (fewer, for a settlement's credit) to what key owes,
// while an outage is under way or being returned from.
func (d *debts) owe(key string, costs, less store.LimitCosts) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.keeping {
		return
	}
	if d.owed == nil {
		d.owed = make(map[string]store.LimitCosts)
	}
	c, ok := d.owed[key]
	if !ok && len(d.owed) >= MaxDebtKeys {
		return
	}
	for i := range c {
		c[i] += costs[i] - less[i]
	}
	d.owed[key] = c
}

// open begins keeping debts: an outage began.
func (d *debts) open() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.keeping = true
}

// close stops keeping debts and returns those kept: the process is back
// on Redis.
func (d *debts) close() map[string]store.LimitCosts {
	d.mu.Lock()
	defer d.mu.Unlock()
	owed := d.owed
	d.owed, d.keeping = nil, false
	return owed
}
