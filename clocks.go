package pace

import (
	"sync"
	"time"

	"github.com/fleetpace/pace/headers"
	"github.com/fleetpace/pace/internal/expiring"
)

// upstreamClocks keeps each key's upstream clock (see headers.Clock),
// forgotten when no response of the key came for clockMemory.
type upstreamClocks struct {
	mu     sync.Mutex
	clocks expiring.Map[*headers.Clock]
}

// clockMemory is how long a key's upstream clock is kept after its last
// response.
const clockMemory = 10 * time.Minute

// of returns key's upstream clock, at now.
func (u *upstreamClocks) of(key string, now time.Time) *headers.Clock {
	u.mu.Lock()
	defer u.mu.Unlock()
	c, _ := u.clocks.Get(key)
	if c == nil {
		c = new(headers.Clock)
	}
	u.clocks.Put(key, c, now.Add(clockMemory), now)
	return c
}
