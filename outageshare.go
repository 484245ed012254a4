package pace

import (
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// While Redis is away, the limiters of one process that pace one key share
// the process's share of its limit: one outage limiter per fleet and quota
// in the process, however many limiters book it (before, each limiter paced
// at the share, and three limiters of a process granted three shares during
// a failover). Limiters of the same quota on different Redis servers (or
// prefixes, or fleets) do not.

// outageShares are the outage limiters in use in a process, by fleet and
// quota (Redis.shareKey).
type outageShares struct {
	sync.Mutex
	by map[string]*outageShare
}

type outageShare struct {
	local *Local
	users int
}

// shareKey names the fleet and quota of a limiter on client among this
// process's outage limiters: by the Redis the client reaches, when it says,
// the prefix, the fleet's name, and the limits.
func shareKey(client redis.Scripter, prefix, fleetName string, limits []Limit) string {
	var where any = fmt.Sprintf("%p", client)
	switch c := client.(type) {
	case *redis.Client: // a Sentinel failover client's Addr names no server: one per process
		where = c.Options().Network + " " + c.Options().Addr + " " + strconv.Itoa(c.Options().DB)
	case *redis.ClusterClient:
		where = c.Options().Addrs
	}
	stored := storeLimits(limits, time.Now)
	for i := range stored {
		stored[i].Windows = nil // a func prints as its address; the limit's key names its calendar
	}
	return fmt.Sprintf("%v %q %q %v", where, prefix, fleetName, stored)
}

// outageLimiter returns the local limiter for an outage of r that begins at
// since: the one this process's other limiters of r's fleet and quota use,
// if one is in an outage, with floors added; else a new one, under each
// limit this process's share of it (Limit.outageShare: a fixed or calendar
// window its share of the count, from the outage on; a sliding window taken
// as a bucket that never allows more), each key's buckets empty at since, or at its time in floors
// (the end of what Redis had booked of the key, or of its hold) if that is
// later, since Redis may have granted the whole burst and booked callers who
// still wait.
func (r *Redis) outageLimiter(since time.Time, floors map[string]time.Time) *Local {
	inUse := &r.config.process.outages
	inUse.Lock()
	defer inUse.Unlock()
	if s := inUse.by[r.shareKey]; s != nil {
		s.users++
		s.local.addFloors(floors)
		return s.local
	}
	var shares []Limit
	for _, l := range r.limits {
		shares = append(shares, l.outageShare(r.fleet.Size()))
	}
	named := newNamedLimits(shares)
	named.names = r.names // the quota's: the shares' texts differ
	loc := newLocal(named, r.config.commonConfig, r.now)
	loc.emptyAt = since
	loc.floors.Store(&floors)
	inUse.by[r.shareKey] = &outageShare{local: loc, users: 1}
	return loc
}

// releaseOutage lets go of loc, an outage limiter of r's: the last of its
// users forgets it.
func (r *Redis) releaseOutage(loc *Local) {
	inUse := &r.config.process.outages
	inUse.Lock()
	defer inUse.Unlock()
	if s := inUse.by[r.shareKey]; s != nil && s.local == loc {
		if s.users--; s.users == 0 {
			delete(inUse.by, r.shareKey)
		}
	}
}

// addFloors adds floors to loc's, the later time of each key: a limiter
// that joins loc's outage had booked them in Redis.
func (loc *Local) addFloors(floors map[string]time.Time) {
	if len(floors) == 0 {
		return
	}
	merged := maps.Clone(*loc.floors.Load())
	if merged == nil {
		merged = make(map[string]time.Time, len(floors))
	}
	for key, t := range floors {
		merged[key] = latest(merged[key], t)
	}
	loc.floors.Store(&merged)
}
